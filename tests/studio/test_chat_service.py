"""ChatService: prompts built from History, answers streamed into History as they stream, stop, regenerate."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

import pytest

from app.studio.chat import Answer, AnswerStats, ChatError, ChatService, ChatSettings, prompt_messages
from app.studio.history import History

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the server's fake engine
FakeEngine = importlib.import_module("server.fakes").FakeEngine


@pytest.fixture
def history(tmp_path):
    with History(tmp_path / "history.sqlite3") as opened:
        yield opened


def _service(history: History, engine=None) -> ChatService:
    engine = engine if engine is not None else FakeEngine()
    return ChatService(history, lambda: engine)


def test_answer_streams_into_history_delta_by_delta(history):
    service = _service(history)
    conversation = service.new_conversation(system_prompt="Be brief.")
    saved_at_each_delta: list[tuple[str, str]] = []
    shown: list[str] = []

    def on_delta(message_id: int, text: str) -> None:
        shown.append(text)
        saved_at_each_delta.append((history.message(message_id).content, "".join(shown)))

    answer = asyncio.run(service.send(conversation.id, "hello there", on_delta=on_delta))
    assert answer.status == "complete" and answer.text == "Echo: hello there"
    assert all(saved == seen for saved, seen in saved_at_each_delta)  # saved before it was shown
    stored = history.conversation(conversation.id).messages
    assert [(m.role, m.content, m.status) for m in stored] == [
        ("user", "hello there", "complete"), ("assistant", "Echo: hello there", "complete")]
    assert stored[1].completion_tokens == answer.stats.completion_tokens == len("Echo: hello there") + 1  # + EOS
    assert stored[1].prompt_tokens == answer.stats.prompt_tokens > 0
    assert stored[1].ttft_s is not None and stored[1].tokens_per_s and stored[1].tokens_per_s > 0
    assert stored[1].finish_reason == "stop" and stored[1].model == "fake-model"


def test_prompt_holds_system_prompt_history_and_sampling_settings(history):
    engine = FakeEngine()
    service = _service(history, engine)
    conversation = service.new_conversation()
    service.configure(conversation.id, "You are terse.", ChatSettings(temperature=0.2, top_p=0.5, max_tokens=64,
                                                                        seed=7))
    asyncio.run(service.send(conversation.id, "first"))
    asyncio.run(service.send(conversation.id, "second"))
    request = engine.requests[-1]
    prompt = engine.tokenizer.decode(request.prompt_token_ids)
    assert prompt.startswith("<bos><start_of_turn>system\nYou are terse.<end_of_turn>")
    assert "user\nfirst" in prompt and "assistant\nEcho: first" in prompt and prompt.endswith("assistant\n")
    params = request.sampling_params
    assert (params.temperature, params.top_p, params.max_tokens, params.seed) == (0.2, 0.5, 64, 7)
    assert params.stop == ["<end_of_turn>"]


def test_stop_keeps_what_streamed_and_frees_the_request(history):
    engine = FakeEngine()
    service = _service(history, engine)
    conversation = service.new_conversation(settings=ChatSettings(max_tokens=1000))

    async def run() -> Answer:
        def on_delta(message_id: int, text: str) -> None:
            if history.message(message_id).content.count("tick") >= 3:
                service.stop()

        return await service.send(conversation.id, "go on forever", on_delta=on_delta)

    answer = asyncio.run(run())
    assert answer.status == "stopped" and answer.text.startswith("tick tick tick")
    stored = history.conversation(conversation.id).messages[-1]
    assert stored.status == "stopped" and stored.content == answer.text and stored.finish_reason == "abort"
    assert engine.closed_early == {engine.requests[-1].request_id}
    assert not service.busy


def test_regenerate_replaces_the_last_answer(history):
    engine = FakeEngine()
    service = _service(history, engine)
    conversation = service.new_conversation()
    asyncio.run(service.send(conversation.id, "again"))
    second = asyncio.run(service.regenerate(conversation.id))
    messages = history.conversation(conversation.id).messages
    assert [m.role for m in messages] == ["user", "assistant"]  # the first answer is gone, not kept beside
    assert messages[-1].id == second.message_id and messages[-1].content == "Echo: again"
    assert len(engine.requests) == 2
    assert engine.requests[0].prompt_token_ids == engine.requests[1].prompt_token_ids


def test_consecutive_questions_are_merged_for_templates_that_want_alternating_roles(history):
    conversation = history.create_conversation(system_prompt="sys")
    history.add_message(conversation.id, "user", "one")
    failed = history.start_message(conversation.id)
    history.finish_message(failed.id, "error")
    history.add_message(conversation.id, "user", "two")
    assert prompt_messages(history.conversation(conversation.id)) == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "one\n\ntwo"}]


def test_a_conversation_longer_than_the_context_is_refused_with_both_numbers(history):
    service = _service(history, FakeEngine(context_length=40))
    conversation = service.new_conversation()
    with pytest.raises(ChatError, match=r"is \d+ tokens long, and the model's context holds 40"):
        asyncio.run(service.send(conversation.id, "x" * 100))


def test_the_answer_is_clamped_to_the_room_left_in_the_context(history):
    engine = FakeEngine(context_length=200)
    service = _service(history, engine)
    conversation = service.new_conversation(settings=ChatSettings(max_tokens=10_000))
    asyncio.run(service.send(conversation.id, "hi"))
    request = engine.requests[-1]
    assert request.sampling_params.max_tokens == 200 - len(request.prompt_token_ids)


def test_without_a_model_the_user_is_told_to_load_one(history):
    service = ChatService(history, lambda: None)
    conversation = history.create_conversation()
    with pytest.raises(ChatError, match="No model is loaded"):
        asyncio.run(service.send(conversation.id, "hello"))
    assert history.conversation(conversation.id).messages == ()


def test_an_engine_failure_mid_answer_is_an_error_answer_with_its_text_kept(history):
    class FailingEngine(FakeEngine):
        async def _generate(self, request):
            async for output in super()._generate(request):
                yield output
                if output.num_output_tokens == 3:
                    raise RuntimeError("the engine failed while generating: out of KV blocks")

    service = _service(history, FailingEngine())
    conversation = service.new_conversation()
    answer = asyncio.run(service.send(conversation.id, "hello"))
    assert answer.status == "error" and answer.error and "out of KV blocks" in answer.error
    assert answer.text == "Ech"
    assert history.conversation(conversation.id).messages[-1].status == "error"


def test_conversation_survives_a_restart(tmp_path):
    path = tmp_path / "history.sqlite3"
    with History(path) as first:
        service = _service(first)
        conversation = service.new_conversation(settings=ChatSettings(temperature=0.3))
        asyncio.run(service.send(conversation.id, "remember me"))
    with History(path) as again:
        restored = again.conversation(conversation.id)
        assert [m.content for m in restored.messages] == ["remember me", "Echo: remember me"]
        assert ChatSettings.from_dict(restored.settings).temperature == 0.3


def test_stats_line_reads_well():
    stats = AnswerStats(prompt_tokens=23, completion_tokens=12, ttft_s=0.412, tokens_per_s=8.34,
                        finish_reason="length")
    assert stats.describe() == "12 tokens · 8.3 tok/s · first token 0.41 s · prompt 23 tokens · stopped at max tokens"
    assert ChatSettings.from_dict({"temperature": 0.1, "unknown": 1}).temperature == 0.1


class _Documents:
    """A document set's face to the chat: its size and the excerpts close enough to a question."""

    def __init__(self, citations, error: Exception | None = None) -> None:
        self.citations, self.error, self.asked = citations, error, []

    def __len__(self) -> int:
        return 1

    def retrieve(self, question: str):
        self.asked.append(question)
        if self.error is not None:
            raise self.error
        return self.citations


