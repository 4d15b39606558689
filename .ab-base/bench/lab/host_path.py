"""How fast can the host side serve tokens? The real server and engine over a simulated device.

Everything between HTTP and the device runs for real (uvicorn, the protocol layer,
AsyncEngine, scheduler, KV block accounting, detokenizer, stop checks, SSE framing);
only the forward pass and the sampler are replaced: a step takes the time the GPU would take
(`--decode-ms` per step, plus `--prefill-us` per prompt token in the step) on a simulated GPU
timeline, the engine sleeping where it would wait for the GPU (the sleep releases the GIL as a
wait on the GPU does), and the sampler returns random ids. So the ITL this reports above
`--decode-ms` is the host's own cost, measurable without a GPU; with PADDOCK_ASYNC_DECODE=1 the
engine launches decode steps one ahead (core/pipeline.py) and hides that cost behind them.

    python bench/lab/host_path.py --model /tmp/tiny.gguf --concurrency 32 --requests 96 --decode-ms 2.5

It prints `paddock bench`'s JSON with the simulated step times and the engine thread's
host time per step added. `server_loop_cpu_us_per_token` is the event loop thread's CPU time per streamed token. `--profile out.txt` writes a yappi profile of all threads (wall clock; with
HOST_PATH_CLOCK=cpu, each thread's CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine
from app.engine.core.engine import LLMEngine
from app.engine.sample.sampler import SamplerOutput
from app.engine.server.launch import ServerHandle
from app.engine.server.settings import ServerSettings


class SimulatedDevice:
    """Stands in for the runner's forward passes and the sampler. Work is queued on a simulated
    GPU timeline (a step starts when the one before it has finished and ends its step time
    later), and the engine thread sleeps only where it would wait for the GPU: in `sample()`,
    or, with async decode (PADDOCK_ASYNC_DECODE=1), when it resolves a launched step. Counts the
    wall time of engine steps and the time spent waiting, whose difference is the host's cost."""

    def __init__(
        self, engine: LLMEngine, decode_ms: float, prefill_us: float, eager_launch_ms: float = 0.0
    ) -> None:
        self.engine = engine
        self.eager_launch_s = eager_launch_ms / 1000
        self.decode_s = decode_ms / 1000
        self.prefill_s = prefill_us / 1e6
        self.vocab = engine.model_config.vocab_size
        self.rng = np.random.default_rng(0)
        self.steps = 0
        self.waited_s = 0.0
        self.step_s = 0.0
        self.free_at = 0.0  # when the simulated GPU is done with the work queued so far
        engine.runner.run = self.run
        engine.runner.run_from_device = self.run_from_device
        engine.sampler.sample = self.sample
        engine.sampler.launch = self.launch
        inner_step = engine.step

        def timed_step():  # wall time of whole engine steps, to subtract the waits for the device
            started = time.perf_counter()
            try:
                return inner_step()
            finally:
                self.step_s += time.perf_counter() - started
                self.steps += 1

        engine.step = timed_step

    def run(self, chunks: list) -> object:
        prompt_tokens = sum(c.num_tokens for c in chunks if c.num_tokens > 1)
        if prompt_tokens and self.eager_launch_s:  # an eager step's kernel launches keep the host busy
            launched = time.perf_counter() + self.eager_launch_s
            while time.perf_counter() < launched:
                pass
        self.free_at = max(time.perf_counter(), self.free_at) + self.decode_s + self.prefill_s * prompt_tokens
        return None

    def run_from_device(self, chunks: list, device_ids: object, rows: object) -> object:
        return self.run(chunks)

    def sample(self, logits: object, requests: list) -> SamplerOutput:
        self._wait(self.free_at)
        return SamplerOutput(self._ids(len(requests)), [None] * len(requests))

    def launch(self, logits: object, requests: list) -> object:
        ids, ready = self._ids(len(requests)), self.free_at
        device = self

        class Pending:
            device_ids = np.asarray(ids, dtype=np.int32)

            def resolve(self) -> SamplerOutput:
                device._wait(ready)
                return SamplerOutput(ids, [None] * len(ids))

        return Pending()

    def _ids(self, n: int) -> list[int]:
        return self.rng.integers(256, self.vocab, size=n).tolist()  # above the byte tokens

    def _wait(self, until: float) -> None:
        """Sleep until the simulated GPU reaches `until` (a sleep releases the GIL, as a wait on
        the GPU does)."""
        seconds = until - time.perf_counter()
        if seconds > 0:
            time.sleep(seconds)
            self.waited_s += seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a GGUF (bench/make_random_gguf.py --shape tiny)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--decode-ms", type=float, default=2.5, help="simulated time of one decode step")
    parser.add_argument("--prefill-us", type=float, default=20.0, help="simulated time per prompt token")
    parser.add_argument(
        "--eager-launch-ms",
        type=float,
        default=0.0,
        help="host time of launching a step with prompt tokens (eager, not a graph replay)",
    )
    parser.add_argument("--port", type=int, default=11761)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--profile", type=Path, default=None, help="write a yappi profile here")
    parser.add_argument("--bench-args", default="", help="more `paddock bench` flags, e.g. \"--prefix-tokens 8000\"")
    args = parser.parse_args()

    config = EngineConfig(model=args.model, device="cpu", max_num_seqs=max(32, args.concurrency),
                          max_model_len=args.max_model_len)  # fmt: skip
    engine = LLMEngine(config)
    device = SimulatedDevice(engine, args.decode_ms, args.prefill_us, args.eager_launch_ms)
    client = AsyncEngine(engine=engine)
    server = ServerHandle(client, settings=ServerSettings(port=args.port, log_level="warning"))
    server.start()
    if args.profile:
        import yappi

        yappi.set_clock_type(os.environ.get("HOST_PATH_CLOCK", "wall"))
        yappi.start()
    assert server.thread is not None and server.thread.ident is not None
    loop_clock = time.pthread_getcpuclockid(server.thread.ident)  # the event loop's thread: its CPU time alone
    loop_cpu = time.clock_gettime(loop_clock)
    bench = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "--url", server.base_url, "--concurrency",
         str(args.concurrency), "--requests", str(args.requests), "--json", *args.bench_args.split()],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    loop_cpu = time.clock_gettime(loop_clock) - loop_cpu
    if args.profile:
        yappi.stop()
        with args.profile.open("w") as fh:
            for thread in yappi.get_thread_stats():
                fh.write(f"=== thread {thread.name} ({thread.id}) total {thread.ttot:.2f} s\n")
                stats = yappi.get_func_stats(ctx_id=thread.id).sort("tsub")
                stats.print_all(
                    out=fh, columns={0: ("name", 90), 1: ("ncall", 10), 3: ("tsub", 8), 4: ("ttot", 8)}
                )
    server.stop()
    client.close()
    if bench.returncode != 0:
        print(bench.stderr, file=sys.stderr)
        return 1
    summary = json.loads(bench.stdout.strip().splitlines()[-1])
    summary.update(
        simulated_decode_ms=args.decode_ms,
        simulated_prefill_us_per_token=args.prefill_us,
        simulated_eager_launch_ms=args.eager_launch_ms,
        engine_steps=device.steps,
        async_decode=engine.async_decode,
        engine_host_ms_per_step=1000 * (device.step_s - device.waited_s) / max(1, device.steps),
        # the server's event loop (HTTP, protocol, SSE framing) per streamed token: it shares the interpreter
        # lock with the engine thread, so at c streams it adds up to c times this to each step's host work
        server_loop_cpu_us_per_token=1e6 * loop_cpu / max(1, summary["output_tokens_total"]),
        threads=threading.active_count(),
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
