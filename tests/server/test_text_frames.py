"""The chat stream's text frames spliced from a template (serving_chat._TextFrames) are the bytes the pydantic
models give for the same delta: every client parses them as it parses the rest of the stream."""

from __future__ import annotations

import json

import pytest

from app.engine.server.protocol.chat import ChatCompletionChunk, ChunkChoice, DeltaMessage, ToolCallDelta
from app.engine.server.serving_chat import _TextFrames

TEXTS = ["hi", "", ' "quoted" \\ back\\slash', "\n\t\r\x00\x1f control", "\u2028\u2029 é 中 🙂", "</script>", "  "]


def models_frame(usage: bool):
    def frame(choices: list[ChunkChoice]) -> str:
        chunk = ChatCompletionChunk(id="chatcmpl-1", created=7, model='a "model" é', choices=choices)
        return f"data: {chunk.model_dump_json(exclude=None if usage else {'usage'})}\n\n"

    return frame


@pytest.mark.parametrize("usage", [True, False])
@pytest.mark.parametrize("field", ["content", "reasoning_content"])
def test_spliced_text_frames_are_the_models_bytes(usage: bool, field: str) -> None:
    frame = models_frame(usage)
    frames = _TextFrames(frame)
    for index in (0, 2, 0):  # a choice's template is made once, then reused
        for text in TEXTS:
            delta = DeltaMessage(**{field: text})
            got = frames.of(index, delta)
            assert got == frame([ChunkChoice(index=index, delta=delta)])
            assert json.loads(got.removeprefix("data: "))["choices"][0]["delta"] == {field: text}


def test_other_deltas_go_through_the_models() -> None:
    frame = models_frame(False)
    frames = _TextFrames(frame)
    call = ToolCallDelta(index=0, id="call_1", type="function")
    for delta in (DeltaMessage(role="assistant", content=""), DeltaMessage(tool_calls=[call]), DeltaMessage()):
        assert frames.of(1, delta) == frame([ChunkChoice(index=1, delta=delta)])
