"""`paddock bench` spreads a large load over client processes (one Python process reads ~10k streamed chunks
a second): the processes' results join into one report, every session once, against a local imitation of an
OpenAI-compatible streaming server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from app.cli import build_parser
from app.commands import bench
from app.commands.bench_load import STREAMS_PER_PROCESS, load_processes


class _Imitation(BaseHTTPRequestHandler):
    """/v1/models, /tokenize, /detokenize (a token per word) and streamed chat completions of exactly
    max_tokens pieces with a usage chunk; every chat request's body is kept on the server."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"object": "list", "data": [{"id": "imitation", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._json({"tokens": list(range(len(body["prompt"].split())))})
        elif self.path == "/detokenize":
            self._json({"prompt": " ".join(f"w{i}" for i in body["tokens"])})
        else:
            self.server.chat_bodies.append(body)  # type: ignore[attr-defined]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(body["max_tokens"]):
                chunk = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"], "total_tokens": 5 + body["max_tokens"]}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            self.close_connection = True


@pytest.fixture
def imitation() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imitation)
    server.chat_bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_two_processes_carry_every_session_once_into_one_report(imitation: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{imitation.server_address[1]}"
    args = build_parser().parse_args([
        "bench", "--url", url, "--concurrency", "4", "--requests", "8", "--warmup", "2", "--processes", "2",
        "--input-tokens", "6", "--output-tokens", "3",
    ])  # fmt: skip

    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await bench.measure(args, client)

    summary, results = asyncio.run(go())
    assert summary["load_processes"] == 2
    assert (summary["requests"], summary["output_tokens_total"]) == (8, 24)
    assert sorted(r.session for r in results) == list(range(8))  # each timed session once, numbered as one run
    assert all(r.output_tokens == 3 and r.answer == " t0 t1 t2" for r in results)
    assert len(imitation.chat_bodies) == 2 + 8  # the warm-up, then the timed requests from both processes
    assert summary["output_throughput_tok_s"] > 0 and summary["wall_s"] > 0


def test_the_default_spreads_from_twice_a_process_streams_up_to_the_cpus() -> None:
    assert load_processes(None, 1, 16) == 1
    assert load_processes(None, 2 * STREAMS_PER_PROCESS - 1, 16) == 1
    assert load_processes(None, 128, 16) == 128 // STREAMS_PER_PROCESS
    assert load_processes(None, 256, 4) == 4  # no more processes than CPUs
    assert load_processes(None, 256, None) == 1
    assert load_processes(3, 128, 2) == 3  # asked for: as asked,
    assert load_processes(8, 4, 2) == 4  # but never more processes than streams
