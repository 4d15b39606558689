"""Where the time to first token goes: one streaming chat request at a time through the real server,
with timestamps at each hand-over.

    python3 bench/lab/ttft_trace.py --model /tmp/qwen3-8b-q4_k_m.gguf --device cuda
    python3 bench/lab/ttft_trace.py --model /tmp/tiny.gguf --device cpu --simulate-ms 2.4

The engine and server run in this process (as `paddock serve` runs them); the client, a separate
process as `paddock bench` is, sends the bench workload's request (a 128-token user message,
streaming, 128 tokens, ignore_eos) `--requests` times in a row and reports when it sent each and
when each SSE line arrived. Server-side marks (time.perf_counter, one clock for both processes on
Linux): ASGI entry, route handler, prompt built (template + tokenizer), request handed to the
engine thread, engine step start and end, first output handed back, first SSE body written. Prints
the median ms of each mark after the send; TTFT is the first line with content.
`--simulate-ms` replaces the forward pass and sampler with bench/lab/host_path.py's simulated device.
`--prefix-tokens 8000` puts the same ~8,000-token system message before each user message (issue 38's cached-prefix
row): from the second request it is cached, and the marks show the host's share of that TTFT (template and
tokenizer over the whole conversation, the prefix lookup).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CLIENT = r"""
import json, sys, time, httpx
url, n, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
words = "the quick brown fox jumps over a lazy dog while seven cats watch".split()


def text_of(count, salt):  # about `count` tokens of text
    words_needed = " ".join(f"{w}{salt if i % 7 == 0 else ''}" for i, w in enumerate(words * (count // 5 + 20)))
    ids = httpx.post(url + "/tokenize", json={"model": model, "prompt": words_needed, "add_special_tokens": False})
    return httpx.post(url + "/detokenize", json={"model": model, "tokens": ids.json()["tokens"][:count]}).json()["prompt"]


messages = [{"role": "user", "content": text_of(128, "")}]
if prefix:  # the same long system message every request: cached after the first
    messages.insert(0, {"role": "system", "content": text_of(prefix, "s")})
body = {"model": model, "messages": messages, "max_tokens": 128, "min_tokens": 128,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
rows = []
with httpx.Client(base_url=url, timeout=120) as client:
    for _ in range(n):
        sent, first, lines = time.perf_counter(), None, []
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(time.perf_counter())
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = lines[-1]
        rows.append({"sent": sent, "first_content": first, "line0": lines[0], "line1": lines[1], "end": lines[-1]})
        time.sleep(0.02)
print(json.dumps(rows))
"""


class Marks:
    """First time of each named mark per request; a new request starts at the ASGI entry."""

    def __init__(self) -> None:
        self.requests: list[dict[str, float]] = []

    def start(self) -> None:
        self.requests.append({"asgi": time.perf_counter()})

    def mark(self, name: str) -> None:
        if self.requests:
            self.requests[-1].setdefault(name, time.perf_counter())


def instrument(engine, marks: Marks) -> None:
    """Wrap the hand-over points of the request path with marks."""
    import fastapi

    import app.engine.core.async_engine as client_module
    import app.engine.server.serving_chat as serving_chat

    app_call = fastapi.FastAPI.__call__

    async def asgi(self, scope, receive, send):
        if scope.get("path") != "/v1/chat/completions":
            return await app_call(self, scope, receive, send)
        marks.start()

        async def marked_send(message):
            if message.get("type") == "http.response.body" and message.get("body"):
                marks.mark("first_body_written")
            await send(message)

        return await app_call(self, scope, receive, marked_send)

    fastapi.FastAPI.__call__ = asgi
    create, plan = serving_chat.OpenAIServingChat.create, serving_chat.OpenAIServingChat.plan

    async def marked_create(self, req, *args, **kwargs):
        marks.mark("handler")
        return await create(self, req, *args, **kwargs)

    def marked_plan(self, req):
        result = plan(self, req)
        marks.mark("prompt_built")
        return result

    serving_chat.OpenAIServingChat.create = marked_create
    serving_chat.OpenAIServingChat.plan = marked_plan
    send = client_module.AsyncEngine._send

    def marked_send_command(self, command):
        if command[0] == "add":
            marks.mark("to_engine_thread")
        return send(self, command)

    client_module.AsyncEngine._send = marked_send_command
    deliver = client_module.AsyncEngine._deliver_step

    def marked_deliver(self, outputs):
        if any(o.new_token_ids for o in outputs):
            marks.mark("first_output_delivered")
        return deliver(self, outputs)

    client_module.AsyncEngine._deliver_step = marked_deliver
    step = engine.step

    def marked_step():
        marks.mark("first_step_start")
        result = step()
        marks.mark("first_step_end")
        return result

    engine.step = marked_step


def main() -> int:
    from app.engine.config import EngineConfig
    from app.engine.core.async_engine import AsyncEngine
    from app.engine.core.engine import LLMEngine
    from app.engine.server.launch import ServerHandle
    from app.engine.server.settings import ServerSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument(
        "--simulate-ms", type=float, default=None, help="simulated decode step (host_path.py)"
    )
    parser.add_argument("--port", type=int, default=11781)
    parser.add_argument("--prefix-tokens", type=int, default=0,
                        help="a system message of about this many tokens before each request's user message, the same "
                             "every time (issue 38's cached-prefix row: 8000)")  # fmt: skip
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, device=args.device, max_model_len=4096 + args.prefix_tokens,
                                    max_num_seqs=32))  # fmt: skip
    if args.simulate_ms is not None:
        from host_path import SimulatedDevice

        SimulatedDevice(engine, args.simulate_ms, 0.0)
    marks = Marks()
    instrument(engine, marks)
    client = AsyncEngine(engine=engine)
    settings = ServerSettings(port=args.port, log_level="warning", enable_mcp=False)  # as gpu_run.sh serves
    server = ServerHandle(client, settings=settings)
    server.start()
    try:
        done = subprocess.run([sys.executable, "-c", CLIENT, server.base_url, str(args.requests), str(args.prefix_tokens)],
                              capture_output=True, text=True, check=True)  # fmt: skip
    finally:
        server.stop()
        client.close()
    rows = json.loads(done.stdout)
    warm = list(zip(rows, marks.requests, strict=True))[2:]  # the first requests compile and warm up
    table: dict[str, list[float]] = {}
    for row, server_marks in warm:
        points = {**server_marks, **{f"client_{k}": v for k, v in row.items() if k != "sent" and v}}
        for name, t in points.items():
            table.setdefault(name, []).append(1000 * (t - row["sent"]))
    summary = {name: round(statistics.median(ms), 2) for name, ms in table.items()}
    print(json.dumps(dict(sorted(summary.items(), key=lambda kv: kv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
