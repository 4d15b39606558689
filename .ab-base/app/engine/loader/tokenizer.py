"""Text <-> token ids for every checkpoint we load, on the `tokenizers` library.

Three sources give the same `Tokenizer`:
- a GGUF `llama` vocabulary (SentencePiece as llama.cpp stores it: pieces with `▁` for spaces,
  scores, token types, `<0xXX>` byte-fallback pieces, and no merges: they are rebuilt here);
- a GGUF `gpt2` vocabulary (byte-level BPE with merges; the text is split first by the regexes
  llama.cpp picks from `tokenizer.ggml.pre`);
- a Hugging Face folder (`tokenizer.json`, plus `tokenizer_config.json` and
  `generation_config.json` for BOS/EOS and the end-of-generation ids).

BOS/EOS are added here, not by the library's post-processor, so that "add BOS" means exactly
what the metadata says. `IncrementalDetokenizer` turns generated ids into text token by token
from a per-id byte table: it never re-decodes the output so far, and never emits half a
UTF-8 character.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from app.engine.loader import tokenizer_files as files

log = logging.getLogger(__name__)

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPACE_MARK = "\u2581"  # SentencePiece's visible space
_UNKNOWN = object()

# Tokens that end a turn although the file may not name them as EOS (llama.cpp's list).
END_OF_GENERATION_NAMES = frozenset({
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
})  # fmt: skip

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (GPT-4o, GPT-OSS, Llama 4): as gpt-oss's tokenizer.json writes it. Words split where case
# changes ("HelloWorld" -> "Hello", "World") and take their contraction along. llama.cpp runs an
# ASCII rewrite of it (its std::regex has no \p{Lu}), which differs on non-ASCII capitals; the
# model was trained on this one.
_O200K_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek LLM's "letters": code point ranges (written as numbers because several of them, such
# as U+1F7D and U+212A, are Unicode singletons that text tools silently normalize away).
_DEEPSEEK_LLM_LETTER_RANGES = (
    "41-5A 61-7A B5 C0-D6 D8-F6 F8-1BA 1BC-1BF 1C4-293 295-2AF 370-373 376-377 37B-37D 37F 386 388-38A 38C "
    "38E-3A1 3A3-3F5 3F7-481 48A-52F 531-556 10A0-10C5 13A0-13F5 13F8-13FD 1C90-1CBA 1CBD-1CBF 1D00-1D2B "
    "1D6B-1D77 1D79-1D9A 1E00-1F15 1F18-1F1D 1F20-1F45 1F48-1F4D 1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 "
    "1FB6-1FBC 1FBE 1FC2-1FC4 1FC6-1FCC 1FD0-1FD3 1FD6-1FDB 1FE0-1FEC 1FF2-1FF4 1FF6-1FFC 2102 2107 210A-2113 "
    "2115 2119-211D 2124 2126 2128 212A-212D 212F-2134 2139 213C-213F 2145-2149 214E 2183-2184 2C00-2C7B "
    "2C7E-2CE4 2CEB-2CEE 2CF2-2CF3 A640-A66D A680-A69B A722-A76F A771-A787 A78B-A78E AB70-ABBF FB00-FB06 "
    "FB13-FB17 FF21-FF3A FF41-FF5A 10400-1044F 104B0-104D3 104D8-104FB 10C80-10CB2 10CC0-10CF2 118A0-118DF "
    "1E900-1E943"
)


def code_point_class(ranges: str) -> str:
    """A regex character class body from "41-5A B5 ..." (hex code points and ranges)."""
    parts = []
    for item in ranges.split():
        first, _, last = item.partition("-")
        parts.append("-".join(re.escape(chr(int(c, 16))) for c in (first, last or first)))
    return "".join(parts)


_DEEPSEEK_LLM_LETTERS = code_point_class(_DEEPSEEK_LLM_LETTER_RANGES)

# `tokenizer.ggml.pre` -> the regexes that split text before byte-level BPE, applied in turn
# (each one splits the pieces the previous made), as llama.cpp's llm_tokenizer_bpe does.
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (
        r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]",
    ),
    "gpt-2": (_GPT2_SPLIT,), "phi-2": (_GPT2_SPLIT,), "mpt": (_GPT2_SPLIT,), "olmo": (_GPT2_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,), "llama-v3": (_LLAMA3_SPLIT,), "llama-bpe": (_LLAMA3_SPLIT,),
    "falcon3": (_LLAMA3_SPLIT,), "dbrx": (_LLAMA3_SPLIT,), "smaug-bpe": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,), "deepseek-r1-qwen": (_QWEN2_SPLIT,), "stablelm2": (_QWEN2_SPLIT,),
    "megrez": (_QWEN2_SPLIT,),
    "gpt-4o": (_O200K_SPLIT,), "llama4": (_O200K_SPLIT,),
    "deepseek-llm": (
        r"[\r\n]", rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+", r"\p{N}+",
    ),
    "starcoder": (r"\p{N}", _GPT2_SPLIT), "smollm": (r"\p{N}", _GPT2_SPLIT),
}  # fmt: skip

# Pre-tokenizers whose vocabularies take a whole pre-token that is itself a token without merging.
IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3"})
ADDS_BOS_BY_DEFAULT = IGNORE_MERGES  # llama.cpp adds BOS for the llama3 family when the file is silent


class Tokenizer:
    """Encode and decode for one checkpoint; build it with `from_gguf_metadata` or `from_pretrained_dir`."""

    def __init__(
        self,
        backend: Backend,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        pad_token_id: int | None = None,
        add_bos: bool,
        add_eos: bool,
        extra_eos_ids: Iterable[int] = (),
        special_ids: Iterable[int] = (),
        piece_bytes: Callable[[int], bytes] | None = None,
        strips_prefix_space: bool = False,
        chat_template: str | None = None,
        max_token_chars: int | None = None,
    ) -> None:
        self._backend = backend
        self._lock = threading.Lock()  # `encode_special_tokens` is state on the shared backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        for name, value in (("bos", bos_token_id), ("eos", eos_token_id), ("pad", pad_token_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{name} token id {value} is outside the vocabulary (size {self.vocab_size})"
                )
        if add_bos and bos_token_id is None:
            raise ValueError("the tokenizer should add BOS but names no BOS token")
        if add_eos and eos_token_id is None:
            raise ValueError("the tokenizer should add EOS but names no EOS token")
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self.bos_token = backend.id_to_token(bos_token_id) if bos_token_id is not None else None
        self.eos_token = backend.id_to_token(eos_token_id) if eos_token_id is not None else None
        named_eog = (backend.token_to_id(name) for name in END_OF_GENERATION_NAMES)
        eog = {*extra_eos_ids, *(i for i in named_eog if i is not None)}
        if eos_token_id is not None:
            eog.add(eos_token_id)
        self.eos_token_ids = frozenset(eog)
        self._special_ids = frozenset(special_ids)
        self._piece_bytes = piece_bytes
        self.strips_prefix_space = strips_prefix_space
        self.chat_template = chat_template  # the checkpoint's own, if its tokenizer files carry one
        self._marker_texts: dict[int, str | None] = {}  # marker_text's answers, found on first use
        # the most characters one token's piece spells, where the source knew it at once (GGUF: its token
        # list); server/prompting.py scans the vocabulary otherwise
        self.max_token_chars = max_token_chars

    # -- encode / decode ---------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; BOS/EOS added as the checkpoint says when `add_special_tokens`.

        With `parse_special`, special tokens written in the text (`<start_of_turn>`) become their
        ids; without it they are tokenized as plain text.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        with self._lock:
            self._backend.encode_special_tokens = not parse_special
            try:
                ids = self._backend.encode(text, add_special_tokens=False).ids
            finally:
                self._backend.encode_special_tokens = False
        if add_special_tokens:
            if self.add_bos:
                ids.insert(0, self.bos_token_id)  # type: ignore[arg-type]
            if self.add_eos:
                ids.append(self.eos_token_id)  # type: ignore[arg-type]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(self._checked_ids(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, id: int) -> str:
        token = self._backend.id_to_token(id) if 0 <= id < self.vocab_size else None
        if token is None:
            raise ValueError(f"token id {id} is outside the vocabulary (size {self.vocab_size})")
        return token

    def is_special(self, id: int) -> bool:
        return id in self._special_ids

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def marker_text(self, id: int) -> str | None:
        """The text of special token `id` if it cuts a text wherever the text spells it, whatever
        surrounds it; else None.

        The tokenizer splits a text at its added tokens first and tokenizes the pieces between them
        each on its own, so a text's ids up to such a token are those of the text before it alone
        (server/prompt_prefix.py splices prompts there). Not markers: tokens matched on normalized text
        or only as a whole word (the match depends on what surrounds them), and any whose text holds,
        or is held by, another added token's (a longer match could start before it or run past it)."""
        found = self._marker_texts.get(id, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._marker_texts[id] = self._find_marker_text(id)
        return found  # type: ignore[return-value]

    def _find_marker_text(self, id: int) -> str | None:
        added = self._added_tokens
        token = added.get(id)
        if id not in self._special_ids or token is None:
            return None
        text = token.content
        if token.normalized or token.single_word or not text:
            return None
        clash = any(o.content != text and (text in o.content or o.content in text) for o in added.values())
        return None if clash else text

    @cached_property
    def _added_tokens(self) -> dict[int, AddedToken]:
        return self._backend.get_added_tokens_decoder()

    def token_bytes(self, id: int) -> bytes:
        """The bytes token `id` stands for in generated text (its piece; a special token's name)."""
        if self._piece_bytes is None:
            raise ValueError("this tokenizer has no per-token bytes (not SentencePiece or byte-level)")
        return self._piece_bytes(id)

    def detokenizer(
        self, skip_special_tokens: bool = True, *, at_start: bool = False
    ) -> IncrementalDetokenizer:
        """A fresh streaming decoder for one output.

        `at_start`: the ids begin the text (nothing is before them), so a SentencePiece prefix
        space is dropped as `decode()` drops it. Generated tokens continue a prompt: leave it False.
        """
        if self._piece_bytes is None:
            raise ValueError(
                "this tokenizer's decoder cannot be run incrementally (not SentencePiece or byte-level)"
            )
        skipped = self._special_ids if skip_special_tokens else frozenset()
        return IncrementalDetokenizer(
            self._piece_bytes, skipped, self.vocab_size, at_start and self.strips_prefix_space
        )

    def _checked_ids(self, ids: Sequence[int]) -> list[int]:
        checked = [int(i) for i in ids]
        bad = next((i for i in checked if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (size {self.vocab_size})")
        return checked

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """From a GGUF file's metadata as plain Python values (`tokenizer.ggml.*` keys).

        Built once per process for the same vocabulary: building Gemma's takes 2.6-4.6 s on a
        2-core machine (its merges derived piece by piece, then the BPE model made from them),
        which every reload of the model (a changed setting, a switch back to it) would pay again. A Tokenizer is safe to
        share: it holds no per-use state, and `encode` takes its lock."""
        key = _tokenizer_key(metadata)
        built = _BUILT.get(key)
        if built is None:
            built = cls._from_gguf_metadata(metadata)
            while len(_BUILT) >= _BUILT_LIMIT:
                _BUILT.pop(next(iter(_BUILT)))
            _BUILT[key] = built
        return built

    @classmethod
    def _from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        model = _required(metadata, "tokenizer.ggml.model")
        tokens = list(_required(metadata, "tokenizer.ggml.tokens"))
        types = metadata.get("tokenizer.ggml.token_type")
        types = np.full(len(tokens), NORMAL, np.int32) if types is None else np.asarray(types, np.int32)
        if len(types) != len(tokens):
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        if model == "llama":
            backend, piece_bytes, strips = _sentencepiece_backend(metadata, tokens, types)
            default_add_bos = True
        elif model == "gpt2":
            backend, piece_bytes = _byte_level_backend(metadata, tokens, types)
            strips, default_add_bos = False, metadata.get("tokenizer.ggml.pre") in ADDS_BOS_BY_DEFAULT
        else:
            raise ValueError(f"tokenizer.ggml.model {model!r} is not supported; supported: 'llama', 'gpt2'")
        extra_eos = [
            metadata[k]
            for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if k in metadata
        ]
        return cls(
            backend,
            bos_token_id=_optional_id(metadata, "tokenizer.ggml.bos_token_id"),
            eos_token_id=_optional_id(metadata, "tokenizer.ggml.eos_token_id"),
            pad_token_id=_optional_id(metadata, "tokenizer.ggml.padding_token_id"),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos)),
            add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
            extra_eos_ids=[int(i) for i in extra_eos],
            special_ids=np.flatnonzero((types == CONTROL) | (types == UNKNOWN)).tolist(),
            piece_bytes=piece_bytes,
            strips_prefix_space=strips,
            chat_template=metadata.get("tokenizer.chat_template"),
            max_token_chars=max(map(len, tokens), default=1),
        )

    @classmethod
    def from_pretrained_dir(cls, path: str | Path) -> Tokenizer:
        """From a Hugging Face folder: tokenizer.json, with tokenizer_config.json,
        generation_config.json and config.json read for BOS/EOS, added BOS and EOG ids."""
        folder = Path(path)
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json")
        backend = files.open_backend(file)
        config_file = folder / "tokenizer_config.json"
        config = files.read_json_object(config_file)
        generation = files.read_json_object(folder / "generation_config.json")
        model_config = files.read_json_object(folder / "config.json")
        vocab_size = backend.get_vocab_size(with_added_tokens=True)

        def config_token_id(name: str) -> int | None:
            token = files.special_token(config, name, config_file)
            if token is not None:
                found = backend.token_to_id(token)
                if found is None and name != "pad_token":  # a missing pad token only means no padding
                    raise ValueError(f"{config_file} {name} {token!r} is not in tokenizer.json's vocabulary")
                return found
            key = f"{name}_id"
            source, value = (
                ("generation_config.json", generation[key])
                if key in generation
                else ("config.json", model_config.get(key))
            )
            value = value[0] if isinstance(value, list) and value else value
            return files.token_id(value, f"{folder / source} {key}", vocab_size)

        bos, eos, pad = (
            config_token_id("bos_token"),
            config_token_id("eos_token"),
            config_token_id("pad_token"),
        )
        prefix, suffix = _post_processor_additions(backend)
        add_bos, add_eos = (
            files.flag(config, name, config_file) for name in ("add_bos_token", "add_eos_token")
        )
        if add_bos is None:
            add_bos = bos is not None and bos in prefix
        if add_eos is None:
            add_eos = eos is not None and eos in suffix
        generation_eos = files.token_ids(
            generation.get("eos_token_id"), f"{folder / 'generation_config.json'} eos_token_id", vocab_size
        )
        added = backend.get_added_tokens_decoder()
        piece_bytes, strips = _piece_bytes_for_decoder(backend)
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=pad,
            add_bos=add_bos,
            add_eos=add_eos,
            extra_eos_ids=generation_eos,
            special_ids=[i for i, token in added.items() if token.special],
            piece_bytes=piece_bytes,
            strips_prefix_space=strips,
            chat_template=_template_from_config(folder, config),
        )


