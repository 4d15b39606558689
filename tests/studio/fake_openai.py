"""A local OpenAI-compatible chat server that streams, for compare tests.

`FakeOpenAI(mode=...)`:
- "ok": streams `reply` word by word (SSE, chunked), then a usage chunk and [DONE];
- "slow": the same, but holds the first token until `gate` is set (a test sets it when
  it has seen what it wanted meanwhile), then waits `delay_s` between chunks;
- "fail": answers HTTP 500 with an OpenAI-style error body;
- "drop": streams two chunks, then breaks the connection.
With `api_key` set, a request without that bearer key gets 401 as OpenAI answers it; a
model other than `model` gets 404.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, mode: str = "ok", reply: str = "The quick brown fox jumps.", model: str = "fake-model",
                 api_key: str | None = None, delay_s: float = 0.0) -> None:
        self.mode, self.reply, self.model, self.api_key, self.delay_s = mode, reply, model, api_key, delay_s
        self.gate = threading.Event()
        self.bodies: list[dict] = []

    def start(self) -> str:
        server_state = self

        class Handler(_Handler):
            state = server_state

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        return self.base_url

    def stop(self) -> None:
        self.gate.set()  # release a held stream so its thread can end
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def fake_servers() -> Iterator[Callable[..., FakeOpenAI]]:
    """`start(mode="ok", **options)` starts a FakeOpenAI; every one started is stopped on exit."""
    started: list[FakeOpenAI] = []

    def start(mode: str = "ok", **kwargs) -> FakeOpenAI:
        server = FakeOpenAI(mode=mode, **kwargs)
        server.start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


class _Handler(BaseHTTPRequestHandler):
    state: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": self.state.model, "object": "model"}]})
        self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.state.bodies.append(body)
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        if self.state.api_key and self.headers.get("Authorization") != f"Bearer {self.state.api_key}":
            return self._json(401, {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error",
                                              "code": "invalid_api_key"}})
        if body.get("model") != self.state.model:
            return self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        if self.state.mode == "fail":
            return self._json(500, {"error": {"message": "The model crashed.", "type": "server_error"}})
        self._stream(body)

    def _stream(self, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.state.mode == "slow":
            self.state.gate.wait(30)
        words = self.state.reply.split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        for i, piece in enumerate(pieces):
            if self.state.mode == "drop" and i == 2:
                self.wfile.write(b"5\r\ndata:")  # a chunk cut short, then the connection dies
                self.wfile.flush()
                self.connection.shutdown(2)
                self.close_connection = True
                return
            self._event({"id": "c1", "object": "chat.completion.chunk", "model": self.state.model,
                         "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
            if self.state.delay_s:
                time.sleep(self.state.delay_s)
        self._event({"id": "c1", "object": "chat.completion.chunk", "model": self.state.model,
                     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                         "usage": {"prompt_tokens": 7, "completion_tokens": len(pieces),
                                   "total_tokens": 7 + len(pieces)}})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, payload: dict) -> None:
        self._chunk(f"data: {json.dumps(payload)}\n\n".encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
