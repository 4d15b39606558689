"""OpenAI chat completions: messages -> template -> engine -> `chat.completion` or its chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import pydantic_core

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
from app.engine.server.images import ImageCollector
from app.engine.server.json_output import check_json, json_instruction, reply_grammar
from app.engine.server.limits import check_fan_out
from app.engine.server.logprobs import TokenTexts, chat_logprobs
from app.engine.server.openai_messages import chat_messages
from app.engine.server.prompting import Prompt, function_tool, merge_system
from app.engine.server.protocol.chat import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    ChunkChoice,
    DeltaMessage,
    FunctionCallOut,
    ResponseMessage,
    ToolCallDelta,
    ToolCallOut,
)
from app.engine.server.protocol.openai import (
    CompletionTokensDetails,
    NamedToolChoice,
    PromptTokensDetails,
    UsageInfo,
)
from app.engine.server.serving_base import ServingContext, new_id, now, seeded
from app.engine.server.sse import DONE, data_frame
from app.engine.server.tool_calls import ParsedCall, ReplySplitter, plan_tools, reply_params, split_reply
from app.engine.text.harmony import REASONING

ENDPOINT = "chat"


@dataclass(frozen=True)
class ChatPlan:
    prompt: Prompt
    parse_calls: bool
    json_schema: dict[str, Any] | None
    check_json: bool
    grammar: GrammarSpec | None  # enforced tool calls / JSON


class OpenAIServingChat:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self.texts = TokenTexts(ctx.engine.tokenizer)

    async def create(
        self, req: ChatCompletionRequest, wait_for_disconnect: WaitForDisconnect | None = None
    ) -> ChatCompletionResponse | AsyncIterator[str] | ApiError:
        try:
            plan = await self.ctx.prompts.off_loop(self.plan, req)
            generations = self._generations(req, plan)
            completed = await start_and_collect(generations, req.stream, wait_for_disconnect)
        except ApiError as error:
            return error
        if completed is None:
            return self._stream(req, plan, generations)
        return self._response(req, plan, completed)

    def plan(self, req: ChatCompletionRequest) -> ChatPlan:
        if error := self.ctx.models.check_chat(req.model):
            raise error
        if req.logit_bias:
            raise bad_request("logit_bias is not supported by this server.", param="logit_bias")
        check_fan_out(self.ctx.settings, req.n)
        collected = ImageCollector()
        messages = chat_messages(req.messages, collected)
        images = self.ctx.load_images(collected)
        audio = self.ctx.load_audio(collected)
        tools = [
            function_tool(t.function.name, t.function.description, t.function.parameters)
            for t in req.tools or []
        ]
        choice = req.tool_choice or ("auto" if tools else "none")
        marker = self.ctx.engine.chat_template.tool_call_start
        parallel = req.parallel_tool_calls is not False
        if isinstance(choice, NamedToolChoice):
            tool_plan = plan_tools(
                tools, "named", choice.function.name, call_marker=marker, parallel=parallel
            )
        else:
            tool_plan = plan_tools(tools, choice, call_marker=marker, parallel=parallel)
        schema, wants_json = _json_request(req)
        instructions = [
            text for text in (tool_plan.instruction, json_instruction(schema) if wants_json else None) if text
        ]
        if instructions:
            messages = merge_system(messages, "\n\n".join(instructions))
        prompt = self.ctx.prompts.chat(
            messages,
            tool_plan.tools,
            add_generation_prompt=req.add_generation_prompt,
            template_kwargs=req.chat_template_kwargs,
            images=images,
            audio=audio,
        )
        grammar = reply_grammar(tool_plan, schema, wants_json, "response_format")
        return ChatPlan(prompt, tool_plan.parse_calls, schema, wants_json, grammar)

    def _generations(self, req: ChatCompletionRequest, plan: ChatPlan) -> list[Generation]:
        requested = req.max_completion_tokens or req.max_tokens
        max_tokens = self.ctx.prompts.max_tokens(plan.prompt, requested, self.ctx.settings.default_max_tokens)
        generations = []
        for index in range(req.n):
            try:
                params = req.to_sampling_params(
                    max_tokens, self.ctx.prompts.template_stop_strings, seeded(req.seed, index), plan.grammar
                )
            except ValueError as exc:
                raise bad_request(str(exc)) from exc
            params = reply_params(self.ctx.engine.chat_template, params)
            generations.append(self.ctx.generation(plan.prompt, params, ENDPOINT, req.user))
        return generations

    # ---- whole response --------------------------------------------------------------------

    def _response(
        self, req: ChatCompletionRequest, plan: ChatPlan, completed: list[Completed]
    ) -> ChatCompletionResponse:
        choices = []
        for index, result in enumerate(completed):
            reasoning, content, calls = split_reply(
                self.ctx.engine.chat_template, result.text, plan.parse_calls
            )
            message = ResponseMessage(
                content=content if content or not calls else None,
                reasoning_content=reasoning or None,
                tool_calls=_tool_calls(calls),
            )
            choices.append(
                ChatChoice(
                    index=index,
                    message=message,
                    logprobs=self._logprobs(req, result.logprobs),
                    finish_reason=_finish_reason(result.finish_reason, calls),
                    stop_reason=result.stop_reason,
                    json_error=check_json(content, plan.json_schema)
                    if plan.check_json and not calls
                    else None,
                )
            )
        return ChatCompletionResponse(
            id=new_id("chatcmpl-"),
            created=now(),
            model=req.model,
            choices=choices,
            usage=self._usage(completed),
        )

    def _logprobs(self, req: ChatCompletionRequest, logprobs: list[Any]) -> ChoiceLogprobs | None:
        if not req.logprobs:
            return None
        return ChoiceLogprobs(content=chat_logprobs(self.texts, logprobs, req.top_logprobs or 0))

    def _usage(self, completed: list[Completed]) -> UsageInfo:
        prompt = completed[0].prompt_tokens if completed else 0
        output = sum(result.output_tokens for result in completed)
        cached = completed[0].cached_tokens if completed else 0
        reasoning = sum(self.ctx.reasoning_tokens(result) for result in completed)
        return UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=output,
            total_tokens=prompt + output,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning, **predictions(completed)),
        )

    # ---- stream ----------------------------------------------------------------------------

    async def _stream(
        self, req: ChatCompletionRequest, plan: ChatPlan, generations: list[Generation]
    ) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunk_id, created = new_id("chatcmpl-"), now()

        def frame(choices: list[ChunkChoice], usage: UsageInfo | None = None) -> str:
            chunk = ChatCompletionChunk(
                id=chunk_id, created=created, model=req.model, choices=choices, usage=usage
            )
            return f"data: {chunk.model_dump_json(exclude=None if include_usage else {'usage'})}\n\n"

        text_frames = _TextFrames(frame)
        template = self.ctx.engine.chat_template
        splitters = [ReplySplitter(template, plan.parse_calls) for _ in generations]
        texts: list[list[str]] = [[] for _ in generations]  # each reply's content pieces, for the JSON check
        finals: list[Completed] = [Completed() for _ in generations]
        try:
            for index in range(len(generations)):
                yield frame([ChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
            async with aclosing(merged(generations)) as outputs:
                async for index, out in outputs:
                    finals[index].add(out)
                    pieces = splitters[index].feed(out.new_text)
                    logprobs = self._logprobs(req, out.logprobs or [])
                    if logprobs is None:  # a frame of text a piece, no delta models built
                        for field, text in _fields(pieces, texts, index):
                            yield text_frames.text(index, field, text)
                    else:
                        deltas = _deltas(pieces, texts, index)
                        if logprobs.content and not deltas:
                            deltas = [DeltaMessage(content="")]
                        for n, delta in enumerate(deltas):  # logprobs ride on the step's first frame
                            if n:
                                yield text_frames.of(index, delta)
                            else:
                                yield frame([ChunkChoice(index=index, delta=delta, logprobs=logprobs)])
                    if out.finished:
                        for text in self._finish(plan, index, splitters[index], texts, finals[index], frame):
                            yield text
            if include_usage:
                yield frame([], self._usage(finals))
            yield DONE
        except ApiError as error:
            yield data_frame(error.body(Dialect.OPENAI))
            yield DONE

    @staticmethod
    def _finish(
        plan: ChatPlan,
        index: int,
        splitter: ReplySplitter,
        texts: list[list[str]],
        final: Completed,
        frame: Callable[[list[ChunkChoice]], str],
    ) -> list[str]:
        """The frames that close one choice: held content, tool calls, then the finish reason."""
        pieces, calls = splitter.finish()
        frames = [frame([ChunkChoice(index=index, delta=delta)]) for delta in _deltas(pieces, texts, index)]
        if calls:
            deltas = [
                ToolCallDelta(
                    index=i,
                    id=call.id,
                    type="function",
                    function=FunctionCallOut(name=call.name, arguments=call.arguments),
                )
                for i, call in enumerate(calls)
            ]
            frames.append(frame([ChunkChoice(index=index, delta=DeltaMessage(tool_calls=deltas))]))
        json_error = check_json("".join(texts[index]), plan.json_schema) if plan.check_json and not calls else None
        last = ChunkChoice(
            index=index,
            delta=DeltaMessage(),
            finish_reason=_finish_reason(final.finish_reason, calls),
            stop_reason=final.stop_reason,
            json_error=json_error,
        )
        frames.append(frame([last]))
        return frames


class _TextFrames:
    """A stream's frames of one delta of text, made by splicing the text into the frame the pydantic models
    give for a marker text (rendered once per choice and field): the same bytes as `frame`, without three
    models built and serialized for every token, which at 128 streams was a fifth of the event loop's work."""

    _MARK = "\u0000paddock-text\u0000"

    def __init__(self, frame: Callable[[list[ChunkChoice]], str]) -> None:
        self._frame = frame
        self._parts: dict[tuple[int, str], tuple[str, str]] = {}

    def of(self, index: int, delta: DeltaMessage) -> str:
        field, text = ("content", delta.content) if delta.reasoning_content is None else (
            "reasoning_content", delta.reasoning_content)  # fmt: skip
        if text is None or delta.role is not None or delta.tool_calls is not None:
            return self._frame([ChunkChoice(index=index, delta=delta)])
        return self.text(index, field, text)

    def text(self, index: int, field: str, text: str) -> str:
        """The frame of a delta of `text` in `field` ("content" or "reasoning_content") for choice `index`."""
        parts = self._parts.get((index, field))
        if parts is None:
            marked = self._frame([ChunkChoice(index=index, delta=DeltaMessage(**{field: self._MARK}))])
            prefix, _, suffix = marked.partition(pydantic_core.to_json(self._MARK).decode())
            parts = self._parts[(index, field)] = (prefix, suffix)
        return f"{parts[0]}{pydantic_core.to_json(text).decode()}{parts[1]}"


