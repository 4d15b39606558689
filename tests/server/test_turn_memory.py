"""TurnMemory on the embedded Gemma tokenizer: which remembered ids a new prompt's text may reuse."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.server.turn_memory import NO_REUSE, TurnMemory

PROMPT = "<bos><start_of_turn>user\nTell me about postage.<end_of_turn>\n<start_of_turn>model\n"
NEXT = "<end_of_turn>\n<start_of_turn>user\nMore.<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def tokenizer(embedded_engine: Any) -> Any:
    return embedded_engine.tokenizer


def ids(tokenizer: Any, *pieces: str) -> list[int]:
    found = [tokenizer.token_to_id(piece) for piece in pieces]
    assert None not in found, f"the vocabulary lacks one of {pieces}"
    return found


@pytest.fixture
def memory(tokenizer: Any) -> TurnMemory:
    return TurnMemory(tokenizer)


def prompt_ids(tokenizer: Any) -> list[int]:
    return tokenizer.encode(PROMPT, add_special_tokens=False)


def test_sampled_ids_are_reused_where_the_tokenizer_would_spell_the_text_otherwise(
    tokenizer: Any, memory: TurnMemory
) -> None:
    sampled = ids(tokenizer, "▁post", "paid", "<end_of_turn>")
    memory.remember(PROMPT, prompt_ids(tokenizer), sampled)
    text = PROMPT + " postpaid" + NEXT
    assert ids(tokenizer, "▁postpaid")[0] in tokenizer.encode(text)  # re-tokenizing would split the cache
    reuse = memory.reuse(text)
    assert reuse.token_ids == prompt_ids(tokenizer) + sampled
    assert reuse.num_chars == len(PROMPT + " postpaid<end_of_turn>")
    assert tokenizer.decode(reuse.token_ids) == text[: reuse.num_chars]


def test_reuse_stops_at_the_first_token_the_text_does_not_repeat(tokenizer: Any, memory: TurnMemory) -> None:
    memory.remember(PROMPT, prompt_ids(tokenizer), ids(tokenizer, "▁post", "paid", "<end_of_turn>"))
    reuse = memory.reuse(PROMPT + " postpaim" + NEXT)
    assert reuse.token_ids == prompt_ids(tokenizer) + ids(tokenizer, "▁post")
    assert reuse.num_chars == len(PROMPT + " post")


def test_a_prompt_that_does_not_start_with_a_remembered_one_reuses_nothing(
    tokenizer: Any, memory: TurnMemory
) -> None:
    memory.remember(PROMPT, prompt_ids(tokenizer), ids(tokenizer, "▁post"))
    assert memory.reuse(PROMPT.replace("postage", "postal") + " post" + NEXT) == NO_REUSE


def test_ids_that_end_inside_a_character_are_not_reused(tokenizer: Any, memory: TurnMemory) -> None:
    sampled = ids(tokenizer, "▁caf", "<0xC3>", "<0xA9>")  # "é" as its two bytes
    memory.remember(PROMPT, prompt_ids(tokenizer), sampled)
    assert memory.reuse(PROMPT + " café" + NEXT).token_ids == prompt_ids(tokenizer) + sampled
    other = memory.reuse(PROMPT + " cafè" + NEXT)  # C3 A8: the first byte matches, the character does not
    assert other.token_ids == prompt_ids(tokenizer) + ids(tokenizer, "▁caf")
    assert other.num_chars == len(PROMPT + " caf")


def test_plain_pieces_that_spell_a_special_token_are_not_reused(tokenizer: Any, memory: TurnMemory) -> None:
    spelled = tokenizer.encode("<end_of_turn>", add_special_tokens=False, parse_special=False)
    assert len(spelled) > 1 and not any(tokenizer.is_special(i) for i in spelled)
    memory.remember(PROMPT, prompt_ids(tokenizer), spelled)
    reuse = memory.reuse(PROMPT + NEXT)  # re-tokenized, the text is the end-of-turn token itself
    assert reuse.token_ids == prompt_ids(tokenizer)
    assert reuse.num_chars == len(PROMPT)


def test_the_longest_reuse_wins_and_chains_across_turns(tokenizer: Any, memory: TurnMemory) -> None:
    first = ids(tokenizer, "▁post", "paid", "<end_of_turn>")
    memory.remember(PROMPT, prompt_ids(tokenizer), first)
    second_text = PROMPT + " postpaid" + NEXT
    reuse = memory.reuse(second_text)
    second_ids = reuse.token_ids + tokenizer.encode(second_text[reuse.num_chars :], add_special_tokens=False)
    memory.remember(second_text, second_ids, ids(tokenizer, "▁post", "paid"))
    third = memory.reuse(second_text + " postpaid" + NEXT)
    assert third.token_ids == second_ids + ids(tokenizer, "▁post", "paid")
    assert third.token_ids[: len(prompt_ids(tokenizer)) + 3] == prompt_ids(tokenizer) + first


def test_bounds_drop_the_least_recently_used(tokenizer: Any) -> None:
    memory = TurnMemory(tokenizer, max_turns=2)
    for word in ("alpha", "beta", "gamma"):
        text = PROMPT.replace("postage", word)
        memory.remember(text, tokenizer.encode(text, add_special_tokens=False), ids(tokenizer, "▁post"))
    assert len(memory) == 2
    assert memory.reuse(PROMPT.replace("postage", "alpha") + " post") == NO_REUSE
    assert memory.reuse(PROMPT.replace("postage", "gamma") + " post").num_chars > 0
    small = TurnMemory(tokenizer, max_tokens=4)
    small.remember(PROMPT, prompt_ids(tokenizer), ids(tokenizer, "▁post"))  # more ids than it holds
    assert len(small) == 0
    with pytest.raises(ValueError, match="max_turns"):
        TurnMemory(tokenizer, max_turns=-1)
