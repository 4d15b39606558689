"""Side by side: one prompt sent to 2-4 targets at once, streamed, timed and counted per column.

A target is the local engine (an `EngineClient`), an OpenRouter model, or any
OpenAI-compatible base URL. Remote targets are streamed over httpx
(`POST {base}/chat/completions`, `stream: true`). Each column records:

- TTFT: seconds from sending the request to the first non-empty text;
- tokens/s: decode speed, (completion tokens - 1) / (last token time - first token time);
- token counts: from the server's usage report (`stream_options.include_usage`) when it
  sends one, else the number of streamed content chunks (`tokens_estimated` is then True);
- an error as a sentence (unreachable endpoint, rejected key, unknown model...), never a
  traceback; one column failing leaves the others running.

`run_compare` is a coroutine (the Studio runs it on its qasync loop); `on_event` is
called on that loop after every change to a column. `compare_blocking` wraps it for
scripts and tests. Results save as JSON or Markdown.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import httpx

from app.studio.remote_engine import error_message, sse_chunks
from app.studio.tasks import CancelToken

if TYPE_CHECKING:
    from app.engine import EngineClient

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
MIN_TARGETS, MAX_TARGETS = 2, 4


@dataclass(frozen=True)
class Target:
    label: str
    kind: str  # "local" | "openrouter" | "openai"
    model: str = ""
    base_url: str = ""
    api_key: str | None = None
    client: EngineClient | None = field(default=None, compare=False, repr=False)

    @classmethod
    def local(cls, client: EngineClient, label: str | None = None) -> Target:
        return cls(label or f"Local: {client.model.name}", "local", client.model.name, client=client)

    @classmethod
    def openrouter(cls, model: str, api_key: str | None, base_url: str = OPENROUTER_BASE_URL,
                   label: str | None = None) -> Target:
        return cls(label or f"OpenRouter: {model}", "openrouter", model, base_url, api_key)

    @classmethod
    def openai_compatible(cls, base_url: str, model: str, api_key: str | None = None,
                          label: str | None = None) -> Target:
        return cls(label or f"{urlparse(base_url).netloc or base_url}: {model}", "openai", model, base_url, api_key)


@dataclass(frozen=True)
class CompareRequest:
    prompt: str
    system_prompt: str = ""
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int | None = None

    def messages(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": self.prompt}]


@dataclass
class ColumnResult:
    label: str
    kind: str
    model: str
    status: str = "waiting"  # waiting | streaming | done | error | cancelled
    text: str = ""
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_estimated: bool = False
    ttft_s: float | None = None
    total_s: float | None = None
    tokens_per_s: float | None = None
    _chunks: int = field(default=0, repr=False)
    _started: float = field(default=0.0, repr=False)
    _first: float | None = field(default=None, repr=False)
    _last: float | None = field(default=None, repr=False)

    def add_text(self, text: str) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            self.ttft_s = now - self._started
        self._last = now
        self._chunks += 1
        self.text += text
        self.status = "streaming"

    def finish(self, status: str, error: str | None = None) -> None:
        self.status, self.error = status, error
        self.total_s = time.perf_counter() - self._started
        if self.completion_tokens is None and self._chunks:
            self.completion_tokens, self.tokens_estimated = self._chunks, True
        if self.completion_tokens and self.completion_tokens > 1 and self._first and self._last and \
                self._last > self._first:
            self.tokens_per_s = (self.completion_tokens - 1) / (self._last - self._first)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColumnResult:
        """A saved column back (the last results shown again after a restart)."""
        known = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
        return cls(**{k: v for k, v in data.items() if k in known})

    def live_speed(self) -> float | None:
        """Decode speed so far, counting streamed chunks (the server's count comes only at the end)."""
        if self._chunks > 1 and self._first is not None and self._last is not None and self._last > self._first:
            return (self._chunks - 1) / (self._last - self._first)
        return None


EventCallback = Callable[[int, ColumnResult, str], None]  # column index, column state, new text


@dataclass
class CompareResult:
    request: CompareRequest
    columns: list[ColumnResult]
    started_at: str

    def as_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "request": asdict(self.request),
                "columns": [c.as_dict() for c in self.columns]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False)

    def to_markdown(self) -> str:
        cols = self.columns
        lines = [f"# Compare, {self.started_at}", "", f"**Prompt:** {self.request.prompt}", ""]
        if self.request.system_prompt:
            lines[-1:-1] = [f"**System prompt:** {self.request.system_prompt}", ""]
        lines += ["| | " + " | ".join(c.label for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        rows = [
            ("TTFT", lambda c: _num(c.ttft_s, "{:.2f} s")),
            ("tokens/s", lambda c: _num(c.tokens_per_s, "{:.1f}")),
            ("prompt tokens", lambda c: _num(c.prompt_tokens, "{}")),
            ("completion tokens", lambda c: _num(c.completion_tokens, "{}") + (" (est.)" if c.tokens_estimated
                                                                                else "")),
            ("finish", lambda c: "error" if c.error else c.finish_reason or c.status),
        ]
        lines += [f"| {name} | " + " | ".join(cell(c) for c in cols) + " |" for name, cell in rows]
        for column in cols:
            lines += ["", f"## {column.label}", ""]
            lines.append(f"> Error: {column.error}" if column.error else column.text)
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write as .json or .md, chosen by the file's suffix."""
        path = Path(path)
        writers = {".json": self.to_json, ".md": self.to_markdown, ".markdown": self.to_markdown}
        if path.suffix.lower() not in writers:
            raise ValueError(f"save compare results as .json or .md, not {path.suffix or 'no suffix'!r}")
        path.write_text(writers[path.suffix.lower()](), encoding="utf-8")
        return path


def _num(value: float | int | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


async def run_compare(
    request: CompareRequest,
    targets: list[Target],
    on_event: EventCallback | None = None,
    token: CancelToken | None = None,
    timeout_s: float = 120.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> CompareResult:
    """Send `request` to every target at once; returns when all columns have finished or failed."""
    if not MIN_TARGETS <= len(targets) <= MAX_TARGETS:
        raise ValueError(f"compare needs {MIN_TARGETS} to {MAX_TARGETS} targets, got {len(targets)}")
    if not request.prompt.strip():
        raise ValueError("the prompt is empty")
    columns = [ColumnResult(t.label, t.kind, t.model) for t in targets]
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def emit(index: int, text: str = "") -> None:
        if on_event is not None:
            on_event(index, columns[index], text)

    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as http:
        tasks = [
            asyncio.create_task(_run_column(i, t, request, columns[i], emit, http, timeout_s))
            for i, t in enumerate(targets)
        ]
        if token is not None:
            loop = asyncio.get_running_loop()
            token.on_cancel(lambda: loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks]))
        await asyncio.gather(*tasks, return_exceptions=True)
    return CompareResult(request, columns, started)


def compare_blocking(request: CompareRequest, targets: list[Target], **kwargs: Any) -> CompareResult:
    """`run_compare` on a fresh event loop, for scripts and tests."""
    return asyncio.run(run_compare(request, targets, **kwargs))


async def _run_column(index: int, target: Target, request: CompareRequest, column: ColumnResult,
                      emit: Callable[[int, str], None], http: httpx.AsyncClient, timeout_s: float) -> None:
    column._started = time.perf_counter()
    column.status = "streaming"
    emit(index)
    try:
        if target.kind == "local":
            await _stream_local(index, target, request, column, emit)
        else:
            await _stream_remote(index, target, request, column, emit, http)
    except asyncio.CancelledError:
        column.finish("cancelled")
    except ColumnError as exc:
        column.finish("error", str(exc))
    except httpx.ConnectError as exc:
        column.finish("error", f"Cannot reach {target.base_url}: is the server running and the URL right? ({exc})")
    except httpx.TimeoutException:
        column.finish("error", f"No answer from {target.base_url} within {timeout_s:g} s.")
    except httpx.TransportError as exc:
        column.finish("error", f"The connection to {target.base_url} broke off: {exc or type(exc).__name__}")
    except Exception as exc:  # any other failure is this column's, shown in it
        column.finish("error", getattr(exc, "message", None) or str(exc) or type(exc).__name__)
    else:
        column.finish("done")
    emit(index)


class ColumnError(Exception):
    """A failure to show in the column, already worded for the user."""


async def _stream_remote(index: int, target: Target, request: CompareRequest, column: ColumnResult,
                         emit: Callable[[int, str], None], http: httpx.AsyncClient) -> None:
    if target.kind == "openrouter" and not target.api_key:
        raise ColumnError("No OpenRouter API key set: paste one into the OpenRouter key field above "
                          "(from openrouter.ai/keys) and press Save key.")
    url = target.base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    if target.kind == "openrouter":
        headers |= {"HTTP-Referer": "https://github.com/paddock-studio", "X-Title": "Paddock Studio"}
    body: dict[str, Any] = {
        "model": target.model, "messages": request.messages(), "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": request.max_tokens,
        "temperature": request.temperature, "top_p": request.top_p,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    async with http.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code >= 400:
            raise ColumnError(_http_error(response.status_code, await response.aread(), target, url))
        async for chunk in sse_chunks(response, _host(url), ColumnError):
            _apply_chunk(index, chunk, column, emit)


def _apply_chunk(index: int, chunk: dict[str, Any], column: ColumnResult, emit: Callable[[int, str], None]) -> None:
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content") or ""
        if text:
            column.add_text(text)
            emit(index, text)
        if choice.get("finish_reason"):
            column.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        column.prompt_tokens = usage.get("prompt_tokens")
        column.completion_tokens = usage.get("completion_tokens")


async def _stream_local(index: int, target: Target, request: CompareRequest, column: ColumnResult,
                        emit: Callable[[int, str], None]) -> None:
    from app.engine import GenerationRequest, SamplingParams
    from app.engine.server.prompting import PromptBuilder

    assert target.client is not None, "a local target needs an EngineClient"
    prompts = PromptBuilder(target.client)
    prompt = prompts.chat(request.messages())
    params = SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p,
                            seed=request.seed, stop=prompts.template_stop_strings)
    generation = GenerationRequest(prompt.token_ids, params, session_id="compare")
    async for output in target.client.generate(generation):
        if output.new_text:
            column.add_text(output.new_text)
            emit(index, output.new_text)
        column.prompt_tokens = output.num_prompt_tokens
        column.completion_tokens = output.num_output_tokens
        if output.finish_reason:
            column.finish_reason = output.finish_reason


def _http_error(status: int, body: bytes, target: Target, url: str) -> str:
    try:
        detail = error_message(json.loads(body))
    except (ValueError, AttributeError):
        detail = body.decode("utf-8", errors="replace").strip()[:200]
    host = _host(url)
    if status in (401, 403):
        what = "the API key" if target.api_key else "the request: it needs an API key"
        return f"{host} rejected {what} (HTTP {status}): {detail}"
    if status == 404:
        hint = "" if "/v1" in urlparse(url).path else " The base URL usually ends in /v1."
        return f"{host} does not know model {target.model!r}, or {url} is not an OpenAI-compatible endpoint " \
               f"(HTTP 404): {detail}{hint}"
    if status == 429:
        return f"{host} is rate limiting these requests (HTTP 429): {detail}"
    return f"{host} answered HTTP {status}: {detail}"


def with_v1(base_url: str) -> str:
    """An OpenAI-compatible base URL with its /v1: "http://host:8080" becomes "http://host:8080/v1".
    A URL that already has a path is left alone (some servers mount the API elsewhere)."""
    url = base_url.strip().rstrip("/")
    parsed = urlparse(url)
    return url + "/v1" if parsed.scheme in ("http", "https") and parsed.path in ("", "/") else url


def list_models(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[str]:
    """The model ids an OpenAI-compatible endpoint serves (GET {base}/models); ColumnError in words."""
    url = with_v1(base_url) + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ColumnError(f"Could not reach {_host(url)}: {exc or type(exc).__name__}") from None
    if response.status_code >= 400:
        target = Target("", "openai", "", base_url, api_key)
        raise ColumnError(_http_error(response.status_code, response.content, target, url))
    try:
        data = response.json().get("data") or []
        return sorted(str(item["id"]) for item in data if isinstance(item, dict) and item.get("id"))
    except (ValueError, AttributeError, KeyError):
        raise ColumnError(f"{_host(url)} answered /models with something that is not a model list") from None


def _host(url: str) -> str:
    return urlparse(url).netloc or url