def test_a_question_carries_the_excerpts_close_to_it_or_goes_alone(history):
    from app.studio.doc_qa import DocQAError
    from app.studio.retrieval import Chunk, Citation, Hit

    service = _service(history)
    assert service.question("hi") == "hi"
    excerpt = Citation(1, Hit(Chunk("Paris is the capital.", "/docs/france.txt", "line 1", 0), 0.9))
    documents = _Documents([excerpt])
    message = service.question("capital?", documents)
    assert message.startswith("capital?\n\n") and "[1] france.txt, line 1\nParis is the capital." in message
    assert documents.asked == ["capital?"]
    assert service.question("weather?", _Documents([])) == "weather?"  # nothing close: the question alone
    with pytest.raises(DocQAError, match="no index"):
        service.question("x", _Documents([], DocQAError("no index")))
    assert history.conversations() == []  # refused or not, asking saves nothing


def test_asking_in_place_of_an_edited_question_drops_it_and_what_followed_at_once(history):
    service = _service(history)
    conversation = service.new_conversation()
    asyncio.run(service.send(conversation.id, "first"))
    asyncio.run(service.send(conversation.id, "second"))
    second = next(m for m in history.conversation(conversation.id).messages if m.content == "second")
    pending = service.ask(conversation.id, "second, edited", replacing=second.id)
    kept = [(m.role, m.content) for m in history.conversation(conversation.id).messages]
    assert kept == [("user", "first"), ("assistant", "Echo: first")]  # gone before the answer runs
    answer = asyncio.run(pending)
    assert answer.text == "Echo: second, edited"
    assert [m.content for m in history.conversation(conversation.id).messages] == [
        "first", "Echo: first", "second, edited", "Echo: second, edited"]