def _fields(pieces: list[tuple[str, str]], texts: list[list[str]], index: int) -> list[tuple[str, str]]:
    """The delta field of each piece of the reply: reasoning as `reasoning_content`, the rest as content
    (kept in `texts` for the JSON check)."""
    out = []
    for kind, text in pieces:
        if kind == REASONING:
            out.append(("reasoning_content", text))
        else:
            texts[index].append(text)
            out.append(("content", text))
    return out


def _deltas(pieces: list[tuple[str, str]], texts: list[list[str]], index: int) -> list[DeltaMessage]:
    """One delta per piece of the reply (`_fields`)."""
    return [DeltaMessage(**{field: text}) for field, text in _fields(pieces, texts, index)]


def _json_request(req: ChatCompletionRequest) -> tuple[dict[str, Any] | None, bool]:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None, False
    if fmt.type == "json_object":
        return None, True
    if fmt.json_schema is None:
        raise bad_request(
            "response_format of type json_schema needs a 'json_schema' object.", param="response_format"
        )
    return fmt.json_schema.json_schema, True


def _tool_calls(calls: list[ParsedCall]) -> list[ToolCallOut]:
    return [ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments)) for c in calls]


def _finish_reason(reason: str | None, calls: list[ParsedCall]) -> Any:
    if calls:
        return "tool_calls"
    return reason if reason in ("stop", "length") else "stop"
