"""The Responses API's streaming events, in the documented order, each with a rising sequence_number.

Text: response.created, response.in_progress, output_item.added (message), content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done. Reasoning (GPT-OSS's
analysis channel) comes first as a `reasoning` item the same way, with reasoning_text.delta and
reasoning_text.done (the events the openai SDK parses). Then per function call: output_item.added,
function_call_arguments.delta, function_call_arguments.done, output_item.done; last response.completed (or response.incomplete when max_output_tokens cut it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from app.engine.server.errors import ApiError
from app.engine.server.generation import Completed, Generation, merged
from app.engine.server.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputReasoning,
    OutputText,
    OutputTokensDetails,
    ReasoningText,
    ResponseObject,
    ResponseUsage,
)
from app.engine.server.serving_base import new_id
from app.engine.server.sse import event_frame
from app.engine.server.tool_calls import ParsedCall, ReplySplitter
from app.engine.text.harmony import REASONING


class ResponseStream:
    """The documented event sequence; every event carries a rising sequence_number.

    The reply's pieces become output items in the order they come: a run of reasoning is a
    `reasoning` item (reasoning_text deltas), a run of answer text a `message` item; a new run of
    the other kind closes the open item and opens the next one."""

    def __init__(
        self,
        shell: ResponseObject,
        template: Any,
        parse_calls: bool,
        reasoning_tokens: Callable[[Completed], int],
    ) -> None:
        self.shell = shell
        self.reasoning_tokens = reasoning_tokens
        self.splitter = ReplySplitter(template, parse_calls)
        self.sequence = 0
        self.output: list[Any] = []  # closed items, in output_index order
        self.open: _OpenItem | None = None

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
                    for frame in self.pieces(self.splitter.feed(out.new_text), final):
                        yield frame
            pieces, calls = self.splitter.finish()
            for frame in [*self.pieces(pieces, final), *self.close(final)]:
                yield frame
            for call in calls:
                item = function_call_item(call, "completed")
                for frame in self.function_call(len(self.output), item):
                    yield frame
                self.output.append(item)
            response = finished_response(self.shell, self.output, final, self.reasoning_tokens(final))
            kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
            yield self.event(kind, response=response.model_dump())
        except ApiError as error:
            failed = self.shell.model_copy(
                update={"status": "failed", "error": {"code": "server_error", "message": error.message}}
            )
            yield self.event("response.failed", response=failed.model_dump())

    def pieces(self, pieces: list[tuple[str, str]], final: Completed) -> list[str]:
        frames = []
        for kind, text in pieces:
            if not text:
                continue
            if self.open is not None and self.open.kind != kind:
                frames += self.close(final)
            if self.open is None:
                frames += self.add(kind)
            assert self.open is not None
            self.open.pieces.append(text)
            delta = "response.reasoning_text.delta" if kind == REASONING else "response.output_text.delta"
            extra = {} if kind == REASONING else {"logprobs": []}
            frames.append(self.event(delta, **self.open.where, delta=text, **extra))
        return frames

    def add(self, kind: str) -> list[str]:
        """Open an item of `kind` with its one content part."""
        if kind == REASONING:
            self.open = _OpenItem(kind, new_id("rs_"), len(self.output))
            item: Any = OutputReasoning(id=self.open.id, status="in_progress", content=[])
            part = ReasoningText(text="").model_dump()
        else:
            self.open = _OpenItem(kind, new_id("msg_"), len(self.output))
            item = OutputMessage(id=self.open.id, status="in_progress", content=[])
            part = OutputText(text="").model_dump()
        index = self.open.index
        return [
            self.event("response.output_item.added", output_index=index, item=item.model_dump()),
            self.event("response.content_part.added", **self.open.where, part=part),
        ]

    def close(self, final: Completed) -> list[str]:
        """Close the open item, if any: its text's done event, the part's and the item's."""
        if self.open is None:
            return []
        current, self.open = self.open, None
        where = current.where
        if current.kind == REASONING:
            item: Any = reasoning_item(current.text, final, current.id)
            done = self.event("response.reasoning_text.done", **where, text=current.text)
        else:
            item = output_message(current.text, final, current.id)
            done = self.event("response.output_text.done", **where, text=current.text, logprobs=[])
        self.output.append(item)
        return [
            done,
            self.event("response.content_part.done", **where, part=item.content[0].model_dump()),
            self.event("response.output_item.done", output_index=current.index, item=item.model_dump()),
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


@dataclass
class _OpenItem:
    """The reasoning or message item being streamed: its kind, id, place and text so far."""

    kind: str
    id: str
    index: int
    pieces: list[str] = field(default_factory=list)  # joined once, when the item closes

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def where(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.index, "content_index": 0}


def reply_items(reasoning: str, text: str, result: Completed) -> list[Any]:
    """A finished reply's reasoning and message items (each only when it has text)."""
    items: list[Any] = [reasoning_item(reasoning, result)] if reasoning else []
    return items + ([output_message(text, result)] if text else [])


def reasoning_item(text: str, result: Completed | None, item_id: str | None = None) -> OutputReasoning:
    status = "incomplete" if result is not None and result.finish_reason == "length" else "completed"
    return OutputReasoning(id=item_id or new_id("rs_"), status=status, content=[ReasoningText(text=text)])


def output_message(text: str, result: Completed | None, item_id: str | None = None) -> OutputMessage:
    status = "incomplete" if result is not None and result.finish_reason == "length" else "completed"
    return OutputMessage(id=item_id or new_id("msg_"), status=status, content=[OutputText(text=text)])


def function_call_item(call: ParsedCall, status: str, item_id: str | None = None) -> OutputFunctionCall:
    arguments = call.arguments if status == "completed" else ""
    return OutputFunctionCall(
        id=item_id or new_id("fc_"), call_id=call.id, name=call.name, arguments=arguments, status=status
    )


def finished_response(
    shell: ResponseObject, output: list[Any], result: Completed, reasoning_tokens: int
) -> ResponseObject:
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
                output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
                total_tokens=result.prompt_tokens + result.output_tokens,
            ),
        }
    )
