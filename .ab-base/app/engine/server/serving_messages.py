"""Anthropic Messages: system + turns with tool_use/tool_result blocks -> engine -> `message` or its events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from app.engine import GrammarSpec
from app.engine.server.errors import ApiError, Dialect, bad_request
from app.engine.server.generation import (
    Completed,
    Generation,
    WaitForDisconnect,
    merged,
    predictions,
    start_and_collect,
)
from app.engine.server.images import ImageCollector, anthropic_image, join_text
from app.engine.server.prompting import Prompt, function_tool, merge_system, tool_call_message
from app.engine.server.protocol.anthropic import (
    CountTokensRequest,
    CountTokensResponse,
    MessageParam,
    MessageResponse,
    MessagesRequest,
    OutputTokensDetails,
    TextBlock,
    TextBlockParam,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from app.engine.server.serving_base import ServingContext, new_id
from app.engine.server.sse import event_frame
from app.engine.server.tool_calls import (
    ParsedCall,
    ReplySplitter,
    is_channelled,
    plan_tools,
    reply_params,
    split_reply,
)
from app.engine.text.harmony import REASONING

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
            params = reply_params(self.ctx.engine.chat_template, params)
            user = req.metadata.user_id if req.metadata else None
            generation = self.ctx.generation(prompt, params, ENDPOINT, user)
            completed = await start_and_collect([generation], req.stream, wait_for_disconnect)
        except ApiError as error:
            return error
        if completed is None:
            return self._stream(req, prompt, parse_calls, generation)
        (result,) = completed
        reasoning, text, calls = split_reply(self.ctx.engine.chat_template, result.text, parse_calls)
        blocks: list[ThinkingBlock | TextBlock | ToolUseBlock] = (
            [ThinkingBlock(thinking=reasoning)] if reasoning else []
        )
        blocks += [TextBlock(text=text)] if text else []
        blocks += [ToolUseBlock(id=c.id, name=c.name, input=_input(c)) for c in calls]
        reason, sequence = _stop_reason(req, result, calls)
        return MessageResponse(
            id=new_id("msg_"),
            model=req.model,
            content=blocks,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=_usage(result, self.ctx.reasoning_tokens(result)),
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
        collected = ImageCollector()
        messages = anthropic_messages(req.system, req.messages, collected)
        images = self.ctx.load_images(collected)
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
        return self.ctx.prompts.chat(messages, plan.tools, images=images), plan.parse_calls, plan.grammar

    async def _stream(
        self, req: MessagesRequest, prompt: Prompt, parse_calls: bool, generation: Generation
    ) -> AsyncIterator[str]:
        # sent before the prefill, so before the prefix cache says what it held: message_delta has the split
        start_usage = Usage(input_tokens=len(prompt.token_ids), output_tokens=0)
        message = MessageResponse(id=new_id("msg_"), model=req.model, content=[], usage=start_usage)
        splitter = ReplySplitter(self.ctx.engine.chat_template, parse_calls)
        # A reply without channels has one text block, opened at once; a channelled one opens a
        # thinking or text block as each piece of the reply begins.
        blocks = _Blocks(eager_text=not is_channelled(self.ctx.engine.chat_template))
        final = Completed()
        try:
            yield event_frame("message_start", {"type": "message_start", "message": message.model_dump()})
            for frame in blocks.opening():
                yield frame
            yield event_frame("ping", {"type": "ping"})
            async with aclosing(merged([generation])) as outputs:
                async for _, out in outputs:
                    final.add(out)
                    for frame in blocks.write(splitter.feed(out.new_text)):
                        yield frame
            pieces, calls = splitter.finish()
            for frame in [*blocks.write(pieces), *blocks.close()]:
                yield frame
            for index, call in enumerate(calls, start=blocks.count):
                yield _block_start(index, {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
                yield _delta(index, {"type": "input_json_delta", "partial_json": json.dumps(_input(call))})
                yield event_frame("content_block_stop", {"type": "content_block_stop", "index": index})
            reason, sequence = _stop_reason(req, final, calls)
            usage = _usage(final, self.ctx.reasoning_tokens(final)).model_dump()
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
    system: str | list[TextBlockParam] | None,
    turns: list[MessageParam],
    images: ImageCollector | None = None,
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
        for message in _turn_messages(turn, i, tool_names, images):
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


def _turn_messages(
    turn: MessageParam, i: int, tool_names: dict[str, str], images: ImageCollector | None = None
) -> list[dict[str, Any]]:
    """One user or assistant turn -> its template messages (tool results first, as they answer the
    last turn); a user turn's image blocks go to `images`, IMAGE_MARK in their place."""
    if isinstance(turn.content, str):
        return [{"role": turn.role, "content": turn.content}]
    texts, calls, results = [], [], []
    for j, block in enumerate(turn.content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "image" and turn.role == "user" and images is not None:
            texts.append(images.add(anthropic_image(block, where)))
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
    return [*results, {"role": "user", "content": join_text(texts)}] if texts or not results else results


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


def _usage(result: Completed, thinking_tokens: int) -> Usage:
    # Anthropic counts prompt tokens read from the cache apart from input_tokens
    return Usage(
        input_tokens=result.prompt_tokens - result.cached_tokens,
        output_tokens=result.output_tokens,
        cache_read_input_tokens=result.cached_tokens,
        output_tokens_details=OutputTokensDetails(thinking_tokens=thinking_tokens, **predictions([result])),
    )


class _Blocks:
    """The stream's thinking and text blocks, numbered in order; a piece of another kind than the
    open block's closes it and opens the next."""

    def __init__(self, eager_text: bool) -> None:
        self.count = 0
        self._open: str | None = None
        self._eager = eager_text

    def opening(self) -> list[str]:
        return self._start("text") if self._eager else []

    def write(self, pieces: list[tuple[str, str]]) -> list[str]:
        frames = []
        for kind, text in pieces:
            block = "thinking" if kind == REASONING else "text"
            if block != self._open:
                frames += [*self._end(), *self._start(block)]
            field = {"thinking": "thinking_delta", "text": "text_delta"}[block]
            frames.append(_delta(self.count - 1, {"type": field, block: text}))
        return frames

    def close(self) -> list[str]:
        """Close the open block; a reply that said nothing still gets its (empty) text block."""
        opened = [] if self.count else self._start("text")
        return [*opened, *self._end()]

    def _end(self) -> list[str]:
        if self._open is None:
            return []
        frames = []
        if self._open == "thinking":  # unsigned: this server has no signature to give
            frames.append(_delta(self.count - 1, {"type": "signature_delta", "signature": ""}))
        frames.append(event_frame("content_block_stop", {"type": "content_block_stop", "index": self.count - 1}))
        self._open = None
        return frames

    def _start(self, block: str) -> list[str]:
        self._open, self.count = block, self.count + 1
        empty: dict[str, Any] = {"type": "text", "text": ""}
        if block == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
        return [_block_start(self.count - 1, empty)]


def _block_start(index: int, block: dict[str, Any]) -> str:
    return event_frame(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    )


def _delta(index: int, delta: dict[str, Any]) -> str:
    return event_frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
