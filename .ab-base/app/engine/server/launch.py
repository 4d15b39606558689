"""Starting and stopping the API: in-process on a background thread (the Studio's toggle) or blocking (CLI)."""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from app.engine import EngineClient
from app.engine.server.embedder import Embedder
from app.engine.server.http_protocol import http_protocol
from app.engine.server.settings import ServerSettings

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 5  # open streams get this long to finish before they are cut


def warn_if_exposed(settings: ServerSettings) -> bool:
    """Log a warning (and return True) when the API listens beyond this machine without a key."""
    if settings.is_loopback or settings.api_key:
        return False
    log.warning(
        "The API listens on %s without an API key: anyone who can reach this machine can use the model. "
        "Set an API key (--api-key) or listen on 127.0.0.1.",
        settings.host,
    )
    return True


def _uvicorn_config(app: Any, settings: ServerSettings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        lifespan="on",
        http=http_protocol(settings.header_timeout_seconds),
    )


def _build_app(
    engine: EngineClient,
    embedder: Embedder | None,
    settings: ServerSettings,
    reranker: Any = None,
    speech_models: Sequence[Any] = (),
) -> Any:
    from app.engine.server.app import create_app

    return create_app(
        engine, embedder=embedder, settings=settings, reranker=reranker, speech_models=speech_models
    )


class ServerHandle:
    """uvicorn on a background thread. `start()` returns once the port accepts connections, `stop()` once it closed.

    Each start builds a fresh app (MCP's session manager runs once per app). The engine is
    not owned: stopping the server leaves it loaded.
    """

    def __init__(
        self,
        engine: EngineClient,
        *,
        settings: ServerSettings | None = None,
        embedder: Embedder | None = None,
        app_factory: Callable[[EngineClient, Embedder | None, ServerSettings], Any] | None = None,
        reranker: Any = None,
    ) -> None:
        """`reranker`: a model for /v1/rerank (tasks/rerank.py's Reranker), with the default app factory."""
        self.engine = engine
        self.settings = settings or ServerSettings()
        self.embedder = embedder
        self._app_factory = app_factory or functools.partial(_build_app, reranker=reranker)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.port: int | None = None
        self.app: Any = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        """The thread running the server's event loop (None when stopped)."""
        return self._thread

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server has not been started")
        host = self.settings.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)
        return f"http://{shown}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        if self.running:
            raise RuntimeError(f"the API server is already running at {self.base_url}")
        warn_if_exposed(self.settings)
        sock = _bind(self.settings.host, self.settings.port)
        self.port = sock.getsockname()[1]
        self.app = self._app_factory(self.engine, self.embedder, self.settings)
        self._server = uvicorn.Server(_uvicorn_config(self.app, self.settings))
        self._error = None
        self._thread = threading.Thread(
            target=self._run, args=(self._server, sock), name="paddock-api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the API server did not start on port {self.port}: {self._error!r}")
            time.sleep(0.01)
        log.info("API server listening at %s", self.base_url)

    def _run(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported by start(); a thread has nowhere else to raise
            self._error = exc
            log.exception("API server stopped with an error")
        finally:
            sock.close()

    def stop(self, timeout: float = 30.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"the API server did not stop within {timeout} s")
        self._thread = None
        self._server = None

    def __enter__(self) -> ServerHandle:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


def serve_blocking(
    engine: EngineClient,
    *,
    settings: ServerSettings,
    embedder: Embedder | None = None,
    reranker: Any = None,
    speech_models: Sequence[Any] = (),
) -> None:
    """Run until interrupted (Ctrl-C / SIGTERM): the `paddock serve` entry."""
    warn_if_exposed(settings)
    app = _build_app(engine, embedder, settings, reranker, speech_models)
    model = engine.model
    log.info(
        "serving %s (context %d tokens) at http://%s:%d",
        model.name,
        model.context_length,
        settings.host,
        settings.port,
    )
    uvicorn.Server(_uvicorn_config(app, settings)).run()
