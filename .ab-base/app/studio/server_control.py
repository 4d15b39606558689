"""The Studio's API toggle: start/stop the in-process server, its address, snippets for IDE agents, a request log.

`ServerControl` wraps `ServerHandle` (uvicorn on a background thread) around whichever
model the `EngineHost` has loaded. `start`/`stop` block for a moment (the port opening
or closing) so the UI calls them through its worker. When the user switches models
while the API is on, `follow(host)` stops the server before the old engine closes and
starts it again on the new one, so clients see one short gap, not a dead server.

Every finished request lands in `RequestLog` (method, path, status, duration, client),
whose listeners are called on the server's thread.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.engine.server.launch import ServerHandle
from app.engine.server.settings import DEFAULT_PORT, ServerSettings

if TYPE_CHECKING:
    from app.engine import EngineClient
    from app.studio.embedders import EmbedderHost
    from app.studio.runtime import EngineHost, RuntimeStatus

LOOPBACK_HOST, LAN_HOST = "127.0.0.1", "0.0.0.0"
LOG_CAPACITY = 500


class ServerError(Exception):
    """The API cannot start or stop as asked; the message is meant for the user."""


@dataclass(frozen=True)
class ServerOptions:
    port: int = DEFAULT_PORT
    lan: bool = False  # False: this computer only
    api_key: str | None = None

    @property
    def host(self) -> str:
        return LAN_HOST if self.lan else LOOPBACK_HOST

    def server_settings(self) -> ServerSettings:
        return ServerSettings(host=self.host, port=self.port, api_key=self.api_key or None)


@dataclass(frozen=True)
class Endpoints:
    """Where clients reach the API: on this machine, and from the network when listening on the LAN."""

    root: str  # http://127.0.0.1:PORT: the Anthropic SDK's base URL (it adds /v1/messages)
    lan_root: str | None = None

    @property
    def openai_base(self) -> str:
        return self.root + "/v1"

    @property
    def anthropic_base(self) -> str:
        return self.root


@dataclass(frozen=True)
class ServerState:
    running: bool
    message: str
    endpoints: Endpoints | None = None
    options: ServerOptions | None = None
    model: str = ""
    context_length: int | None = None  # the served model's, for snippets that declare it (opencode)


@dataclass(frozen=True)
class Snippet:
    key: str
    title: str
    text: str


@dataclass(frozen=True)
class LogEntry:
    at: float  # time.time() when the request ended
    client: str
    method: str
    path: str
    status: int | None  # None: the connection ended before a response started
    duration_s: float

    def line(self) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.at))
        status = self.status if self.status is not None else "---"
        return f"{clock}  {self.method} {self.path}  {status}  {self.duration_s * 1000:.0f} ms  {self.client}"


class RequestLog:
    """The last LOG_CAPACITY requests; listeners hear each new one on the server's thread."""

    def __init__(self, capacity: int = LOG_CAPACITY) -> None:
        self._entries: collections.deque[LogEntry] = collections.deque(maxlen=capacity)
        self._listeners: list[Callable[[LogEntry], None]] = []
        self._lock = threading.Lock()

    def add(self, entry: LogEntry) -> None:
        with self._lock:
            self._entries.append(entry)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(entry)

    def entries(self) -> list[LogEntry]:
        with self._lock:
            return list(self._entries)

    def subscribe(self, listener: Callable[[LogEntry], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)


class RequestLogMiddleware:
    """Plain ASGI: times each HTTP request to its last byte (streams included) and logs it."""

    def __init__(self, app: Any, log: RequestLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status: list[int] = []

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            client = scope.get("client") or ("?", 0)
            self.log.add(LogEntry(time.time(), str(client[0]), scope["method"], scope["path"],
                                  status[0] if status else None, time.perf_counter() - started))


class ServerControl:
    def __init__(self, engine: Callable[[], EngineClient | None], *, embedder: Callable[[], Any] | None = None,
                 handle_factory: Callable[..., ServerHandle] = ServerHandle) -> None:
        self._engine = engine  # asked at each start: the model loaded then
        self._embedder = embedder or (lambda: None)
        self._handle_factory = handle_factory
        self._handle: ServerHandle | None = None
        self._options: ServerOptions | None = None
        self._lock = threading.RLock()  # start/stop come from the UI worker and the host's thread
        self._listeners: list[Callable[[ServerState], None]] = []
        self._resume_after_switch = False
        self.log = RequestLog()
        self._state = ServerState(False, "The API is off.")

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def running(self) -> bool:
        return self._handle is not None and self._handle.running

    def subscribe(self, listener: Callable[[ServerState], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def start(self, options: ServerOptions) -> ServerState:
        """Open the port and serve the loaded model (blocks until the port accepts connections)."""
        with self._lock:
            if self.running:
                self._stop_handle()
            client = self._engine()
            if client is None:
                raise ServerError("No model is loaded: load one first, the API serves the loaded model.")
            try:
                settings = options.server_settings()
            except ValueError as exc:
                raise ServerError(f"Server settings: {exc}") from exc
            embedder = self._embedder()
            handle = self._handle_factory(client, settings=settings, embedder=embedder,
                                          app_factory=self._app_factory)
            try:
                handle.start()
            except OSError as exc:
                raise ServerError(_bind_error(options, exc)) from exc
            except RuntimeError as exc:
                raise ServerError(f"The API did not start: {exc}") from exc
            self._handle, self._options = handle, options
            endpoints = endpoints_for(options, handle.port or options.port)
            where = "on your network" if options.lan else "on this computer"
            served = client.model.name + (f" and {embedder.model_name} (embeddings)" if embedder is not None else "")
            return self._set(ServerState(True, f"Serving {served} {where} at {endpoints.root}",
                                         endpoints, options, client.model.name, client.model.context_length))

    def stop(self) -> ServerState:
        with self._lock:
            self._resume_after_switch = False
            self._stop_handle()
            return self._set(ServerState(False, "The API is off."))

    def follow(self, host: EngineHost) -> Callable[[], None]:
        """Keep serving across model switches: stop before the old model unloads, restart once the new is ready."""
        return host.subscribe(self._on_runtime)

    def follow_embedder(self, embedders: EmbedderHost) -> Callable[[], None]:
        """Serve /v1/embeddings once the embedding model is loaded: a running API restarts to take it on."""
        return embedders.subscribe(lambda embedder: self._restart_for_embeddings())

    def snippets(self) -> list[Snippet]:
        state = self._state
        if state.endpoints is None or state.options is None:
            return []
        return agent_snippets(state.endpoints, state.model, state.options.api_key, state.context_length)

    # -- internals --------------------------------------------------------------------------
    def _app_factory(self, engine: EngineClient, embedder: Any, settings: ServerSettings) -> Any:
        from app.engine.server.app import create_app

        return RequestLogMiddleware(create_app(engine, embedder=embedder, settings=settings), self.log)

    def _stop_handle(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.stop()
            except RuntimeError as exc:
                raise ServerError(f"The API did not stop cleanly: {exc}") from exc

    def _on_runtime(self, status: RuntimeStatus) -> None:
        with self._lock:
            if status.state == "unloading" and self.running:
                self._stop_handle()
                self._resume_after_switch = True
                self._set(ServerState(False, "The API is paused while the model changes…"))
            elif status.state == "ready" and self._resume_after_switch and self._options is not None:
                self._resume_after_switch = False
                try:
                    self.start(self._options)
                except ServerError as exc:
                    self._set(ServerState(False, f"The API could not restart on the new model: {exc}"))
            elif status.state == "error" and self._resume_after_switch:
                self._resume_after_switch = False
                self._set(ServerState(False, "The API is off: the new model did not load."))

    def _restart_for_embeddings(self) -> None:
        with self._lock:
            if not self.running or self._options is None:
                return  # the next start takes it
            try:
                self.start(self._options)
            except ServerError as exc:
                self._set(ServerState(False, f"The API could not restart with the embedding model: {exc}"))

    def _set(self, state: ServerState) -> ServerState:
        self._state = state
        for listener in list(self._listeners):
            listener(state)
        return state


def endpoints_for(options: ServerOptions, port: int) -> Endpoints:
    root = f"http://{LOOPBACK_HOST}:{port}"
    lan_root = f"http://{lan_address()}:{port}" if options.lan else None
    return Endpoints(root, lan_root)


def lan_address() -> str:
    """This machine's address on its network (the route to a private address; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostname()


def _bind_error(options: ServerOptions, exc: OSError) -> str:
    if exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
        return f"Port {options.port} is already in use by another program: choose another port."
    if exc.errno in (13, 10013):
        return f"Not allowed to listen on port {options.port}: choose a port above 1024."
    return f"Cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"


@dataclass(frozen=True)
class _SnippetValues:
    openai: str
    anthropic: str
    model: str
    key: str | None
    context_length: int | None

    @property
    def shown_key(self) -> str:
        return self.key or "paddock"  # SDKs insist on some key even when the server wants none


def agent_snippets(
    endpoints: Endpoints, model: str, api_key: str | None, context_length: int | None = None
) -> list[Snippet]:
    """Copy-paste configuration for common IDE agents and SDKs, filled in for this server.
    tests/server/test_agent_snippets.py drives the server with exactly these settings."""
    v = _SnippetValues(endpoints.openai_base, endpoints.anthropic_base, model, api_key, context_length)
    builders = (_continue, _claude_code, _codex, _aider, _opencode, _openai_sdk, _anthropic_sdk, _curl)
    return [builder(v) for builder in builders]


def _continue(v: _SnippetValues) -> Snippet:
    key = f"\n    apiKey: {v.key}" if v.key else ""
    return Snippet("continue", "Continue (config.yaml)", (
        "models:\n"
        "  - name: Paddock Studio\n"
        "    provider: openai\n"
        f"    model: {v.model}\n"
        f"    apiBase: {v.openai}{key}\n"
        "    roles: [chat, edit, apply, autocomplete]\n"
    ))


def _claude_code(v: _SnippetValues) -> Snippet:
    # Claude Code asks for several model tiers by name: point each at the loaded model.
    return Snippet("claude-code", "Claude Code", (
        f"export ANTHROPIC_BASE_URL={v.anthropic}\n"
        f"export ANTHROPIC_AUTH_TOKEN={v.shown_key}\n"
        f"export ANTHROPIC_MODEL={v.model}\n"
        f"export ANTHROPIC_DEFAULT_OPUS_MODEL={v.model}\n"
        f"export ANTHROPIC_DEFAULT_SONNET_MODEL={v.model}\n"
        f"export ANTHROPIC_DEFAULT_HAIKU_MODEL={v.model}\n"
        "export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1\n"  # no telemetry or update checks elsewhere
        "claude\n"
    ))


def _aider(v: _SnippetValues) -> Snippet:
    # litellm's "openai/" prefix: any OpenAI-compatible server; the prefix is stripped from requests
    return Snippet("aider", "aider", (
        f"aider --model openai/{v.model} \\\n"
        f"  --openai-api-base {v.openai} \\\n"
        f"  --openai-api-key {v.shown_key}\n"
    ))


def _opencode(v: _SnippetValues) -> Snippet:
    model: dict[str, Any] = {"name": v.model}
    if v.context_length:
        # opencode sends limit.output as max_tokens on every turn: leave the prompt most of the context
        model["limit"] = {"context": v.context_length, "output": min(4096, v.context_length // 4)}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "paddock": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Paddock Studio",
                "options": {"baseURL": v.openai, "apiKey": v.shown_key},
                "models": {v.model: model},
            }
        },
        "model": f"paddock/{v.model}",
    }
    return Snippet("opencode", "opencode (opencode.json)", json.dumps(config, indent=2) + "\n")


def _codex(v: _SnippetValues) -> Snippet:
    env = f'env_key = "PADDOCK_API_KEY"   # export PADDOCK_API_KEY={v.key}\n' if v.key else ""
    return Snippet("codex", "Codex CLI (~/.codex/config.toml)", (
        f"model = {json.dumps(v.model)}\n"
        'model_provider = "paddock"\n'
        "\n"
        "[model_providers.paddock]\n"
        'name = "Paddock Studio"\n'
        f"base_url = {json.dumps(v.openai)}\n"
        'wire_api = "responses"\n'
        f"{env}"
    ))


def _openai_sdk(v: _SnippetValues) -> Snippet:
    return Snippet("openai", "OpenAI SDK (Python)", (
        "from openai import OpenAI\n"
        "\n"
        f'client = OpenAI(base_url="{v.openai}", api_key="{v.shown_key}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{v.model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.choices[0].message.content)\n"
    ))


def _anthropic_sdk(v: _SnippetValues) -> Snippet:
    return Snippet("anthropic", "Anthropic SDK (Python)", (
        "from anthropic import Anthropic\n"
        "\n"
        f'client = Anthropic(base_url="{v.anthropic}", api_key="{v.shown_key}")\n'
        "reply = client.messages.create(\n"
        f'    model="{v.model}", max_tokens=256,\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.content[0].text)\n"
    ))


def _curl(v: _SnippetValues) -> Snippet:
    auth = f'  -H "Authorization: Bearer {v.key}" \\\n' if v.key else ""
    body = json.dumps({"model": v.model, "messages": [{"role": "user", "content": "Hello!"}]})
    return Snippet("curl", "curl", (
        f"curl {v.openai}/chat/completions \\\n"
        '  -H "Content-Type: application/json" \\\n'
        f"{auth}"
        f"  -d '{body}'\n"
    ))
