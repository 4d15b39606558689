"""A chat session over the local engine: prompt from history, streaming into History as it streams.

`ChatService` is Qt-free and runs on an asyncio loop (the Studio's qasync loop). For
each answer it

1. builds the prompt from the conversation in History: its system prompt, then the
   user and assistant turns (stopped and interrupted answers included, since the user
   saw them; consecutive turns of one role merged, as most chat templates insist on
   alternating roles), rendered with the model's chat template and tokenized;
2. sizes the answer: the conversation's `max_tokens`, clamped to the room left in the
   context (a prompt that alone overflows the context is refused with both numbers);
3. streams from the `EngineClient`, appending every delta to History at once (a crash
   loses nothing already shown) and handing it to `on_delta`;
4. finishes the History row with the status ("complete", "stopped", "error"), the token
   counts, the time to first token and the decode speed.

`stop()` ends the answer being generated: the engine request is aborted and its KV
blocks freed; what was streamed stays, marked "stopped".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.studio.attachments import IMAGE_MARK, turn_text
from app.studio.doc_qa import DocumentSet, IngestReport, chat_message, needs_vision_message, supports_vision
from app.studio.documents import PageScale
from app.studio.history import Attachment, Conversation, History, Message
from app.studio.page_qa import page_scale
from app.studio.remote_engine import RemoteEngine

if TYPE_CHECKING:
    from app.engine import EngineClient, SamplingParams

CHAT_ROLES = ("user", "assistant")


class ChatError(Exception):
    """The answer cannot be generated; the message is meant for the user."""


class ContextOverflow(ChatError):
    """The conversation alone fills the model's context."""


@dataclass(frozen=True)
class ChatSettings:
    """Sampling settings of one conversation (kept in History with it)."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    max_tokens: int = 1024
    repetition_penalty: float = 1.0
    seed: int | None = None

    @classmethod
    def from_dict(cls, values: dict[str, Any], base: ChatSettings | None = None) -> ChatSettings:
        """`base` with the known keys of `values` applied (unknown keys, from newer Studios, ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{**asdict(base or cls()), **{k: v for k, v in values.items() if k in known}})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sampling_params(self, max_tokens: int, stop: list[str]) -> SamplingParams:
        from app.engine import SamplingParams

        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, repetition_penalty=self.repetition_penalty, seed=self.seed,
                              stop=stop)


