"""Anthropic Messages: system + turns with tool_use/tool_result blocks -> engine -> `message` or its events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from app.engine import GrammarSpec
from app.engine.server.errors import ApiError, Dialect, bad_request
from app.engine.server.generation import Completed, Generation, WaitForDisconnect, merged, start_and_collect
from app.engine.server.prompting import Prompt, function_tool, merge_system, tool_call_message
from app.engine.server.protocol.anthropic import (
    CountTokensRequest,
    CountTokensResponse,
    MessageParam,
    MessageResponse,
    MessagesRequest,
    TextBlock,
    TextBlockParam,
    ToolUseBlock,
    Usage,
)
from app.engine.server.serving_base import ServingContext, new_id
from app.engine.server.sse import event_frame
from app.engine.server.tool_calls import ParsedCall, ToolCallSplitter, plan_tools, split_calls

ENDPOINT = "messages"


class AnthropicServingMessages:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(
        self, req: MessagesRequest, wait_for_disconnect: WaitForDisconnect | None = None
    ) -> MessageResponse | AsyncIterator[str] | ApiError:
        try:
            prompt, parse_calls, grammar = await self.ctx.prompts.off_loop(self.prompt, req)
            max_tokens = self.ctx.prompts.max_tokens(prompt, req.max_tokens, None)
            try:
                params = req.to_sampling_params(max_tokens, self.ctx.prompts.template_stop_strings, grammar)
            except ValueError as exc:
                raise bad_request(str(exc)) from exc
            user = req.metadata.user_id if req.metadata else None
            generation = self.ctx.generation(prompt, params, ENDPOINT, user)
            completed = await start_and_collect([generation], req.stream, wait_for_disconnect)
        except ApiError as error:
            return error
        if completed is None:
            return self._stream(req, prompt, parse_calls, generation)
        (result,) = completed
        text, calls = split_calls(self.ctx.engine.chat_template, result.text, parse_calls)
        blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=text)] if text else []
        blocks += [ToolUseBlock(id=c.id, name=c.name, input=_input(c)) for c in calls]
        reason, sequence = _stop_reason(req, result, calls)
        return MessageResponse(
            id=new_id("msg_"),
            model=req.model,
            content=blocks,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=_usage(result),
        )

    async def count_tokens(self, req: CountTokensRequest) -> CountTokensResponse | ApiError:
        try:
            prompt, _, _ = await self.ctx.prompts.off_loop(self.prompt, req)
        except ApiError as error:
            return error
        return CountTokensResponse(input_tokens=len(prompt.token_ids))

    def prompt(self, req: CountTokensRequest) -> tuple[Prompt, bool, GrammarSpec | None]:
        """The prompt, whether to parse tool calls, and the grammar forced tool calls are held to."""
        if error := self.ctx.models.check_chat(req.model):
            raise error
        messages = anthropic_messages(req.system, req.messages)
        tools = [function_tool(t.name, t.description, t.input_schema) for t in req.tools or []]
        choice = req.tool_choice
        kind = (
            {"auto": "auto", "any": "required", "tool": "named", "none": "none"}[choice.type]
            if choice
            else "auto"
        )
        plan = plan_tools(
            tools, kind, choice.name if choice else None,
            call_marker=self.ctx.engine.chat_template.tool_call_start,
            parallel=not (choice and choice.disable_parallel_tool_use),
        )  # fmt: skip
        if plan.instruction:
            messages = merge_system(messages, plan.instruction)
        return self.ctx.prompts.chat(messages, plan.tools), plan.parse_calls, plan.grammar

    async def _stream(
        self, req: MessagesRequest, prompt: Prompt, parse_calls: bool, generation: Generation
    ) -> AsyncIterator[str]:
        # sent before the prefill, so before the prefix cache says what it held: message_delta has the split
        start_usage = Usage(input_tokens=len(prompt.token_ids), output_tokens=0)
        message = MessageResponse(id=new_id("msg_"), model=req.model, content=[], usage=start_usage)
        splitter = ToolCallSplitter(self.ctx.engine.chat_template, parse_calls)
        final = Completed()
        try:
            yield event_frame("message_start", {"type": "message_start", "message": message.model_dump()})
            yield _block_start(0, {"type": "text", "text": ""})
            yield event_frame("ping", {"type": "ping"})
            async with aclosing(merged([generation])) as outputs:
                async for _, out in outputs:
                    final.add(out)
                    if text := splitter.feed(out.new_text):
                        yield _delta(0, {"type": "text_delta", "text": text})
            rest, calls = splitter.finish()
            if rest:
                yield _delta(0, {"type": "text_delta", "text": rest})
            yield event_frame("content_block_stop", {"type": "content_block_stop", "index": 0})
            for index, call in enumerate(calls, start=1):
                yield _block_start(index, {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
                yield _delta(index, {"type": "input_json_delta", "partial_json": json.dumps(_input(call))})
                yield event_frame("content_block_stop", {"type": "content_block_stop", "index": index})
            reason, sequence = _stop_reason(req, final, calls)
            usage = _usage(final).model_dump()
            delta = {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage,
            }
            yield event_frame("message_delta", delta)
            yield event_frame("message_stop", {"type": "message_stop"})
        except ApiError as error:
            yield event_frame("error", error.body(Dialect.ANTHROPIC))


def anthropic_messages(
    system: str | list[TextBlockParam] | None, turns: list[MessageParam]
) -> list[dict[str, Any]]:
    """Anthropic system + turns -> the neutral template messages (see prompting.py).

    `system` turns inside `messages` join the system prompt in their order; consecutive turns
    of one role become one turn, as Anthropic's API combines them (templates want alternation).
    """
    system_texts = [_block_text(system)] if system else []
    result: list[dict[str, Any]] = []
    tool_names: dict[str, str] = {}
    for i, turn in enumerate(turns):
        if turn.role == "system":
            system_texts.append(_system_turn_text(turn.content, f"messages[{i}].content"))
            continue
        for message in _turn_messages(turn, i, tool_names):
            _append_combined(result, message)
    if prompt := "\n\n".join(text for text in system_texts if text):
        result.insert(0, {"role": "system", "content": prompt})
    return result


def _block_text(content: str | list[TextBlockParam]) -> str:
    return content if isinstance(content, str) else "\n".join(block.text for block in content)


def _system_turn_text(content: str | list[Any], where: str) -> str:
    if not isinstance(content, str) and any(block.type != "text" for block in content):
        raise bad_request("A system turn may hold text blocks only.", param=where)
    return _block_text(content)


def _turn_messages(turn: MessageParam, i: int, tool_names: dict[str, str]) -> list[dict[str, Any]]:
    """One user or assistant turn -> its template messages (tool results first, as they answer the last turn)."""
    if isinstance(turn.content, str):
        return [{"role": turn.role, "content": turn.content}]
    texts, calls, results = [], [], []
    for j, block in enumerate(turn.content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use" and turn.role == "assistant":
            tool_names[block.id] = block.name
            calls.append((block.id, block.name, block.input))
        elif block.type == "tool_result" and turn.role == "user":
            results.append(_tool_result(block, tool_names.get(block.tool_use_id, ""), where))
        elif block.type in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning: nothing this engine can use
        else:
            raise bad_request(
                f"A {block.type} block is not supported in a {turn.role} turn here.", param=where
            )
    if turn.role == "assistant":
        text = "\n".join(texts)
        return [tool_call_message(calls, text) if calls else {"role": "assistant", "content": text}]
    return [*results, {"role": "user", "content": "\n".join(texts)}] if texts or not results else results


def _append_combined(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append `message`, or join its text to the last turn when both are plain turns of one role."""
    last = messages[-1] if messages else {}
    if _plain(last) and _plain(message) and last["role"] == message["role"]:
        messages[-1] = dict(last, content="\n\n".join(t for t in (last["content"], message["content"]) if t))
    else:
        messages.append(message)


