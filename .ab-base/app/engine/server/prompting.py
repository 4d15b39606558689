"""From protocol messages to prompt token ids: chat template, tokenizer, context limit.

Every protocol converts its messages to one neutral list of dicts first (OpenAI chat
shape, with tool-call arguments as parsed objects as Hugging Face templates expect):
  {"role": "system" | "user" | "assistant" | "tool", "content": str,
   "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": dict}}],
   "tool_call_id": str, "name": str}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from app.engine import ContextOverflowError
from app.engine.models.vision.splice import image_spans
from app.engine.server import limits
from app.engine.server.errors import ApiError, bad_request, context_overflow
from app.engine.server.images import AUDIO_MARK, IMAGE_MARK
from app.engine.server.prompt_prefix import PromptPrefixes
from app.engine.server.turn_memory import DEFAULT_TURNS, NO_REUSE, TurnMemory
from app.engine.server.volatile_parts import strip_volatile
from app.engine.text.template_sandbox import SlowRender, quick_lane

if TYPE_CHECKING:
    from app.engine import EngineClient

T = TypeVar("T")
log = logging.getLogger(__name__)

# Unicode composition (NFC/NFKC, which some tokenizers apply first) joins at most 4 code points
# into one (U+1F82 decomposes to 4), so normalized text is at least a quarter of the raw length.
NORMALIZATION_SHRINK = 4
DEFAULT_PROMPT_WORKERS = 4
# A template render on the quick workers that takes longer moves to the slow ones (PromptBuilder.off_loop).
# Real templates render a long agent conversation in milliseconds.
QUICK_RENDER_SECONDS = 0.1


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    text: str | None = None  # None when the client sent token ids
    images: tuple[Any, ...] = ()  # ImageInput per run of image tokens, in order
    remembered: bool = False  # a chat prompt: its ids and the answer's go to the turn memory


class PromptBuilder:
    """Template rendering and tokenization; `off_loop` runs them on a bounded pool of worker threads."""

    def __init__(
        self,
        engine: EngineClient,
        workers: int = DEFAULT_PROMPT_WORKERS,
        remembered_turns: int = DEFAULT_TURNS,
        strip_volatile_metadata: bool = True,
    ) -> None:
        self._engine = engine
        self._workers = anyio.CapacityLimiter(workers)
        self._slow_workers = anyio.CapacityLimiter(max(1, workers // 4))
        self._remembered_turns = remembered_turns
        self._memory: TurnMemory | None = None
        self._prefixes: PromptPrefixes | None = None
        self._strip_volatile = strip_volatile_metadata
        self._told_stripped = False

    async def off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """Run CPU-heavy request work (templates, tokenizers) where it cannot stall the event loop.

        Two lanes: work starts on the quick workers, where a template render may take QUICK_RENDER_SECONDS;
        one that takes longer (a hostile template exploding on this input, or a huge conversation) is
        stopped and run again from the start on the slow workers (a quarter as many: one by default, so
        renders that spin hold the interpreter lock in one thread at most), under the template's full
        limits. Renders that explode thus hold a quick worker for a tenth of a second each, not the 2 s
        limit: 16 of them made a normal request wait 7.9 s behind them, all four workers busy."""
        try:
            return await anyio.to_thread.run_sync(_quick, work, *args, limiter=self._workers)
        except SlowRender:
            log.info("a chat template render took over %.2f s: moved to the slow lane", QUICK_RENDER_SECONDS)
            return await anyio.to_thread.run_sync(work, *args, limiter=self._slow_workers)

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token's piece spells (byte tokens' `<0xAB>` count 6: an overestimate)."""
        tokenizer = self._engine.tokenizer
        known = getattr(tokenizer, "max_token_chars", None)
        if known is not None:
            return int(known)
        return max(len(tokenizer.id_to_token(i)) for i in range(tokenizer.vocab_size))

    def check_length(self, text: str, param: str) -> None:
        """Refuse, without tokenizing, a text too long for the context whatever its tokens.

        Sound: each token covers at most `max_token_chars` characters of the normalized text, which
        is at least 1/NORMALIZATION_SHRINK of the raw text, so the text has at least
        len(text) / (max_token_chars * NORMALIZATION_SHRINK) tokens. (A tokenizer.json whose
        normalizer deletes characters, as BERT's does, is outside this bound; decoder models' are not.)
        """
        bound = self.context_length * self.max_token_chars * NORMALIZATION_SHRINK
        if len(text) > bound:
            raise ApiError(
                400,
                f"The prompt in '{param}' has {len(text)} characters, more than {self.context_length} tokens of "
                f"context can hold (at most {bound} characters for this tokenizer); it was refused before tokenizing.",
                param=param,
                code="context_length_exceeded",
            )

    @property
    def context_length(self) -> int:
        return self._engine.model.context_length

    @property
    def vision(self) -> Any:
        """The engine's ImagePrompter, or None for a model without vision."""
        return getattr(self._engine, "vision", None)

    @property
    def audio(self) -> Any:
        """The engine's audio prompter (Gemma 4 with audio), or None for a model without audio."""
        return getattr(self._engine, "audio", None)

    @property
    def template_stop_strings(self) -> list[str]:
        return list(getattr(self._engine.chat_template, "stop_strings", ()) or ())

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        param: str = "messages",
        images: list[Any] | None = None,
        audio: list[Any] | None = None,
    ) -> Prompt:
        """The prompt of these messages; `images` (PreparedImages, from `load_images`) replace the
        IMAGE_MARKs the conversion left in the messages' text, in order, and `audio` (clips, from
        `load_audio`) its AUDIO_MARKs."""
        for index, message in enumerate(messages):
            ensure_encodable(message.get("content") or "", f"{param}[{index}].content")
        if self._strip_volatile:  # after the check: its errors name the messages as the client sent them
            messages = self._without_volatile(messages)
        try:
            text = self._engine.chat_template.render(
                messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **(template_kwargs or {}),
            )
        except (ApiError, SlowRender):
            raise
        except (
            Exception
        ) as exc:  # template errors are the client's conversation breaking the template's rules
            raise bad_request(
                f"The chat template could not render these messages: {exc}", param=param
            ) from exc
        self.check_length(text, "messages")
        views: tuple[Any, ...] = ()
        if images or IMAGE_MARK in text:
            text, views = self._with_images(text, images or [], param)
        clips = tuple(audio or ())
        if clips or AUDIO_MARK in text:
            text = self._with_audio(text, list(clips), param)
        if views or clips:
            ids = self._encode(text)
            for prompter, count, kind in (
                (self.vision, len(views), "image"),
                (self.audio, len(clips), "audio"),
            ):
                if count and len(image_spans(ids, prompter.image_token_id)) != count:
                    raise bad_request(
                        f"The messages' text holds the {kind} token itself; it stands only for the {count} "
                        f"{kind}{'s' * (kind == 'image')} sent.",
                        param=param,
                    )
            return Prompt(ids, text, views + clips)
        memory = self._turn_memory()
        reuse = memory.reuse(text) if memory is not None else NO_REUSE
        prefixes = self._prompt_prefixes(memory)
        shared = prefixes.reuse(text) if prefixes is not None else NO_REUSE
        if shared.num_chars > reuse.num_chars:
            reuse = shared
        if not reuse.num_chars:
            ids = self._encode(text)
        else:
            rest = self._engine.tokenizer.encode(
                text[reuse.num_chars :], add_special_tokens=False, parse_special=True
            )
            ids = reuse.token_ids + rest
        if prefixes is not None:
            prefixes.remember(text, ids)
        return Prompt(ids, text, remembered=memory is not None)

    def _without_volatile(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages without the lines clients change on every request (volatile_parts.py), logged:
        at info the first time, so a user sees it happens and how to keep them, then at debug."""
        stripped = strip_volatile(messages)
        if stripped.removed:
            level = logging.DEBUG if self._told_stripped else logging.INFO
            self._told_stripped = True
            log.log(
                level,
                "removed from the system prompt, so the prefix cache can hit (--keep-volatile-metadata keeps "
                "it): %s",
                "; ".join(stripped.removed),
            )
        return stripped.messages

    def _encode(self, text: str) -> list[int]:
        """A rendered prompt's ids: the tokenizer's BOS unless the template wrote it."""
        tokenizer = self._engine.tokenizer
        bos = tokenizer.id_to_token(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else None
        starts_with_bos = bool(bos) and text.startswith(bos)
        return tokenizer.encode(text, add_special_tokens=not starts_with_bos, parse_special=True)

    def _turn_memory(self) -> TurnMemory | None:
        """The memory of the loaded tokenizer's turns (a new model starts an empty one); None when off
        or where ids cannot be spliced (no per-token bytes, or an EOS the tokenizer appends to every prompt)."""
        tokenizer = self._engine.tokenizer
        if not self._remembered_turns or getattr(tokenizer, "add_eos", False):
            return None
        try:
            tokenizer.token_bytes(0)
        except (ValueError, AttributeError):
            return None
        memory = self._memory
        if memory is None or memory.tokenizer is not tokenizer:
            memory = self._memory = TurnMemory(tokenizer, self._remembered_turns)
        return memory

    def _prompt_prefixes(self, memory: TurnMemory | None) -> PromptPrefixes | None:
        """The loaded tokenizer's recent prompts (prompt_prefix.py), where turn memory is on: the same
        conditions make ids splicable."""
        if memory is None:
            return None
        prefixes = self._prefixes
        if prefixes is None or prefixes.tokenizer is not memory.tokenizer:
            prefixes = self._prefixes = PromptPrefixes(memory.tokenizer)
        return prefixes

    def remember(self, prompt: Prompt, output_ids: list[int]) -> None:
        """Keep a finished chat request's ids for the next turn to reuse (turn_memory.py)."""
        memory = self._memory
        if (
            prompt.remembered
            and prompt.text
            and memory is not None
            and memory.tokenizer is self._engine.tokenizer
        ):
            memory.remember(prompt.text, prompt.token_ids, output_ids)

    def _with_images(self, text: str, images: list[Any], param: str) -> tuple[str, tuple[Any, ...]]:
        prompter = self.vision
        try:
            if prompter is None:
                raise ValueError("the loaded model has no vision")
            expanded = prompter.expand(text, images, marker=IMAGE_MARK)
        except ValueError as exc:
            raise bad_request(f"The images could not be placed in the prompt: {exc}.", param=param) from exc
        return expanded, tuple(prompter.views(images))

    def _with_audio(self, text: str, clips: list[Any], param: str) -> str:
        prompter = self.audio
        try:
            if prompter is None:
                raise ValueError("the loaded model has no audio input")
            return prompter.expand(text, clips, marker=AUDIO_MARK)
        except ValueError as exc:
            raise bad_request(f"The audio could not be placed in the prompt: {exc}.", param=param) from exc

    def text(self, text: str, *, add_special_tokens: bool = True, param: str = "prompt") -> Prompt:
        ensure_encodable(text, param)
        self.check_length(text, param)
        return Prompt(
            self._engine.tokenizer.encode(text, add_special_tokens=add_special_tokens, parse_special=True),
            text,
        )

    def token_ids(self, ids: list[int], param: str = "prompt") -> Prompt:
        vocab = self._engine.tokenizer.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise bad_request(f"Token id {bad} is outside the vocabulary (0..{vocab - 1}).", param=param)
        if not ids:
            raise bad_request("The prompt is empty.", param=param)
        return Prompt(list(ids))

    def max_tokens(
        self, prompt: Prompt, requested: int | None, default: int | None, param: str = "messages"
    ) -> int:
        """The output budget: a request's own limit must fit (never trimmed); a default is clamped to the room left.
        An overflow names `param`, the request field that holds the prompt."""
        room = self.context_length - len(prompt.token_ids)
        if requested is not None:
            if requested > room:
                raise context_overflow(
                    ContextOverflowError(len(prompt.token_ids), requested, self.context_length), param
                )
            return requested
        if room < 1:
            raise context_overflow(ContextOverflowError(len(prompt.token_ids), 1, self.context_length), param)
        return room if default is None else min(default, room)


def _quick(work: Callable[..., T], *args: Any) -> T:
    with quick_lane(QUICK_RENDER_SECONDS):
        return work(*args)


def ensure_encodable(text: str, param: str) -> None:
    """Lone surrogates (legal in JSON escapes, not in UTF-8) would break the tokenizer: refuse them clearly."""
    try:
        limits.ensure_encodable(text, param)
    except ValueError as exc:
        raise bad_request(f"{exc}.", param=param) from exc


def parse_arguments(arguments: str, param: str) -> dict[str, Any]:
    """Tool-call arguments arrive as a JSON string; templates want the object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
        limits.check_json_value(value, param)
    except json.JSONDecodeError as exc:
        raise bad_request(f"'{param}' is not valid JSON: {exc.msg}.", param=param) from exc
    except RecursionError as exc:
        raise bad_request(
            f"'{param}' is nested more than {limits.MAX_JSON_DEPTH} levels deep.", param=param
        ) from exc
    except ValueError as exc:
        raise bad_request(f"{exc}.", param=param) from exc
    if not isinstance(value, dict):
        raise bad_request(f"'{param}' must be a JSON object.", param=param)
    return value


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The tool shape chat templates render (OpenAI's)."""
    function: dict[str, Any] = {
        "name": name,
        "parameters": parameters or {"type": "object", "properties": {}},
    }
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def tool_call_message(
    calls: list[tuple[str, str, dict[str, Any]]], content: str | None = None
) -> dict[str, Any]:
    """An assistant turn that called tools: (id, name, arguments) each."""
    return {
        "role": "assistant",
        "content": content or "",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ],
    }


def merge_system(messages: list[dict[str, Any]], extra: str) -> list[dict[str, Any]]:
    """Add an instruction to the system turn (creating one first if there is none)."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{extra}".strip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": extra}, *messages]