@dataclass(frozen=True)
class AnswerStats:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None  # request sent -> first token
    tokens_per_s: float | None = None  # decode speed: (tokens - 1) / (last token - first token)
    finish_reason: str | None = None

    @classmethod
    def from_message(cls, message: Message) -> AnswerStats:
        return cls(message.prompt_tokens, message.completion_tokens, message.ttft_s, message.tokens_per_s,
                   message.finish_reason)

    def describe(self) -> str:
        """One line under an answer: '12 tokens · 8.3 tok/s · first token 0.41 s · prompt 23 tokens'."""
        parts = []
        if self.completion_tokens is not None:
            parts.append(f"{self.completion_tokens} token{'' if self.completion_tokens == 1 else 's'}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.ttft_s is not None:
            parts.append(f"first token {self.ttft_s:.2f} s")
        if self.prompt_tokens is not None:
            parts.append(f"prompt {self.prompt_tokens} tokens")
        if self.finish_reason == "length":
            parts.append("stopped at max tokens")
        return " · ".join(parts)


@dataclass(frozen=True)
class Answer:
    message_id: int
    status: str  # "complete" | "stopped" | "error"
    text: str
    stats: AnswerStats
    error: str | None = None


@dataclass(frozen=True)
class Dropped:
    """Where the documents dropped on the chat went once read: scanned PDFs (no text to search) leave the set
    and go as page images with the next message when the model has vision; the rest is what to tell the user."""

    as_pages: list[Path]
    problems: list[str]


StartCallback = Callable[[Message], None]
DeltaCallback = Callable[[int, str], None]  # message id, new text


class _Clock:
    """Times one answer: first token and decode speed, as compare.py measures them."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None

    def token(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now

    def stats(self, prompt_tokens: int | None, completion_tokens: int, finish_reason: str | None) -> AnswerStats:
        ttft = None if self.first is None else self.first - self.started
        speed = None
        if completion_tokens > 1 and self.first is not None and self.last is not None and self.last > self.first:
            speed = (completion_tokens - 1) / (self.last - self.first)
        return AnswerStats(prompt_tokens, completion_tokens, ttft, speed, finish_reason)


class ChatService:
    def __init__(self, history: History, client: Callable[[], EngineClient | None]) -> None:
        self.history = history
        self._client = client  # the host's current engine, asked at each answer (models switch)
        self._stream: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: tuple[int, _Streamed] | None = None  # (conversation id, its answer's counters) while streaming

    @property
    def busy(self) -> bool:
        return self._stream is not None and not self._stream.done()

    @property
    def streaming_conversation(self) -> int | None:
        """The conversation whose answer is streaming now (others may be opened meanwhile)."""
        return self._live[0] if self._live is not None and self.busy else None

    @property
    def supports_vision(self) -> bool:
        """Whether the model loaded now takes images."""
        return supports_vision(self._client())

    def route_dropped(self, documents: DocumentSet, report: IngestReport | None) -> Dropped:
        """Take the scanned PDFs of `report` (None: the ingest failed) out of `documents`: with a vision model
        they are to go as pages, else they are refused with the reason; files that failed are named too."""
        scanned = [d for d in report.added if d.scanned] if report is not None else []
        for document in scanned:
            documents.remove(document.path)
        vision = bool(scanned) and self.supports_vision
        problems = [failure.message for failure in report.failed] if report is not None else []
        if scanned and not vision:
            problems.append(needs_vision_message(scanned))
        return Dropped([d.path for d in scanned] if vision else [], problems)

    def page_scale(self) -> PageScale | None:
        """The resolution a scanned PDF's pages are rendered at for the loaded model (as the Documents pane
        renders them); None when the model has no vision."""
        client = self._client()
        return page_scale(client) if client is not None and supports_vision(client) else None

    def live_stats(self) -> tuple[AnswerStats, float] | None:
        """The streaming answer's numbers so far and the seconds since it was asked; None when idle."""
        if self._live is None or not self.busy:
            return None
        state = self._live[1]
        stats = state.clock.stats(state.prompt_tokens, state.completion_tokens, None)
        return stats, time.perf_counter() - state.clock.started

    def new_conversation(self, system_prompt: str = "", settings: ChatSettings | None = None) -> Conversation:
        client = self._client()
        return self.history.create_conversation(model=client.model.name if client else "",
                                                system_prompt=system_prompt,
                                                settings=(settings or ChatSettings()).as_dict())

    def configure(self, conversation_id: int, system_prompt: str, settings: ChatSettings) -> None:
        """Keep the conversation's system prompt and sampling settings (used by its next answer)."""
        self.history.update_conversation(conversation_id, system_prompt=system_prompt,
                                         settings=settings.as_dict())

    def settings_of(self, conversation: Conversation, defaults: ChatSettings | None = None) -> ChatSettings:
        return ChatSettings.from_dict(conversation.settings, defaults)

    def conversation_for(self, conversation_id: int | None, system_prompt: str, settings: ChatSettings) -> int:
        """The conversation a question goes to, with the system prompt and sampling settings it is asked
        under saved in it: the open one (`conversation_id`), or a new one when none is open."""
        if conversation_id is None:
            return self.new_conversation(system_prompt, settings).id
        self.configure(conversation_id, system_prompt, settings)
        return conversation_id

    def question(self, text: str, documents: DocumentSet | None = None) -> str:
        """What is sent for the typed `text`: the question with the passages of `documents` close enough to
        answer from, or the question alone when none is. Raises DocQAError when the set cannot be searched;
        called before anything is saved, so a refused question leaves no conversation behind."""
        if documents is None or not len(documents):
            return text
        excerpts = documents.retrieve(text)
        return chat_message(text, excerpts) if excerpts else text

    def ask(self, conversation_id: int, message: str, *, replacing: int | None = None,
            attachments: Sequence[Attachment] = (), on_start: StartCallback | None = None,
            on_delta: DeltaCallback | None = None) -> Coroutine[Any, Any, Answer]:
        """The answer to `message` (from question()) as a coroutine to run on the engine's loop. `replacing`:
        the question being edited; it and every later message go now, before the caller shows the
        conversation again (edit and resend)."""
        if replacing is not None:
            self.history.delete_messages_from(replacing)
        return self.send(conversation_id, message, on_start, on_delta, attachments)

    async def send(self, conversation_id: int, text: str, on_start: StartCallback | None = None,
                   on_delta: DeltaCallback | None = None, attachments: Sequence[Attachment] = ()) -> Answer:
        """Add the user's message (with its attached files) and stream the answer to it."""
        if not text.strip():
            raise ChatError("The message is empty.")
        self._ensure_idle()
        client = self._ensure_model()
        images = [a.name for a in attachments if a.kind == "image"]
        if images and not supports_vision(client):
            raise ChatError(f"{client.model.name} reads text only, so it cannot see {', '.join(images)}: load a "
                            "model with vision (such as Gemma 3 with its mmproj file) or remove the image.")
        message = self.history.add_message(conversation_id, "user", text)
        if attachments:
            self.history.add_attachments(message.id, list(attachments))
        try:
            return await self._answer(conversation_id, on_start, on_delta)
        except ContextOverflow as exc:  # kept, it would overflow every later turn too: the caller gets it back
            self.history.delete_message(message.id)
            if any(a.kind == "document" for a in attachments):
                raise ContextOverflow(f"{exc} The attached documents are sent whole: remove them, or drop the "
                                      "files on the chat to search them instead.") from exc
            raise

    async def regenerate(self, conversation_id: int, on_start: StartCallback | None = None,
                         on_delta: DeltaCallback | None = None) -> Answer:
        """Drop the last answer (if the conversation ends with one) and answer the last question again."""
        self._ensure_idle()
        self._ensure_model()
        messages = self.history.conversation(conversation_id).messages
        if not any(m.role == "user" for m in messages):
            raise ChatError("There is no question to answer again yet.")
        replacing = messages[-1].id if messages[-1].role == "assistant" else None  # kept as an earlier version
        return await self._answer(conversation_id, on_start, on_delta, replacing)

    def stop(self) -> None:
        """End the answer being generated (call on the loop's thread); a no-op when idle."""
        if self.busy:
            assert self._stream is not None
            self._stream.cancel()

    def stop_threadsafe(self) -> None:
        """`stop` from another thread (the engine host's, when the model is about to unload)."""
        if self._loop is not None and self.busy:
            self._loop.call_soon_threadsafe(self.stop)

    def prompt(self, client: EngineClient, conversation: Conversation) -> tuple[list[int], list[Any]]:
        """The conversation rendered with the model's chat template and tokenized, ready to answer, and the
        image inputs its image tokens stand for (none for a text-only model)."""
        vision = getattr(client, "vision", None) if supports_vision(client) else None
        messages = prompt_messages(conversation, vision=vision is not None)
        try:
            text = client.chat_template.render(messages, add_generation_prompt=True)
        except Exception as exc:  # a template's own rule (roles, content types) failed on this conversation
            raise ChatError(f"The model's chat template could not render this conversation: {exc}") from exc
        views: list[Any] = []
        images = [a.data for m in conversation.messages for a in conversation.attachments.get(m.id, ())
                  if a.kind == "image" and m.role == "user"]
        if vision is not None and images:
            text, views = self._with_images(vision, text, images)
        tokenizer = client.tokenizer
        bos_id = getattr(tokenizer, "bos_token_id", None)
        bos = tokenizer.id_to_token(bos_id) if bos_id is not None else None
        ids = tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)), parse_special=True)
        return ids, views

    def prompt_token_ids(self, client: EngineClient, conversation: Conversation) -> list[int]:
        return self.prompt(client, conversation)[0]

    @staticmethod
    def _with_images(vision: Any, text: str, images: list[bytes]) -> tuple[str, list[Any]]:
        """The images decoded and preprocessed, and their marks in the rendered prompt expanded."""
        try:
            prepared = [vision.prepare(data) for data in images]
            return vision.expand(text, prepared, marker=IMAGE_MARK), vision.views(prepared)
        except ValueError as exc:  # ImageError (undecodable, too many pixels) is a ValueError
            raise ChatError(f"An attached image cannot be shown to the model: {exc}.") from exc

    # -- one answer ---------------------------------------------------------------------
    def _ensure_idle(self) -> None:
        if self.busy:
            raise ChatError("An answer is still being generated: stop it first.")

    def _ensure_model(self) -> EngineClient:
        client = self._client()
        if client is None:
            raise ChatError("No model is loaded: load one in the Models pane.")
        return client

    async def _answer(self, conversation_id: int, on_start: StartCallback | None,
                      on_delta: DeltaCallback | None, replacing: int | None = None) -> Answer:

        client = self._ensure_model()
        conversation = self.history.conversation(conversation_id)
        if replacing is not None:  # the prompt ends with the question, not with the answer being replaced
            conversation = replace(conversation, messages=tuple(
                m for m in conversation.messages if m.id != replacing))
        settings = self.settings_of(conversation)
        if isinstance(client, RemoteEngine):  # the server builds the prompt from the messages
            message = self.history.start_message(conversation_id, "assistant", model=client.model.name,
                                                 replacing=replacing)
            outputs = client.stream_chat(prompt_messages(conversation), settings.max_tokens, settings.temperature,
                                         settings.top_p, settings.seed)
            state = _Streamed(0)
        else:
            message, outputs, state = self._local_request(client, conversation_id, conversation, settings, replacing)
        if on_start is not None:
            on_start(message)
        self._live = (conversation_id, state)
        self._loop = asyncio.get_running_loop()
        self._stream = asyncio.ensure_future(self._consume(outputs, message.id, state, on_delta))
        status, error = "complete", None
        try:
            await self._stream
        except asyncio.CancelledError:
            status = "stopped"
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # we were cancelled, not just the stream
                self._finish(message.id, "stopped", state)
                raise
        except Exception as exc:  # the engine failed mid-answer: keep the text, say what happened
            status, error = "error", _error_text(exc)
        finally:
            self._stream, self._live = None, None
        stats = self._finish(message.id, status, state)
        return Answer(message.id, status, state.text, stats, error)

    def _local_request(self, client: EngineClient, conversation_id: int, conversation: Conversation,
                       settings: ChatSettings, replacing: int | None) -> tuple[Message, Any, _Streamed]:
        """The prompt rendered and tokenized here, sized to the context; the answer's row and its stream."""
        from app.engine import GenerationRequest

        ids, images = self.prompt(client, conversation)
        context = client.model.context_length
        room = context - len(ids)
        if room < 1:
            raise ContextOverflow(f"This conversation is {len(ids)} tokens long, and the model's context holds "
                            f"{context}. Start a new conversation (or load the model with a longer context).")
        stop = list(getattr(client.chat_template, "stop_strings", ()) or ())
        try:
            params = settings.sampling_params(min(settings.max_tokens, room), stop)
        except ValueError as exc:
            raise ChatError(f"Sampling settings: {exc}") from exc
        message = self.history.start_message(conversation_id, "assistant", model=client.model.name,
                                             replacing=replacing)
        request = GenerationRequest(ids, params, session_id=f"chat-{conversation_id}", images=images)
        return message, client.generate(request), _Streamed(len(ids))

    async def _consume(self, outputs: Any, message_id: int, state: _Streamed,
                       on_delta: DeltaCallback | None) -> None:
        """Stream the outputs (the local engine's RequestOutputs or a remote's RemoteOutputs) into History."""
        async for output in outputs:
            if output.num_output_tokens > state.completion_tokens:
                state.clock.token()
            state.prompt_tokens = output.num_prompt_tokens or state.prompt_tokens
            state.completion_tokens = output.num_output_tokens
            state.finish_reason = output.finish_reason or state.finish_reason
            if output.new_text:
                state.text += output.new_text
                self.history.append(message_id, output.new_text)
                if on_delta is not None:
                    on_delta(message_id, output.new_text)

    def _finish(self, message_id: int, status: str, state: _Streamed) -> AnswerStats:
        reason = state.finish_reason if status == "complete" else ("abort" if status == "stopped" else None)
        stats = state.clock.stats(state.prompt_tokens, state.completion_tokens, reason)
        self.history.finish_message(message_id, status, stats.finish_reason, stats.prompt_tokens,
                                    stats.completion_tokens, stats.ttft_s, stats.tokens_per_s)
        return stats


@dataclass
class _Streamed:
    prompt_tokens: int
    completion_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""
    clock: _Clock = field(default_factory=_Clock)  # started with the request


def prompt_messages(conversation: Conversation, vision: bool = False) -> list[dict[str, str]]:
    """The turns the model sees: system prompt, then user/assistant text, one role at a time; a question's
    attached documents go before it as text, its images as IMAGE_MARKs (`vision`) or their names."""
    turns: list[dict[str, str]] = []
    if conversation.system_prompt.strip():
        turns.append({"role": "system", "content": conversation.system_prompt})
    for message in conversation.messages:
        if message.role not in CHAT_ROLES or not message.content:
            continue
        content = message.content
        if message.role == "user":
            content = turn_text(content, conversation.attachments.get(message.id, ()), vision)
        if turns and turns[-1]["role"] == message.role:  # e.g. a question whose answer failed, then another
            turns[-1] = {"role": message.role, "content": turns[-1]["content"] + "\n\n" + content}
        else:
            turns.append({"role": message.role, "content": content})
    return turns


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