class IncrementalDetokenizer:
    """Streams text for one sequence of generated ids: O(1) work per token.

    Each id maps to its bytes once (cached on the tokenizer); the bytes go through an
    incremental UTF-8 decoder, which holds back an unfinished character until its last byte
    arrives. An invalid byte sequence becomes U+FFFD (`decode()` of SentencePiece byte pieces
    writes one per byte, this one per malformed sequence: only garbage output can differ).
    """

    def __init__(
        self, piece_bytes: Callable[[int], bytes], skipped: frozenset[int], vocab_size: int, strip_space: bool
    ) -> None:
        self._piece_bytes = piece_bytes
        self._skipped = skipped
        self._vocab_size = vocab_size
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = strip_space  # drop the SentencePiece prefix space of the first piece

    def add(self, token_ids: Sequence[int]) -> str:
        """The text these ids complete (possibly empty while a character is unfinished)."""
        pieces = []
        for token_id in token_ids:
            if not 0 <= token_id < self._vocab_size:
                raise ValueError(f"token id {token_id} is outside the vocabulary (size {self._vocab_size})")
            if token_id not in self._skipped:
                pieces.append(self._piece_bytes(token_id))
        data = b"".join(pieces)
        if self._strip_space and data:
            self._strip_space = False
            data = data.removeprefix(b" ")
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Whatever is held back at the end: an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


