"""OpenAI legacy completions: raw prompt(s) -> engine -> `text_completion` (whole or streamed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from app.engine.server.errors import ApiError, Dialect, bad_request
from app.engine.server.generation import (
    Completed,
    Generation,
    WaitForDisconnect,
    merged,
    start_and_collect,
)
from app.engine.server.limits import check_fan_out
from app.engine.server.logprobs import TokenTexts, completion_logprobs
from app.engine.server.prompting import Prompt
from app.engine.server.protocol.completions import CompletionChoice, CompletionRequest, CompletionResponse
from app.engine.server.protocol.openai import PromptTokensDetails, UsageInfo
from app.engine.server.serving_base import ServingContext, new_id, now, seeded
from app.engine.server.sse import DONE, data_frame

ENDPOINT = "completions"


class OpenAIServingCompletions:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self.texts = TokenTexts(ctx.engine.tokenizer)

    async def create(
        self, req: CompletionRequest, wait_for_disconnect: WaitForDisconnect | None = None
    ) -> CompletionResponse | AsyncIterator[str] | ApiError:
        try:
            prompts = await self.ctx.prompts.off_loop(self.prompts, req)
            generations = self._generations(req, prompts)
            completed = await start_and_collect(generations, req.stream, wait_for_disconnect)
        except ApiError as error:
            return error
        if completed is None:
            return self._stream(req, prompts, generations)
        return self._response(req, prompts, completed)

    def prompts(self, req: CompletionRequest) -> list[Prompt]:
        if error := self.ctx.models.check_chat(req.model):
            raise error
        unsupported = [
            (bool(req.logit_bias), "logit_bias"),
            (req.suffix is not None, "suffix"),
            (req.best_of not in (None, req.n), "best_of (other than n)"),
            (req.echo and req.logprobs is not None, "echo together with logprobs"),
        ]
        for present, name in unsupported:
            if present:
                raise bad_request(f"{name} is not supported by this server.", param=name.split(" ")[0])
        raw = req.prompt
        many = isinstance(raw, list) and bool(raw) and not all(isinstance(item, int) for item in raw)
        check_fan_out(self.ctx.settings, req.n, len(raw) if many else 1)  # before any prompt is tokenized
        if isinstance(raw, str):
            return [self.ctx.prompts.text(raw, add_special_tokens=req.add_special_tokens)]
        if not raw:
            raise bad_request("The prompt is empty.", param="prompt")
        if all(isinstance(item, int) for item in raw):
            return [self.ctx.prompts.token_ids(raw)]  # type: ignore[arg-type]
        return [self._one(item, f"prompt[{i}]", req.add_special_tokens) for i, item in enumerate(raw)]

    def _one(self, item: str | list[int], param: str, add_special_tokens: bool) -> Prompt:
        if isinstance(item, str):
            return self.ctx.prompts.text(item, add_special_tokens=add_special_tokens, param=param)
        return self.ctx.prompts.token_ids(item, param)

    def _generations(self, req: CompletionRequest, prompts: list[Prompt]) -> list[Generation]:
        generations = []
        for prompt in prompts:
            max_tokens = self.ctx.prompts.max_tokens(
                prompt, req.max_tokens, self.ctx.settings.default_max_tokens, param="prompt"
            )
            for j in range(req.n):
                try:
                    params = req.to_sampling_params(max_tokens, seeded(req.seed, j))
                except ValueError as exc:
                    raise bad_request(str(exc)) from exc
                generations.append(self.ctx.generation(prompt, params, ENDPOINT, req.user))
        return generations

    def _echo(self, req: CompletionRequest, prompt: Prompt) -> str:
        if not req.echo:
            return ""
        return prompt.text if prompt.text is not None else self.ctx.engine.tokenizer.decode(prompt.token_ids)

    def _response(
        self, req: CompletionRequest, prompts: list[Prompt], completed: list[Completed]
    ) -> CompletionResponse:
        choices = []
        for index, result in enumerate(completed):
            echo = self._echo(req, prompts[index // req.n])
            logprobs = None
            if req.logprobs is not None:
                logprobs = completion_logprobs(self.texts, result.logprobs, req.logprobs, len(echo))
            choices.append(
                CompletionChoice(
                    index=index,
                    text=echo + result.text,
                    logprobs=logprobs,
                    finish_reason=_finish_reason(result.finish_reason),
                    stop_reason=result.stop_reason,
                )
            )
        return CompletionResponse(
            id=new_id("cmpl-"),
            created=now(),
            model=req.model,
            choices=choices,
            usage=_usage(completed, req.n),
        )

    async def _stream(
        self, req: CompletionRequest, prompts: list[Prompt], generations: list[Generation]
    ) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunk_id, created = new_id("cmpl-"), now()

        def frame(choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
            chunk = CompletionResponse(
                id=chunk_id, created=created, model=req.model, choices=choices, usage=usage
            )
            return f"data: {chunk.model_dump_json(exclude=None if include_usage else {'usage'})}\n\n"

        finals = [Completed() for _ in generations]
        offsets = [0 for _ in generations]
        try:
            for index in range(len(generations)):
                if echo := self._echo(req, prompts[index // req.n]):
                    offsets[index] = len(echo)
                    yield frame([CompletionChoice(index=index, text=echo)])
            async with aclosing(merged(generations)) as outputs:
                async for index, out in outputs:
                    finals[index].add(out)
                    logprobs = None
                    if req.logprobs is not None:
                        logprobs = completion_logprobs(
                            self.texts, out.logprobs or [], req.logprobs, offsets[index]
                        )
                    offsets[index] += len(out.new_text)
                    choice = CompletionChoice(
                        index=index,
                        text=out.new_text,
                        logprobs=logprobs,
                        finish_reason=_finish_reason(out.finish_reason) if out.finished else None,
                        stop_reason=out.stop_reason if out.finished else None,
                    )
                    if out.new_text or out.finished or logprobs:
                        yield frame([choice])
            if include_usage:
                yield frame([], _usage(finals, req.n))
            yield DONE
        except ApiError as error:
            yield data_frame(error.body(Dialect.OPENAI))
            yield DONE


def _finish_reason(reason: str | None) -> str:
    return reason if reason in ("stop", "length") else "stop"


def _usage(completed: list[Completed], n: int) -> UsageInfo:
    prompt = sum(
        result.prompt_tokens for result in completed[::n]
    )  # each prompt counted once, not once per sample
    output = sum(result.output_tokens for result in completed)
    cached = sum(result.cached_tokens for result in completed[::n])
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=output,
        total_tokens=prompt + output,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )
