"""`/tokenize` and `/detokenize`: the loaded model's tokenizer, and its chat template, over HTTP."""

from __future__ import annotations

from app.engine.server.errors import ApiError, bad_request
from app.engine.server.openai_messages import chat_messages
from app.engine.server.prompting import function_tool
from app.engine.server.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from app.engine.server.serving_base import ServingContext


class ServingTokenization:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    def tokenize(self, req: TokenizeRequest) -> TokenizeResponse | ApiError:
        try:
            if error := self.ctx.models.check_chat(req.model):
                raise error
            if req.prompt is not None:
                prompt = self.ctx.prompts.text(req.prompt, add_special_tokens=req.add_special_tokens)
            else:
                tools = [
                    function_tool(t.function.name, t.function.description, t.function.parameters)
                    for t in req.tools or []
                ]
                prompt = self.ctx.prompts.chat(
                    chat_messages(req.messages or []),
                    tools,
                    add_generation_prompt=req.add_generation_prompt,
                    template_kwargs=req.chat_template_kwargs,
                )
        except ApiError as error:
            return error
        tokenizer = self.ctx.engine.tokenizer
        return TokenizeResponse(
            count=len(prompt.token_ids),
            max_model_len=self.ctx.prompts.context_length,
            tokens=prompt.token_ids,
            token_strs=[tokenizer.id_to_token(i) for i in prompt.token_ids]
            if req.return_token_strs
            else None,
        )

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse | ApiError:
        if error := self.ctx.models.check_chat(req.model):
            return error
        vocab = self.ctx.engine.tokenizer.vocab_size
        bad = next((i for i in req.tokens if not 0 <= i < vocab), None)
        if bad is not None:
            return bad_request(f"Token id {bad} is outside the vocabulary (0..{vocab - 1}).", param="tokens")
        return DetokenizeResponse(prompt=self.ctx.engine.tokenizer.decode(req.tokens))