# -- GGUF `llama` (SentencePiece) --------------------------------------------------------


def _sentencepiece_backend(
    metadata: Mapping[str, Any], tokens: list[str], types: np.ndarray
) -> tuple[Backend, Callable[[int], bytes], bool]:
    # Whitespace-run pieces (Gemma: "  ", "   ", ...) are stored with real spaces, but the text
    # they match has its spaces turned into `▁` first: spell them that way so they can be merged.
    pieces = [SPACE_MARK * len(t) if t and not t.strip(" ") else t for t in tokens]
    vocab = _unique_vocab(pieces)
    scores = metadata.get("tokenizer.ggml.scores")
    merges = _merges_from_vocab(pieces, vocab, scores, types == USER_DEFINED)
    unk_id = _optional_id(metadata, "tokenizer.ggml.unknown_token_id")
    bpe = BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True,
              unk_token=tokens[unk_id] if unk_id is not None else None)  # fmt: skip
    backend = Backend(bpe)
    add_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    if add_prefix:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE_MARK, prepend_scheme="first", split=False
        )
    else:
        backend.normalizer = normalizers.Replace(" ", SPACE_MARK)
    steps = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if add_prefix else steps)
    _add_marked_tokens(
        backend, tokens, types, respelled=[p != t for p, t in zip(pieces, tokens, strict=True)]
    )

    byte_ids = set(np.flatnonzero(types == BYTE).tolist())

    def spm_bytes(token_id: int) -> bytes:
        piece = tokens[token_id]
        if token_id in byte_ids:
            return bytes([int(piece[3:-1], 16)])
        return piece.replace(SPACE_MARK, " ").encode()

    return backend, _cached(spm_bytes), add_prefix


def _merges_from_vocab(
    pieces: list[str], vocab: dict[str, int], scores: Any, user_defined: np.ndarray
) -> list[tuple[str, str]]:
    """The BPE merges a score-ranked SentencePiece vocabulary implies.

    Every way of cutting a piece into two pieces of the vocabulary is a merge. SentencePiece
    matches user-defined pieces whole before anything else, so theirs rank first (in file
    order; Gemma scores them -1000, which would put its space runs last). The rest rank by
    score, then file order; for one merged piece the longer left part goes first. This is the
    order Hugging Face's converter gives the Gemma vocabulary.
    """
    rank = np.zeros(len(pieces)) if scores is None else -np.asarray(scores, np.float64)
    rank = np.where(user_defined, -np.inf, rank)
    order = np.lexsort((np.arange(len(pieces)), rank)).tolist()
    known = frozenset(vocab)
    return [
        (piece[:cut], piece[cut:])
        for piece in (pieces[i] for i in order)
        for cut in range(len(piece) - 1, 0, -1)
        if piece[:cut] in known and piece[cut:] in known
    ]


# -- GGUF `gpt2` (byte-level BPE) --------------------------------------------------------


def _byte_level_backend(
    metadata: Mapping[str, Any], tokens: list[str], types: np.ndarray
) -> tuple[Backend, Callable[[int], bytes]]:
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", ())]
    if any(len(m) != 2 for m in merges):
        raise ValueError("tokenizer.ggml.merges holds an entry without a space between its two parts")
    pre = metadata.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_TOKENIZER_SPLITS:
        log.warning("pre-tokenizer %r is not known; splitting text as llama.cpp's 'default' does", pre)
        pre = "default"
    backend = Backend(BPE(vocab=_unique_vocab(tokens), merges=merges, ignore_merges=pre in IGNORE_MERGES))
    backend.pre_tokenizer = byte_level_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    _add_marked_tokens(backend, tokens, types, respelled=[False] * len(tokens))
    return backend, _cached(lambda token_id: _byte_level_bytes(tokens[token_id]))


def byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """Split by `pre`'s regexes in turn (text between matches stays a piece), then map to bytes."""
    if pre not in PRE_TOKENIZER_SPLITS:
        raise ValueError(f"unknown pre-tokenizer {pre!r}; known: {sorted(PRE_TOKENIZER_SPLITS)}")
    splits = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZER_SPLITS[pre]
    ]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def _add_marked_tokens(backend: Backend, tokens: list[str], types: np.ndarray, respelled: list[bool]) -> None:
    """Control tokens become special added tokens; user-defined ones plain added tokens, matched
    whole in the text as llama.cpp does (Gemma's "\\n\\n", "<table>")."""
    special = np.flatnonzero((types == CONTROL) | (types == UNKNOWN)).tolist()
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    user = [i for i in np.flatnonzero(types == USER_DEFINED).tolist() if not respelled[i]]
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])


# -- shared helpers -----------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (how byte-level BPE vocabularies spell bytes)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_OF_CHAR = {char: byte for byte, char in bytes_to_unicode().items()}


def _byte_level_bytes(token: str) -> bytes:
    # Added tokens such as "<|im_end|>" spelled outside the byte alphabet stand for their own UTF-8.
    try:
        return bytes(_BYTE_OF_CHAR[c] for c in token)
    except KeyError:
        return token.encode()


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _piece_bytes_for_decoder(backend: Backend) -> tuple[Callable[[int], bytes] | None, bool]:
    """Per-id bytes for a tokenizer.json, read off its decoder: (table, strips a prefix space)."""
    state = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else {}
    steps = state.get("decoders", [state]) if state.get("type") == "Sequence" else [state]
    kinds = {step.get("type") for step in steps}
    if "ByteLevel" in kinds:
        return _cached(lambda i: _byte_level_bytes(backend.id_to_token(i) or "")), False
    if "Metaspace" in kinds or ("Replace" in kinds and any(s.get("content") == " " for s in steps)):
        strips = "Strip" in kinds or any(s.get("prepend_scheme", "never") != "never" for s in steps)

        def spm_bytes(token_id: int) -> bytes:
            piece = backend.id_to_token(token_id) or ""
            byte = _BYTE_PIECE.fullmatch(piece) if "ByteFallback" in kinds else None
            return bytes([int(byte.group(1), 16)]) if byte else piece.replace(SPACE_MARK, " ").encode()

        return _cached(spm_bytes), strips
    return None, False


