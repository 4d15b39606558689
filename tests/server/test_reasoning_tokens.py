"""Reasoning tokens in usage, through the official SDKs, on a scripted harmony token sequence.

The script is written as labelled parts: which parts are the model's reasoning (its analysis
messages, delimiters and all, as Anthropic counts thinking tokens) is stated by the test, not
derived by the server's counter. The tokenizer is harmony's one-token-per-character fake with
single-token markers, so a part's token count is its encoded length. Each protocol must report
exactly that many reasoning tokens, and still count every generated token as output.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.engine.server.reasoning_tokens import count_reasoning_tokens
from app.engine.text.harmony_render import HarmonyTemplate

from .conftest import running_server
from .fakes import FakeChatTemplate, FakeEngine, MarkupTokenizer
from .test_harmony import SPECIALS

# (is reasoning, text): two analysis messages around a preamble to the user, then the answer
PARTS = [
    (True, "<|channel|>analysis<|message|>First, recall the facts.<|end|>"),
    (False, "<|start|>assistant<|channel|>commentary<|message|>Let me think.<|end|>"),
    (True, "<|start|>assistant<|channel|>analysis<|message|>Paris is the capital.<|end|>"),
    (False, "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>"),
]
REPLY = "".join(text for _, text in PARTS)
TOKENIZER = MarkupTokenizer(SPECIALS, ("<|return|>", "<|call|>"))
REASONING = sum(len(TOKENIZER.encode(text)) for thinking, text in PARTS if thinking)
ALL = len(TOKENIZER.encode(REPLY))
USER = [{"role": "user", "content": "Capital of France?"}]


class ScriptedHarmonyEngine(FakeEngine):
    """Answers every prompt with REPLY, cut at max_tokens (finish reason "length") when that is shorter."""

    def _plan(self, prompt: str, params) -> list[tuple[int, str, str | None, str | int | None]]:
        ids = self.tokenizer.encode(REPLY)
        plan = [(i, self.tokenizer.decode([i], params.skip_special_tokens), None, None) for i in ids]
        if params.max_tokens is not None and params.max_tokens < len(plan):
            return [*plan[: params.max_tokens - 1], (*plan[params.max_tokens - 1][:2], "length", None)]
        return [*plan[:-1], (ids[-1], "", "stop", None)]  # the stop token: counted, not printed


@pytest.fixture(scope="module")
def engine() -> ScriptedHarmonyEngine:
    return ScriptedHarmonyEngine(tokenizer=TOKENIZER, chat_template=HarmonyTemplate())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server(engine: ScriptedHarmonyEngine) -> Iterator:
    with running_server(engine) as handle:
        yield handle


def test_the_script_has_reasoning_and_answer_tokens():
    assert 0 < REASONING < ALL  # so a counter that gives 0 or everything fails below


def test_chat_completion_reports_the_reasoning_tokens(openai_client, engine):
    reply = openai_client.chat.completions.create(model=engine.name, messages=USER)
    assert reply.choices[0].message.content == "Let me think.Paris."
    assert reply.usage.completion_tokens == ALL
    assert reply.usage.completion_tokens_details.reasoning_tokens == REASONING


def test_chat_stream_reports_them_in_the_final_usage_chunk(openai_client, engine):
    chunks = list(
        openai_client.chat.completions.create(
            model=engine.name, messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.completion_tokens == ALL
    assert usage.completion_tokens_details.reasoning_tokens == REASONING
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_chat_with_n_choices_sums_them(openai_client, engine):
    reply = openai_client.chat.completions.create(model=engine.name, messages=USER, n=2)
    assert reply.usage.completion_tokens == 2 * ALL
    assert reply.usage.completion_tokens_details.reasoning_tokens == 2 * REASONING


def test_reasoning_cut_short_by_max_tokens_counts_up_to_the_cut(openai_client, engine):
    cut = len(TOKENIZER.encode(PARTS[0][1])) - 3  # inside the first analysis message's body
    reply = openai_client.chat.completions.create(model=engine.name, messages=USER, max_tokens=cut)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == cut
    assert reply.usage.completion_tokens_details.reasoning_tokens == cut


def test_responses_api_reports_them_in_output_tokens_details(openai_client, engine):
    reply = openai_client.responses.create(model=engine.name, input="Capital of France?")
    assert reply.usage.output_tokens == ALL
    assert reply.usage.output_tokens_details.reasoning_tokens == REASONING
    with openai_client.responses.stream(model=engine.name, input="Capital of France?") as stream:
        streamed = stream.get_final_response()
    assert streamed.usage.output_tokens == ALL
    assert streamed.usage.output_tokens_details.reasoning_tokens == REASONING


def test_anthropic_messages_report_them_as_thinking_tokens(anthropic_client, engine):
    message = anthropic_client.messages.create(model=engine.name, max_tokens=300, messages=USER)
    assert message.content[0].type == "thinking" and message.content[-1].text.endswith("Paris.")
    assert message.usage.output_tokens == ALL
    assert message.usage.output_tokens_details.thinking_tokens == REASONING
    with anthropic_client.messages.stream(model=engine.name, max_tokens=300, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == ALL
    assert final.usage.output_tokens_details.thinking_tokens == REASONING


def test_a_reply_without_channels_has_no_reasoning_tokens():
    """A template that does not split reasoning from the answer (Qwen3's `<think>` stays content)."""
    tokens = TOKENIZER.encode(REPLY)
    assert count_reasoning_tokens(FakeChatTemplate(), TOKENIZER, tokens) == 0
    assert count_reasoning_tokens(HarmonyTemplate(), TOKENIZER, tokens) == REASONING
