"""Compare: one prompt to several targets at once, against local fake servers and a fake engine."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import pytest
from fake_openai import fake_servers

from app.engine.interface import GenerationRequest, ModelInfo
from app.engine.request import RequestOutput
from app.studio.compare import CompareRequest, Target, compare_blocking
from app.studio.tasks import CancelToken


class _FakeTokenizer:
    bos_token_id = None
    vocab_size = 0x110000  # one id per code point: encode() spells text by ord()
    max_token_chars = 1  # what the prompt builder's length pre-check reads

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def id_to_token(self, token_id: int) -> str:
        return chr(token_id)


class _FakeTemplate:
    stop_strings = ("<end>",)

    def render(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class FakeEngine:
    """An EngineClient that answers every prompt with the same words."""

    def __init__(self, words: tuple[str, ...] = ("Local", " answer", ".")) -> None:
        self.model = ModelInfo("local-fake", "/models/fake.gguf", "llama", "Q4_K_M", 1000, 4096, "cpu")
        self.tokenizer = _FakeTokenizer()
        self.chat_template = _FakeTemplate()
        self.words = words
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        n_prompt = len(request.prompt_token_ids)
        for i, word in enumerate(self.words):
            last = i == len(self.words) - 1
            yield RequestOutput(request.request_id, [100 + i], word, None, last, "stop" if last else None,
                                None, n_prompt, i + 1)

    async def abort(self, request_id: str) -> None:
        pass


@pytest.fixture
def servers():
    with fake_servers() as start:
        yield start


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def test_columns_stream_at_the_same_time(servers):
    slow = servers(mode="slow", reply="Slow but sure.")
    fast = servers(mode="ok", reply="The quick brown fox jumps.")
    engine = FakeEngine()
    targets = [
        Target.openai_compatible(slow.base_url, "fake-model", label="slow"),
        Target.openai_compatible(fast.base_url, "fake-model", label="fast"),
        Target.local(engine),
    ]
    events: list[tuple[str, str, str]] = []

    def on_event(index, column, text):
        events.append((column.label, column.status, text))
        if column.label == "fast" and column.status == "done":
            slow.gate.set()  # the slow server only starts once the fast column has finished

    result = compare_blocking(CompareRequest("Say something", system_prompt="Be brief.", max_tokens=32),
                              targets, on_event=on_event)
    by_label = {c.label: c for c in result.columns}
    assert [c.status for c in result.columns] == ["done", "done", "done"]
    assert by_label["slow"].text == "Slow but sure."
    fast_done = events.index(("fast", "done", ""))
    first_slow_text = next(i for i, e in enumerate(events) if e[0] == "slow" and e[2])
    assert fast_done < first_slow_text  # the slow column was still waiting while the fast one finished

    quick = by_label["fast"]
    assert quick.text == "The quick brown fox jumps."
    assert (quick.prompt_tokens, quick.completion_tokens, quick.tokens_estimated) == (7, 5, False)
    assert quick.finish_reason == "stop" and quick.ttft_s is not None and quick.total_s >= quick.ttft_s
    assert quick.tokens_per_s is not None and quick.tokens_per_s > 0
    assert fast.bodies[0]["messages"] == [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Say something"}]
    assert fast.bodies[0]["stream"] is True and fast.bodies[0]["max_tokens"] == 32

    local = by_label["Local: local-fake"]
    assert local.text == "Local answer." and local.completion_tokens == 3 and local.finish_reason == "stop"
    [request] = engine.requests
    assert local.prompt_tokens == len(request.prompt_token_ids)
    assert request.sampling_params.max_tokens == 32 and request.sampling_params.stop == ["<end>"]


def test_each_failure_is_a_readable_message_in_its_own_column(servers):
    failing = servers(mode="fail")
    keyed = servers(api_key="sk-right")
    working = servers()
    targets = [
        Target.openai_compatible(failing.base_url, "fake-model", label="failing"),
        Target.openrouter("fake-model", api_key="sk-wrong", base_url=keyed.base_url, label="wrong key"),
        Target.openai_compatible(_closed_port_url(), "fake-model", label="unreachable"),
        Target.openai_compatible(working.base_url, "fake-model", label="working"),
    ]
    result = compare_blocking(CompareRequest("hi"), targets)
    errors = {c.label: c.error for c in result.columns}
    assert "HTTP 500" in errors["failing"] and "The model crashed." in errors["failing"]
    assert "rejected the API key (HTTP 401)" in errors["wrong key"] and "Incorrect API key" in errors["wrong key"]
    assert "Cannot reach" in errors["unreachable"]
    assert errors["working"] is None and result.columns[3].text == "The quick brown fox jumps."
    assert all("Traceback" not in (e or "") for e in errors.values())


def test_dropped_stream_unknown_model_and_missing_key(servers):
    dropping = servers(mode="drop")
    working = servers()
    targets = [
        Target.openai_compatible(dropping.base_url, "fake-model", label="drop"),
        Target.openai_compatible(working.base_url, "no-such-model", label="unknown"),
        Target.openrouter("fake-model", api_key=None, base_url=working.base_url, label="no key"),
    ]
    result = compare_blocking(CompareRequest("hi"), targets)
    drop, unknown, no_key = result.columns
    assert drop.status == "error" and "broke off" in drop.error and drop.text == "The quick"
    assert "does not know model 'no-such-model'" in unknown.error
    assert "No OpenRouter API key" in no_key.error


def test_cancel_stops_waiting_columns_and_keeps_finished_ones(servers):
    slow = servers(mode="slow")
    fast = servers()
    token = CancelToken()

    def on_event(index, column, text):
        if column.label == "fast" and column.status == "done":
            token.cancel()

    result = compare_blocking(
        CompareRequest("hi"),
        [Target.openai_compatible(slow.base_url, "fake-model", label="slow"),
         Target.openai_compatible(fast.base_url, "fake-model", label="fast")],
        on_event=on_event, token=token,
    )
    assert [c.status for c in result.columns] == ["cancelled", "done"]


def test_results_save_as_json_and_markdown(servers, tmp_path):
    a, b = servers(reply="Alpha answer."), servers(mode="fail")
    result = compare_blocking(CompareRequest("Question?"), [Target.openai_compatible(a.base_url, "fake-model"),
                                                            Target.openai_compatible(b.base_url, "fake-model")])
    saved = json.loads(result.save(tmp_path / "run.json").read_text())
    assert saved["request"]["prompt"] == "Question?"
    assert [c["text"] for c in saved["columns"]] == ["Alpha answer.", ""]
    assert saved["columns"][0]["completion_tokens"] == 2 and "HTTP 500" in saved["columns"][1]["error"]
    markdown = result.save(tmp_path / "run.md").read_text()
    assert "**Prompt:** Question?" in markdown and "| TTFT |" in markdown
    assert "Alpha answer." in markdown and "> Error:" in markdown
    with pytest.raises(ValueError, match=r"\.json or \.md"):
        result.save(tmp_path / "run.txt")


def test_target_count_and_prompt_are_checked(servers):
    one = [Target.openai_compatible("http://127.0.0.1:1/v1", "m")]
    with pytest.raises(ValueError, match="2 to 4 targets"):
        compare_blocking(CompareRequest("hi"), one)
    with pytest.raises(ValueError, match="2 to 4 targets"):
        compare_blocking(CompareRequest("hi"), one * 5)
    with pytest.raises(ValueError, match="prompt is empty"):
        compare_blocking(CompareRequest("  "), one * 2)
