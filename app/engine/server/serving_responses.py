"""OpenAI Responses API: instructions + input items -> engine -> `response` or its event stream.

Responses are not stored, so `previous_response_id` is refused: clients send the whole
conversation as input items (function_call and function_call_output included).
`text.format` JSON modes are asked for in the prompt only (see json_output.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from app.engine.server.errors import ApiError, bad_request
from app.engine.server.generation import ClientGone, Completed, Generation, WaitForDisconnect, collect, merged
from app.engine.server.json_output import json_instruction
from app.engine.server.prompting import Prompt, function_tool, merge_system, parse_arguments
from app.engine.server.protocol.responses import (
    FunctionToolChoice,
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
)
from app.engine.server.serving_base import ServingContext, new_id, now
from app.engine.server.serving_chat import text_content
from app.engine.server.sse import event_frame
from app.engine.server.tool_calls import ParsedCall, ToolCallSplitter, plan_tools, split_calls

ENDPOINT = "responses"


class OpenAIServingResponses:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(
        self, req: ResponsesRequest, wait_for_disconnect: WaitForDisconnect | None = None
    ) -> ResponseObject | AsyncIterator[str] | ApiError:
        try:
            prompt, parse_calls = self.prompt(req)
            max_tokens = self.ctx.prompts.max_tokens(
                prompt, req.max_output_tokens, self.ctx.settings.default_max_tokens
            )
            try:
                params = req.to_sampling_params(max_tokens, self.ctx.prompts.template_stop_strings)
            except ValueError as exc:
                raise bad_request(str(exc)) from exc
            generation = self.ctx.generation(prompt, params, ENDPOINT, req.user)
            await generation.start()
        except ApiError as error:
            return error
        shell = self._shell(req, new_id("resp_"))
        if req.stream:
            return _ResponseStream(shell, self.ctx.engine.chat_template, parse_calls).frames(generation)
        try:
            (result,) = await collect([generation], wait_for_disconnect)
        except ApiError as error:
            return error
        except ClientGone:
            return ApiError(499, "Client closed the request.")
        text, calls = split_calls(self.ctx.engine.chat_template, result.text, parse_calls)
        output: list[Any] = [_message(text, result)] if text else []
        output += [_function_call(call, "completed") for call in calls]
        return _finished(shell, output, result)

    def prompt(self, req: ResponsesRequest) -> tuple[Prompt, bool]:
        if error := self.ctx.models.check_chat(req.model):
            raise error
        if req.previous_response_id:
            raise bad_request(
                "previous_response_id is not supported: responses are not stored here; send the whole conversation as input.",
                param="previous_response_id",
            )
        messages = responses_messages(req)
        tools = [function_tool(t.name, t.description, t.parameters) for t in req.tools or []]
        choice = req.tool_choice or "auto"
        if isinstance(choice, FunctionToolChoice):
            plan = plan_tools(tools, "named", choice.name)
        else:
            plan = plan_tools(tools, choice)
        fmt = req.text.format if req.text else None
        wants_json = fmt is not None and fmt.type != "text"
        instructions = [
            i for i in (plan.instruction, json_instruction(fmt.json_schema) if wants_json else None) if i
        ]
        if instructions:
            messages = merge_system(messages, "\n\n".join(instructions))
        return self.ctx.prompts.chat(messages, plan.tools), plan.parse_calls

    @staticmethod
    def _shell(req: ResponsesRequest, response_id: str) -> ResponseObject:
        """The response as it is before any output: what `response.created` carries."""
        return ResponseObject(
            id=response_id,
            created_at=now(),
            status="in_progress",
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=req.model,
            output=[],
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            tool_choice=req.tool_choice or "auto",
            tools=req.tools or [],
            text=req.text or TextConfig(),
            metadata=req.metadata or {},
            user=req.user,
        )


def responses_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """Instructions + input items -> the neutral template messages (see prompting.py)."""
    result: list[dict[str, Any]] = (
        [{"role": "system", "content": req.instructions}] if req.instructions else []
    )
    if isinstance(req.input, str):
        return [*result, {"role": "user", "content": req.input}]
    names: dict[str, str] = {}
    for i, item in enumerate(req.input):
        if item.type == "message":
            role = "system" if item.role == "developer" else item.role
            result.append({"role": role, "content": text_content(item.content, f"input[{i}].content")})
        elif item.type == "function_call":
            names[item.call_id] = item.name
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {
                    "name": item.name,
                    "arguments": parse_arguments(item.arguments, f"input[{i}].arguments"),
                },
            }
            if result and result[-1]["role"] == "assistant":
                result[-1].setdefault("tool_calls", []).append(call)
            else:
                result.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item.type == "function_call_output":
            output = (
                item.output
                if isinstance(item.output, str)
                else text_content(item.output, f"input[{i}].output")
            )
            result.append(
                {
                    "role": "tool",
                    "tool_call_id": item.call_id,
                    "name": names.get(item.call_id, ""),
                    "content": output,
                }
            )
    return result


def _message(text: str, result: Completed | None, item_id: str | None = None) -> OutputMessage:
    status = "incomplete" if result is not None and result.finish_reason == "length" else "completed"
    return OutputMessage(id=item_id or new_id("msg_"), status=status, content=[OutputText(text=text)])


def _function_call(call: ParsedCall, status: str, item_id: str | None = None) -> OutputFunctionCall:
    arguments = call.arguments if status == "completed" else ""
    return OutputFunctionCall(
        id=item_id or new_id("fc_"), call_id=call.id, name=call.name, arguments=arguments, status=status
    )


def _finished(shell: ResponseObject, output: list[Any], result: Completed) -> ResponseObject:
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


class _ResponseStream:
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
                message = _message(self.text, final, self.message_id)
                output.append(message)
                for frame in self.close_message(message):
                    yield frame
            for call in calls:
                item = _function_call(call, "completed")
                for frame in self.function_call(len(output), item):
                    yield frame
                output.append(item)
            response = _finished(self.shell, output, final)
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
