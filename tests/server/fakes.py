"""A small deterministic engine, tokenizer, chat template and embedder that honour the real protocols.

The fake "model" reads the rendered prompt and answers by rule, one character per
token, so every count a test checks can be derived by hand:
  - a prompt containing "forever": "tick " repeated, slowly, until max_tokens (disconnect tests);
  - a prompt containing "batch-together": waits until `batch_barrier` requests are generating at once;
  - a prompt containing "explode": the engine fails after three tokens;
  - while `prefill_gate` is set and not open, every request is held in its "prefill" (running, no token yet);
  - tools rendered and the last turn a user turn: "Let me check. " + one <tool_call> for the first tool;
  - the last turn a tool result: "The tool says: <result>";
  - "JSON" in the prompt: '{"answer": 42}';
  - otherwise "Echo: <the last turn's text>".
The answer ends with EOS (counted as a generated token with no text, as vLLM counts it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from app.engine.interface import ContextOverflowError, EngineStats, GenerationRequest, ModelInfo
from app.engine.request import RequestOutput, TokenLogprob

SPECIALS = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
CHAR_OFFSET = 16
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class FakeTokenizer:
    """One token per character; the special tokens (`specials`, ids from 0) are parsed from text when asked."""

    vocab_size = CHAR_OFFSET + 0x110000
    bos_token_id: int | None = 1
    eos_token_id = 2
    eos_token_ids = frozenset({2})
    specials: list[str] = SPECIALS
    special_re = _SPECIAL_RE

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        ids = [self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []
        pieces = self.special_re.split(text) if parse_special else [text]
        for piece in pieces:
            if parse_special and piece in self.specials:
                ids.append(self.specials.index(piece))
            else:
                ids.extend(CHAR_OFFSET + ord(c) for c in piece)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("" if (i < CHAR_OFFSET and skip_special_tokens) else self.id_to_token(i) for i in ids)

    def token_to_id(self, token: str) -> int | None:
        if token in self.specials:
            return self.specials.index(token)
        return CHAR_OFFSET + ord(token) if len(token) == 1 else None

    def id_to_token(self, token_id: int) -> str:
        if token_id < CHAR_OFFSET:
            return self.specials[token_id] if token_id < len(self.specials) else f"<unused{token_id}>"
        return chr(token_id - CHAR_OFFSET)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


class FakeChatTemplate:
    stop_strings = ("<end_of_turn>",)
    tool_call_start = "<tool_call>"
    _CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **extra,
    ) -> str:
        out = "<bos>"
        if tools:
            out += f"<start_of_turn>system\nTools: {json.dumps(tools, sort_keys=True)}<end_of_turn>\n"
        for message in messages:
            role = message["role"]
            if role not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"unknown role {role!r}")
            body = message.get("content") or ""
            for call in message.get("tool_calls") or []:
                function = call["function"]
                body += f"<tool_call>{json.dumps({'name': function['name'], 'arguments': function['arguments']})}</tool_call>"
            out += f"<start_of_turn>{role}\n{body}<end_of_turn>\n"
        if add_generation_prompt:
            out += "<start_of_turn>assistant\n"
        return out

    def parse_tool_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        calls = []
        for n, match in enumerate(self._CALL_RE.finditer(text)):
            try:
                payload = json.loads(match.group(1))
            except json.JSONDecodeError:
                continue
            calls.append(ToolCall(f"call_{n}", payload["name"], json.dumps(payload.get("arguments", {}))))
        return self._CALL_RE.sub("", text).strip(), calls


def last_turn(prompt: str) -> tuple[str, str]:
    """(role, text) of the last non-empty turn, or ("raw", prompt) when the prompt has no turns."""
    turns = re.findall(r"<start_of_turn>(\w+)\n(.*?)(?:<end_of_turn>|$)", prompt, re.DOTALL)
    turns = [(role, text) for role, text in turns if text.strip()]
    if not turns:
        return "raw", _SPECIAL_RE.sub("", prompt)
    return turns[-1]


def scripted_answer(prompt: str) -> str:
    role, text = last_turn(prompt)
    if "JSON" in prompt:
        return '{"answer": 42}'
    tools = re.search(r"Tools: (\[.*?\])<end_of_turn>", prompt, re.DOTALL)
    if tools and role == "user":
        name = json.loads(tools.group(1))[0]["function"]["name"]
        call = json.dumps({"name": name, "arguments": {"city": "Paris"}})
        return f"Let me check. <tool_call>{call}</tool_call>"
    if role == "tool":
        return f"The tool says: {text}"
    return f"Echo: {text[:200]}"


class MarkupTokenizer(FakeTokenizer):
    """One token per character plus a reply format's markers as special tokens (`specials`, ids from 0), no
    BOS; `ends` are the end-of-generation markers, the first of them the EOS id."""

    bos_token_id = None

    def __init__(self, specials: list[str], ends: tuple[str, ...]) -> None:
        self.specials = specials
        self.special_re = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
        self.eos_token_id = specials.index(ends[0])
        self.eos_token_ids = frozenset(specials.index(end) for end in ends)


BARRIER_SECONDS = 120  # how long "batch-together" requests wait for the rest of their batch


@dataclass
class FakeEngine:
    context_length: int = 2048
    name: str = "fake-model"
    token_delay: float = 0.0  # seconds between tokens (0: just yield to the loop)
    slow_delay: float = 0.02  # per token for "forever" prompts
    batch_barrier: int = 16
    prefill_gate: threading.Event | None = None  # set by a test thread to end every held prefill
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    chat_template: FakeChatTemplate = field(default_factory=FakeChatTemplate)
    requests: list[GenerationRequest] = field(default_factory=list)
    aborted: set[str] = field(default_factory=set)
    closed_early: set[str] = field(default_factory=set)
    active: int = 0
    max_active: int = 0
    last_active: int = 0
    finished: int = 0

    @property
    def model(self) -> ModelInfo:
        return ModelInfo(
            self.name, "/fake", "fake", "mixed (FP8_E4M3, Q4_K, F32)", 1000, self.context_length, "cpu",
            quant_mix=(("FP8_E4M3", 7), ("Q4_K", 3), ("F32", 2)),
        )  # fmt: skip

    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        params = request.sampling_params
        n_prompt = len(request.prompt_token_ids)
        if params.max_tokens is not None and n_prompt + params.max_tokens > self.context_length:
            raise ContextOverflowError(n_prompt, params.max_tokens, self.context_length)
        self.requests.append(request)
        prompt = self.tokenizer.decode(request.prompt_token_ids)
        plan = self._plan(prompt, params)
        self.active += 1
        done = False
        try:
            while self.prefill_gate is not None and not self.prefill_gate.is_set():
                await asyncio.sleep(0.002)
            if "batch-together" in prompt:
                give_up = time.monotonic() + BARRIER_SECONDS  # a failure that names the count, not a hang
                while self.active < self.batch_barrier:
                    if time.monotonic() > give_up:
                        raise RuntimeError(f"only {self.active} of {self.batch_barrier} requests ever ran at once")
                    await asyncio.sleep(0.001)
            for index, (token_id, text, finish, stop_reason) in enumerate(plan):
                if "explode" in prompt and index == 3:
                    raise RuntimeError("simulated engine failure")
                self.last_active = self.active
                self.max_active = max(self.max_active, self.active)
                await asyncio.sleep(self.slow_delay if "forever" in prompt else self.token_delay)
                logprobs = None
                if params.logprobs is not None:
                    top = ((token_id, -0.25), (CHAR_OFFSET + ord("?"), -1.75), (CHAR_OFFSET + ord("!"), -2.5))
                    logprobs = [TokenLogprob(token_id, -0.25, top[: params.logprobs])]
                done = finish is not None
                yield RequestOutput(
                    request_id=request.request_id,
                    new_token_ids=[token_id],
                    new_text=text,
                    logprobs=logprobs,
                    finished=done,
                    finish_reason=finish,
                    stop_reason=stop_reason,
                    num_prompt_tokens=n_prompt,
                    num_output_tokens=index + 1,
                )
        finally:
            self.active -= 1
            if done:
                self.finished += 1
            else:
                self.closed_early.add(request.request_id)

    def _plan(self, prompt: str, params) -> list[tuple[int, str, str | None, str | int | None]]:
        """(token id, visible text, finish reason, stop reason) per generated token."""
        limit = params.max_tokens or (self.context_length - 1)
        answer = "tick " * limit if "forever" in prompt else scripted_answer(prompt)
        while len(answer) < params.min_tokens or (params.ignore_eos and len(answer) < limit):
            answer += " more"
        cut, stop_hit = len(answer), None
        for stop in params.stop:
            at = answer.find(stop)
            if at >= 0 and at + len(stop) <= cut:
                cut, stop_hit = at + len(stop), stop
        stopped = stop_hit is not None and cut <= limit
        n_tokens = min(cut, limit)
        visible = answer[:n_tokens]
        if stopped and not params.include_stop_str_in_output:
            visible = answer[: cut - len(stop_hit)]
        plan = [
            (CHAR_OFFSET + ord(c), visible[i] if i < len(visible) else "", None, None)
            for i, c in enumerate(answer[:n_tokens])
        ]
        if stopped:
            plan[-1] = (*plan[-1][:2], "stop", stop_hit)
        elif n_tokens < limit and not params.ignore_eos:
            plan.append((self.tokenizer.eos_token_id, "", "stop", None))
        else:
            plan[-1] = (*plan[-1][:2], "length", None)
        return plan

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            requests_running=self.active,
            requests_waiting=0,
            kv_blocks_used=self.active,
            kv_blocks_total=64,
            last_batch_size=self.last_active,
            max_batch_size_seen=self.max_active,
            prompt_tokens_total=0,
            generation_tokens_total=0,
            requests_finished_total=self.finished,
        )

    async def shutdown(self) -> None:
        pass


class FakeEmbedder:
    """Deterministic unit vectors from a hash of the text; one token per character."""

    model_name = "fake-embed"
    dimensions = 8
    max_tokens = 256

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(text) for text in texts]

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            row = np.random.default_rng(seed).standard_normal(self.dimensions).astype(np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.stack(rows)


@dataclass
class ToolTurnEngine(FakeEngine):
    """Replies in a model's own markup: `call_reply` when tools are offered (`tools_mark` in the prompt) and the
    user spoke last, else `answer_reply`; the prompt's last user turn starts at `user_mark`, a tool's result at
    `result_mark`. A reply's last token is its stop token: counted, not printed."""

    call_reply: str = ""
    answer_reply: str = ""
    tools_mark: str = ""
    user_mark: str = ""
    result_mark: str = ""

    def _plan(self, prompt: str, params) -> list[tuple[int, str, str | None, str | int | None]]:
        after_tool = prompt.rfind(self.result_mark) > prompt.rfind(self.user_mark)
        reply = self.call_reply if self.tools_mark in prompt and not after_tool else self.answer_reply
        ids = self.tokenizer.encode(reply)
        plan = [(i, self.tokenizer.decode([i], params.skip_special_tokens), None, None) for i in ids[:-1]]
        return [*plan, (ids[-1], "", "stop", None)]