class _Set:
    def __init__(self) -> None:
        self.removed: list[Path] = []

    def remove(self, path: Path) -> None:
        self.removed.append(path)


def _dropped(service: ChatService, report):
    documents = _Set()
    return service.route_dropped(documents, report), documents.removed


def test_dropped_scanned_pdfs_leave_the_set_and_go_as_pages_to_a_vision_model(history):
    from types import SimpleNamespace

    from app.studio.doc_qa import IngestedDocument, IngestFailure, IngestReport

    scan = IngestedDocument(Path("/in/scan.pdf"), "pdf", ("page 1",), chunks=0, page_count=1)
    text = IngestedDocument(Path("/in/notes.pdf"), "pdf", ("page 1",), chunks=3, page_count=1)
    report = IngestReport([scan, text], [IngestFailure(Path("/in/bad.docx"), "bad.docx: not a Word file")])
    vision = ChatService(history, lambda: SimpleNamespace(model=SimpleNamespace(supports_vision=True)))
    dropped, removed = _dropped(vision, report)
    assert dropped.as_pages == [scan.path] and removed == [scan.path]
    assert dropped.problems == ["bad.docx: not a Word file"]
    text_only = _service(history)  # the fake engine's model reads text only
    dropped, removed = _dropped(text_only, report)
    assert dropped.as_pages == [] and removed == [scan.path]
    assert dropped.problems[0] == "bad.docx: not a Word file" and "scan.pdf" in dropped.problems[1]
    assert _dropped(text_only, None)[0].problems == []  # a failed ingest: the pane says why, nothing moves


def test_a_question_goes_to_the_open_conversation_with_its_edited_settings_or_to_a_new_one(history):
    service = _service(history)
    first = service.conversation_for(None, "Be brief.", ChatSettings(temperature=0.3))
    stored = history.conversation(first)
    assert stored.system_prompt == "Be brief." and service.settings_of(stored).temperature == 0.3
    assert service.conversation_for(first, "Be kind.", ChatSettings(temperature=0.9)) == first
    stored = history.conversation(first)
    assert stored.system_prompt == "Be kind." and service.settings_of(stored).temperature == 0.9
    assert len(history.conversations()) == 1