def _plain(message: dict[str, Any]) -> bool:
    return message.get("role") in ("user", "assistant") and not message.get("tool_calls")


def _tool_result(block: Any, name: str, where: str) -> dict[str, Any]:
    content = block.content
    if isinstance(content, list):
        if any(part.type != "text" for part in content):
            raise bad_request("Only text is supported inside tool_result content.", param=where)
        content = "\n".join(part.text for part in content)
    text = content or ""
    if block.is_error:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "name": name, "content": text}


def _input(call: ParsedCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop_reason(req: MessagesRequest, result: Completed, calls: list[ParsedCall]) -> tuple[str, str | None]:
    if calls:
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    if isinstance(result.stop_reason, str) and result.stop_reason in (req.stop_sequences or []):
        return "stop_sequence", result.stop_reason
    return "end_turn", None


def _usage(result: Completed) -> Usage:
    # Anthropic counts prompt tokens read from the cache apart from input_tokens
    return Usage(
        input_tokens=result.prompt_tokens - result.cached_tokens,
        output_tokens=result.output_tokens,
        cache_read_input_tokens=result.cached_tokens,
    )


def _block_start(index: int, block: dict[str, Any]) -> str:
    return event_frame(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    )


def _delta(index: int, delta: dict[str, Any]) -> str:
    return event_frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
