"""Grammar masks on a tiny SentencePiece vocabulary (tests/engine/conftest.py), checked against
masks worked out by hand: a token may be allowed only when its bytes continue some text the grammar
accepts, EOS exactly when the text is complete. (Where the grammar forces the next bytes, llguidance
allows only the token our tokenizer would spell them with, and of tokens with the same bytes only
one: so where the text may go more than one way the masks are compared for equality, elsewhere for
inclusion.)"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.request import Request
from app.engine.sample.grammar import GrammarMasks
from app.engine.sample.ops import apply_token_bitmask
from app.engine.sample.sampler import Sampler, deferrable
from app.engine.sampling_params import SamplingParams
from app.engine.text.grammar import GrammarSpec

EOS = 2
PADDED_VOCAB = 300  # logits wider than the tokenizer's 273 tokens, and not a multiple of 32
OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
OK_TEXTS = (b'{"ok": true}', b'{"ok": false}')  # all the schema admits, written compactly


def allowed_by_hand(tokenizer, texts: tuple[bytes, ...], done: bytes) -> set[int]:
    rests = [t[len(done) :] for t in texts if t.startswith(done)]
    allowed = {
        i
        for i in range(tokenizer.vocab_size)
        if not tokenizer.is_special(i)
        and (piece := tokenizer.token_bytes(i))
        and any(rest.startswith(piece) for rest in rests)
    }
    return allowed | ({EOS} if b"" in rests else set())


def allowed_ids(masks: GrammarMasks, request: Request) -> set[int]:
    logits = np.zeros((1, PADDED_VOCAB), dtype=np.float32)
    apply_token_bitmask(logits, masks.masks([request]))
    return set(np.flatnonzero(np.isfinite(logits[0])).tolist())


def constrained_request(spec: GrammarSpec, rid: str = "r", **params) -> Request:
    return Request(rid, [1], SamplingParams(grammar=spec, max_tokens=64, **params))


@pytest.fixture
def masks(tiny_tokenizer) -> GrammarMasks:
    return GrammarMasks(tiny_tokenizer, PADDED_VOCAB)


def test_each_mask_allows_only_tokens_that_continue_the_schema(tiny_tokenizer, masks) -> None:
    rng = np.random.default_rng(0)
    for walk in range(8):  # random walks through the grammar, checking every step's mask
        request = constrained_request(GrammarSpec.json_schema(OK_SCHEMA), f"walk{walk}")
        done = b""
        while True:
            allowed = allowed_ids(masks, request)
            assert allowed and allowed <= allowed_by_hand(tiny_tokenizer, OK_TEXTS, done), done
            assert (EOS in allowed) == (done in OK_TEXTS)
            token = int(rng.choice(sorted(allowed)))
            if token == EOS:
                break
            masks.advance([request], [token])
            request.output_token_ids.append(token)
            done += tiny_tokenizer.token_bytes(token)
        assert done in OK_TEXTS


def test_where_the_text_may_go_several_ways_every_continuing_token_is_allowed(tiny_tokenizer, masks) -> None:
    """A boolean: "true" or "false", nothing forced yet. Byte tokens that repeat a piece's bytes
    ("o", "k") are left to the piece."""
    request = constrained_request(GrammarSpec.json_schema({"type": "boolean"}))
    by_hand = allowed_by_hand(tiny_tokenizer, (b"true", b"false"), b"")
    assert allowed_ids(masks, request) == by_hand
    assert {tiny_tokenizer.token_to_id("true"), 3 + ord("t"), 3 + ord("f")} <= by_hand


def test_special_tokens_are_never_text_and_padding_ids_never_allowed(tiny_tokenizer, masks) -> None:
    """`<s>` is a control token: a grammar asking for the text "<s>" gets it spelled as plain text,
    token by token as our tokenizer spells it."""
    request = constrained_request(GrammarSpec.lark('start: "<s>"'))
    spelling = tiny_tokenizer.encode("<s>", add_special_tokens=False, parse_special=False)
    assert 1 not in spelling
    for token in spelling:
        allowed = allowed_ids(masks, request)
        assert allowed == {token}
        assert not allowed & set(range(tiny_tokenizer.vocab_size, PADDED_VOCAB))
        masks.advance([request], [token])
        request.output_token_ids.append(token)
    assert allowed_ids(masks, request) == {EOS}


def test_sampling_at_temperature_one_always_yields_what_the_schema_admits(tiny_tokenizer, masks) -> None:
    sampler = Sampler(frozenset({EOS}), default_seed=1, grammars=masks)
    rng = np.random.default_rng(2)
    for seed in range(20):
        request = constrained_request(GrammarSpec.json_schema(OK_SCHEMA), f"r{seed}", seed=seed)
        sampler.start(request)
        while not request.output_token_ids or request.output_token_ids[-1] != EOS:
            logits = rng.normal(0, 3, (1, PADDED_VOCAB)).astype(np.float32)
            request.output_token_ids += sampler.sample(logits, [request]).token_ids
        text = b"".join(tiny_tokenizer.token_bytes(t) for t in request.output_token_ids[:-1])
        assert text in OK_TEXTS
        sampler.forget(request.request_id)


def test_the_mask_comes_before_penalties_and_top_k(masks) -> None:
    """The best logit is a token the grammar forbids: top-k 1 and greedy take the best allowed one."""
    sampler = Sampler(frozenset({EOS}), grammars=masks)
    opening = 3 + ord("{")  # the byte token: how our tokenizer spells "{" here
    for params in ({"top_k": 1}, {"temperature": 0.0}, {"top_k": 1, "repetition_penalty": 1.3}):
        request = constrained_request(GrammarSpec.json_schema(OK_SCHEMA), **params)
        logits = np.zeros((1, PADDED_VOCAB), dtype=np.float32)
        logits[0, 7] = 100.0  # a byte token no JSON object starts with
        logits[0, opening] = 5.0
        assert sampler.sample(logits, [request]).token_ids == [opening]
        sampler.forget(request.request_id)


def test_a_finished_grammar_ends_on_eos_even_under_min_tokens(tiny_tokenizer, masks) -> None:
    """A grammar decides where its text ends: min_tokens bans no EOS on its row."""
    sampler = Sampler(frozenset({EOS}), grammars=masks)
    request = constrained_request(GrammarSpec.json_schema(OK_SCHEMA), min_tokens=30, temperature=0.0)
    request.output_token_ids = tiny_tokenizer.encode('{"ok": true}', add_special_tokens=False)
    sampler.start(request)  # replays the output so far, as after a preemption
    logits = np.zeros((1, PADDED_VOCAB), dtype=np.float32)
    logits[0, EOS] = -50.0
    assert sampler.sample(logits, [request]).token_ids == [EOS]


def test_rows_without_a_grammar_are_untouched_beside_one_with(masks) -> None:
    sampler = Sampler(frozenset({EOS}), grammars=masks)
    free = Request("free", [1], SamplingParams(temperature=0.0))
    bound = constrained_request(GrammarSpec.json_schema(OK_SCHEMA), temperature=0.0)
    logits = np.zeros((2, PADDED_VOCAB), dtype=np.float32)
    logits[:, 7] = 100.0
    got = sampler.sample(logits, [free, bound]).token_ids
    assert got[0] == 7 and got[1] != 7


def test_apply_token_bitmask_matches_a_loop_over_the_bits() -> None:
    rng = np.random.default_rng(3)
    vocab = 77
    bitmask = rng.integers(-(2**31), 2**31, size=(3, 3), dtype=np.int64).astype(np.int32)
    rows = rng.standard_normal((3, vocab)).astype(np.float32)
    expected = rows.copy()
    for r in range(3):
        for t in range(vocab):
            if not (int(bitmask[r, t // 32]) >> (t % 32)) & 1:
                expected[r, t] = -np.inf
    apply_token_bitmask(rows, bitmask)
    np.testing.assert_array_equal(rows, expected)


def test_grammar_rows_are_never_deferred() -> None:
    assert deferrable(Request("a", [1], SamplingParams()))
    assert not deferrable(constrained_request(GrammarSpec.json_object()))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GrammarSpec.json_schema({"type": "strin"}), "Invalid type: strin"),
        (lambda: GrammarSpec.json_schema({"type": "string", "format": "colour"}), "Unknown format"),
        (lambda: GrammarSpec.lark("start: missing"), "unknown name"),
        (lambda: GrammarSpec.json_schema(["not", "a", "schema"]), "must be an object"),  # type: ignore[arg-type]
        (lambda: SamplingParams(grammar='{"type": "object"}'), "grammar must be a GrammarSpec"),  # type: ignore[arg-type]
    ],
)
def test_grammars_the_library_refuses_are_named(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_sampler_without_a_tokenizer_refuses_grammars() -> None:
    with pytest.raises(ValueError, match="cannot enforce grammars"):
        Sampler(frozenset({EOS})).start(constrained_request(GrammarSpec.json_object()))


def test_the_vocabulary_view_is_built_once_per_tokenizer_on_its_own_thread(tiny_tokenizer, monkeypatch) -> None:
    """Building llguidance's view holds the interpreter for seconds at a 262k vocabulary: it starts when
    the masks are made (at engine load), off the caller's thread, and engines over one tokenizer share it."""
    import threading

    from app.engine.sample import grammar

    built_on: list[str] = []
    table = grammar._TokenTable

    def recording_table(*args):
        built_on.append(threading.current_thread().name)
        return table(*args)

    monkeypatch.setattr(grammar, "_TokenTable", recording_table)
    monkeypatch.setattr(grammar, "_VIEWS", grammar.weakref.WeakKeyDictionary())
    first, second = GrammarMasks(tiny_tokenizer, PADDED_VOCAB), GrammarMasks(tiny_tokenizer, PADDED_VOCAB)
    request = constrained_request(GrammarSpec.json_schema(OK_SCHEMA))
    assert allowed_ids(first, request) == allowed_ids(second, constrained_request(request.sampling_params.grammar))
    assert first._tokenizer_view() is second._tokenizer_view()
    assert built_on == ["grammar-vocab"]
    GrammarMasks(tiny_tokenizer, PADDED_VOCAB + 32)._tokenizer_view()  # another logits width: its own view
    assert built_on == ["grammar-vocab", "grammar-vocab"]