def _post_processor_additions(backend: Backend) -> tuple[list[int], list[int]]:
    """The ids the file's post-processor puts before and after a text."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    start = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    return full[:start], full[start + len(plain) :]


def _cached(compute: Callable[[int], bytes]) -> Callable[[int], bytes]:
    # A dict filled on first use: a generated token costs one lookup, and a 262k vocabulary
    # is not converted up front.
    table: dict[int, bytes] = {}

    def lookup(token_id: int) -> bytes:
        found = table.get(token_id)
        if found is None:
            found = table[token_id] = compute(token_id)
        return found

    return lookup


_BUILT: dict[bytes, Tokenizer] = {}  # by `_tokenizer_key`, oldest first
_BUILT_LIMIT = 4  # vocabularies kept: a few models switched between, not every one ever opened


def _tokenizer_key(metadata: Mapping[str, Any]) -> bytes:
    """A digest of every `tokenizer.*` value, the whole of what the Tokenizer is built from."""
    digest = hashlib.sha256()
    for key in sorted(k for k in metadata if k.startswith("tokenizer.")):
        digest.update(key.encode() + b"\0" + _value_bytes(metadata[key]) + b"\1")
    return digest.digest()


def _value_bytes(value: Any) -> bytes:
    """A metadata value as bytes that differ whenever the value does (its kind included)."""
    if isinstance(value, np.ndarray):  # callers may pass token types as numpy: its repr elides
        return (
            b"a"
            + value.dtype.str.encode()
            + repr(value.shape).encode()
            + np.ascontiguousarray(value).tobytes()
        )
    if isinstance(value, list) and value:
        if all(type(v) is str for v in value):  # a vocabulary, merges: joined in one call
            return b"s" + "\0".join(value).encode("utf-8", "surrogatepass")
        if all(type(v) in (int, float) for v in value):  # scores, token types: one numpy copy
            array = np.asarray(value)
            if array.dtype != object:  # ints past 64 bits stay Python objects: repr below
                return array.dtype.str.encode() + array.tobytes()
    return b"r" + repr(value).encode("utf-8", "surrogatepass")


def _unique_vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    if len(vocab) != len(tokens):
        log.warning(
            "the vocabulary spells %d tokens twice; the first of each is used", len(tokens) - len(vocab)
        )
    return vocab


def _required(metadata: Mapping[str, Any], key: str) -> Any:
    if key not in metadata:
        raise ValueError(f"GGUF metadata has no {key!r}: cannot build the tokenizer")
    return metadata[key]


def _optional_id(metadata: Mapping[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    return None if value is None else int(value)


def _template_from_config(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The folder's chat template: chat_template.jinja, chat_template.json or tokenizer_config.json."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    source = folder / "chat_template.json"
    template = files.read_json_object(source).get("chat_template")
    if template is None:
        source, template = folder / "tokenizer_config.json", config.get("chat_template")
    if isinstance(template, list):  # named variants: take "default"
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{source} chat_template is {template!r:.60}; expected a Jinja template string")
    return template
