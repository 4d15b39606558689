"""OpenAI Responses API: instructions + input items -> engine -> `response` or its event stream.

Responses are not stored, so `previous_response_id` is refused: clients send the whole
conversation as input items (function_call and function_call_output included).
`text.format` JSON modes and forced tool calls are enforced while sampling (see json_output.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from app.engine import GrammarSpec
from app.engine.server.errors import ApiError, bad_request
from app.engine.server.generation import WaitForDisconnect, start_and_collect
from app.engine.server.images import ImageCollector
from app.engine.server.json_output import json_instruction, reply_grammar
from app.engine.server.openai_messages import text_content
from app.engine.server.prompting import (
    Prompt,
    ensure_encodable,
    function_tool,
    merge_system,
    parse_arguments,
)
from app.engine.server.protocol.responses import (
    FunctionToolChoice,
    ResponseObject,
    ResponsesRequest,
    TextConfig,
)
from app.engine.server.responses_stream import (
    ResponseStream,
    finished_response,
    function_call_item,
    reply_items,
)
from app.engine.server.serving_base import ServingContext, new_id, now
from app.engine.server.tool_calls import plan_tools, reply_params, split_reply

ENDPOINT = "responses"


class OpenAIServingResponses:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(
        self, req: ResponsesRequest, wait_for_disconnect: WaitForDisconnect | None = None
    ) -> ResponseObject | AsyncIterator[str] | ApiError:
        try:
            prompt, parse_calls, grammar = await self.ctx.prompts.off_loop(self.prompt, req)
            max_tokens = self.ctx.prompts.max_tokens(
                prompt, req.max_output_tokens, self.ctx.settings.default_max_tokens, param="input"
            )
            try:
                params = req.to_sampling_params(max_tokens, self.ctx.prompts.template_stop_strings, grammar)
            except ValueError as exc:
                raise bad_request(str(exc)) from exc
            params = reply_params(self.ctx.engine.chat_template, params)
            generation = self.ctx.generation(prompt, params, ENDPOINT, req.user)
            completed = await start_and_collect([generation], req.stream, wait_for_disconnect)
        except ApiError as error:
            return error
        shell = self._shell(req, new_id("resp_"))
        if completed is None:
            template = self.ctx.engine.chat_template
            stream = ResponseStream(shell, template, parse_calls, self.ctx.reasoning_tokens)
            return stream.frames(generation)
        (result,) = completed
        reasoning, text, calls = split_reply(self.ctx.engine.chat_template, result.text, parse_calls)
        output = reply_items(reasoning, text, result)
        output += [function_call_item(call, "completed") for call in calls]
        return finished_response(shell, output, result, self.ctx.reasoning_tokens(result))

    def prompt(self, req: ResponsesRequest) -> tuple[Prompt, bool, GrammarSpec | None]:
        if error := self.ctx.models.check_chat(req.model):
            raise error
        if req.previous_response_id:
            raise bad_request(
                "previous_response_id is not supported: responses are not stored here; send the whole conversation as input.",
                param="previous_response_id",
            )
        collected = ImageCollector()
        messages = responses_messages(req, collected)
        images = self.ctx.load_images(collected)
        audio = self.ctx.load_audio(collected)
        tools = [function_tool(t.name, t.description, t.parameters) for t in req.tools or []]
        choice = req.tool_choice or "auto"
        marker = self.ctx.engine.chat_template.tool_call_start
        parallel = req.parallel_tool_calls is not False
        if isinstance(choice, FunctionToolChoice):
            plan = plan_tools(tools, "named", choice.name, call_marker=marker, parallel=parallel)
        else:
            plan = plan_tools(tools, choice, call_marker=marker, parallel=parallel)
        fmt = req.text.format if req.text else None
        wants_json = fmt is not None and fmt.type != "text"
        instructions = [
            i for i in (plan.instruction, json_instruction(fmt.json_schema) if wants_json else None) if i
        ]
        if instructions:
            messages = merge_system(messages, "\n\n".join(instructions))
        schema = fmt.json_schema if wants_json and fmt is not None else None
        grammar = reply_grammar(plan, schema, wants_json, "text.format")
        prompt = self.ctx.prompts.chat(messages, plan.tools, param="input", images=images, audio=audio)
        return prompt, plan.parse_calls, grammar

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


def responses_messages(req: ResponsesRequest, images: ImageCollector | None = None) -> list[dict[str, Any]]:
    """Instructions + input items -> the neutral template messages (see prompting.py); a
    message's `input_image` parts go to `images`.

    Text is checked here, where its place in the request is known (`input[3].content`)."""
    result: list[dict[str, Any]] = []
    if req.instructions:
        ensure_encodable(req.instructions, "instructions")
        result.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        ensure_encodable(req.input, "input")
        return [*result, {"role": "user", "content": req.input}]
    names: dict[str, str] = {}
    for i, item in enumerate(req.input):
        if item.type == "message":
            role = "system" if item.role == "developer" else item.role
            content = text_content(item.content, f"input[{i}].content", images if role == "user" else None)
            ensure_encodable(content, f"input[{i}].content")
            result.append({"role": role, "content": content})
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
            ensure_encodable(output, f"input[{i}].output")
            result.append(
                {
                    "role": "tool",
                    "tool_call_id": item.call_id,
                    "name": names.get(item.call_id, ""),
                    "content": output,
                }
            )
    return result
