"""The Responses API's streaming events, in the documented order, each with a rising sequence_number.

Text: response.created, response.in_progress, output_item.added (message), content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done; then per function
call: output_item.added, function_call_arguments.delta, function_call_arguments.done,
output_item.done; last response.completed (or response.incomplete when max_output_tokens cut it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from app.engine.server.errors import ApiError
from app.engine.server.generation import Completed, Generation, merged
from app.engine.server.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponseUsage,
)
from app.engine.server.serving_base import new_id
from app.engine.server.sse import event_frame
from app.engine.server.tool_calls import ParsedCall, ToolCallSplitter


class ResponseStream:
    """The documented event sequence; every event carries a rising sequence_number."""

    def __init__(self, shell: ResponseObject, template: Any, parse_calls: bool) -> None:
        self.shell = shell
        self.splitter = ToolCallSplitter(template, parse_calls)
        self.sequence = 0
        self.message_id: str | None = None
        self.text = ""

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event_frame(kind, payload)

    async def frames(self, generation: Generation) -> AsyncIterator[str]:
        final = Completed()
        try:
            yield self.event("response.created", response=self.shell.model_dump())
            yield self.event("response.in_progress", response=self.shell.model_dump())
            async with aclosing(merged([generation])) as outputs:
                async for _, out in outputs:
                    final.add(out)
                    for frame in self.text_delta(self.splitter.feed(out.new_text)):
                        yield frame
            rest, calls = self.splitter.finish()
            for frame in self.text_delta(rest):
                yield frame
            output: list[Any] = []
            if self.message_id is not None:
                message = output_message(self.text, final, self.message_id)
                output.append(message)
                for frame in self.close_message(message):
                    yield frame
            for call in calls:
                item = function_call_item(call, "completed")
                for frame in self.function_call(len(output), item):
                    yield frame
                output.append(item)
            response = finished_response(self.shell, output, final)
            kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
            yield self.event(kind, response=response.model_dump())
        except ApiError as error:
            failed = self.shell.model_copy(
                update={"status": "failed", "error": {"code": "server_error", "message": error.message}}
            )
            yield self.event("response.failed", response=failed.model_dump())

    def text_delta(self, delta: str) -> list[str]:
        if not delta:
            return []
        frames = []
        if self.message_id is None:
            self.message_id = new_id("msg_")
            item = OutputMessage(id=self.message_id, status="in_progress", content=[])
            frames.append(self.event("response.output_item.added", output_index=0, item=item.model_dump()))
            part = OutputText(text="").model_dump()
            frames.append(
                self.event(
                    "response.content_part.added",
                    item_id=self.message_id,
                    output_index=0,
                    content_index=0,
                    part=part,
                )
            )
        self.text += delta
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        frames.append(self.event("response.output_text.delta", **where, delta=delta, logprobs=[]))
        return frames

    def close_message(self, message: OutputMessage) -> list[str]:
        where = {"item_id": message.id, "output_index": 0, "content_index": 0}
        part = message.content[0].model_dump()
        return [
            self.event("response.output_text.done", **where, text=self.text, logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=0, item=message.model_dump()),
        ]

    def function_call(self, index: int, item: OutputFunctionCall) -> list[str]:
        added = item.model_copy(update={"arguments": "", "status": "in_progress"})
        where = {"item_id": item.id, "output_index": index}
        return [
            self.event("response.output_item.added", output_index=index, item=added.model_dump()),
            self.event("response.function_call_arguments.delta", **where, delta=item.arguments),
            self.event(
                "response.function_call_arguments.done", **where, name=item.name, arguments=item.arguments
            ),
            self.event("response.output_item.done", output_index=index, item=item.model_dump()),
        ]


def output_message(text: str, result: Completed | None, item_id: str | None = None) -> OutputMessage:
    status = "incomplete" if result is not None and result.finish_reason == "length" else "completed"
    return OutputMessage(id=item_id or new_id("msg_"), status=status, content=[OutputText(text=text)])


def function_call_item(call: ParsedCall, status: str, item_id: str | None = None) -> OutputFunctionCall:
    arguments = call.arguments if status == "completed" else ""
    return OutputFunctionCall(
        id=item_id or new_id("fc_"), call_id=call.id, name=call.name, arguments=arguments, status=status
    )


def finished_response(shell: ResponseObject, output: list[Any], result: Completed) -> ResponseObject:
    truncated = result.finish_reason == "length"
    return shell.model_copy(
        update={
            "status": "incomplete" if truncated else "completed",
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if truncated else None,
            "output": output,
            "usage": ResponseUsage(
                input_tokens=result.prompt_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=result.cached_tokens),
                output_tokens=result.output_tokens,
                total_tokens=result.prompt_tokens + result.output_tokens,
            ),
        }
    )
