"""Host cost of long contexts, without a model: the engine's own scheduler, KV cache manager,
radix tree, runner and decode-graph staging, timed per operation at 32k and 2k tokens.

    python bench/lab/host_cost.py                 # the table (median microseconds per operation)
    python bench/lab/host_cost.py --json out.json
    python bench/lab/host_cost.py --contexts 2000 --batches 64 128 256   # issue 38's curve past 32 sequences

What runs is the real code; only the device is replaced. `DecodeGraphs` gets numpy arrays where
it would hold pinned host memory and device buffers (its staging copy becomes a numpy copy) and
a no-op graph launch; the runner's eager metadata uses the numpy backend's `from_host`. So a
figure here is the host time the engine spends before a GPU could start on the step.

- admission: a request whose prompt repeats a cached prefix (a finished request of the same
  tokens) plus 140 new ones, as an agent's next turn: `Scheduler.add` + `schedule()` (radix match,
  lock, references, block allocation), then `finish` (the blocks go back to the tree).
- decode: B sequences at the context, one token a step: `schedule()`, `update()`, the runner's
  graph path (`run`: ids, positions, block tables, then `DecodeGraphs.run`: the cascade check,
  staging into the pinned area, slots), `DecodeGraphs.run` alone, and the eager path's
  `metadata()` (numpy backend, or CUDA steps no graph bucket holds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.engine.cache.manager import KVCacheManager
from app.engine.core.scheduler import Scheduler, SchedulerConfig
from app.engine.kernels.options import KernelOptions
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams
from app.engine.worker.decode_graphs import DecodeGraphs
from app.engine.worker.runner import ModelRunner

BLOCK_SIZE = 16
NEW_TOKENS = 140  # an agent turn's own tokens after the cached conversation


class _DeviceArray(np.ndarray):
    """A numpy array standing in for a CuPy device array: `set` is the host-to-device copy."""

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        self[...] = host


class _HostXp:
    """The few CuPy names DecodeGraphs uses, on numpy (pinned memory is a bytearray here)."""

    int32 = np.int32
    int64 = np.int64
    arange = staticmethod(np.arange)
    asarray = staticmethod(np.asarray)
    cuda = SimpleNamespace(Stream=SimpleNamespace(null=None), alloc_pinned_memory=bytearray)

    @staticmethod
    def zeros(shape: Any, dtype: Any) -> np.ndarray:
        return np.zeros(shape, dtype).view(_DeviceArray)


class _NoGraph:
    def launch(self, stream: Any = None) -> None:
        pass


def host_graphs(max_model_len: int, max_batch: int) -> DecodeGraphs:
    """DecodeGraphs over numpy, every bucket "captured" (cascade variants too, as on CUDA with
    PADDOCK_CASCADE on, so the shared-prefix check runs)."""
    backend = SimpleNamespace(xp=_HostXp, kernel_options=KernelOptions(cascade_attention=True, pdl=False))
    graphs = DecodeGraphs(None, backend, [], BLOCK_SIZE, max_model_len, max_batch)
    for n in graphs.buckets:
        graphs._graphs[n] = (_NoGraph(), np.zeros((n, 8), np.float32))
        if n >= 2:
            graphs._cascade_graphs[n] = (_NoGraph(), np.zeros((n, 8), np.float32))
    return graphs


def make_scheduler(num_blocks: int, max_model_len: int, max_num_seqs: int = 64) -> Scheduler:
    config = SchedulerConfig(max_num_seqs, 8192, max_model_len, BLOCK_SIZE)  # 8,192 tokens a step
    return Scheduler(config, KVCacheManager(num_blocks, BLOCK_SIZE))


def median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def timed(fn: Callable[..., Any], samples: list[int], *args: Any) -> Any:
    started = time.perf_counter_ns()
    result = fn(*args)
    samples.append(time.perf_counter_ns() - started)
    return result


def run_to_decode(scheduler: Scheduler, rng: np.random.Generator) -> None:
    """Step the scheduler (no model: every chunk is 'computed' at once) until all it runs decode."""
    while True:
        out = scheduler.schedule()
        if all(c.num_tokens == 1 for c in out.chunks):
            return
        scheduler.update(out, {c.request.request_id: int(rng.integers(256, 50_000)) for c in out.chunks})


def bench_admission(context: int, max_model_len: int, iterations: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    prefix = rng.integers(256, 50_000, size=context).tolist()
    scheduler = make_scheduler(4 * (context // BLOCK_SIZE) + 64, max_model_len)
    kv = scheduler.kv
    first = Request("prefix", list(prefix), SamplingParams(max_tokens=1))
    scheduler.add(first)
    run_to_decode(scheduler, rng)
    scheduler.finish(first, RequestStatus.FINISHED_STOPPED)  # its blocks go to the radix tree
    prompt = prefix + rng.integers(256, 50_000, size=NEW_TOKENS).tolist()
    admit: list[int] = []
    finish: list[int] = []
    match: list[int] = []
    for i in range(iterations):
        request = Request(f"turn{i}", prompt, SamplingParams(max_tokens=1))

        def admit_one(request: Request = request) -> Any:
            scheduler.add(request)
            return scheduler.schedule()

        out = timed(admit_one, admit)
        assert out.chunks[0].start == context and request.num_cached_tokens == context
        timed(lambda request=request: scheduler.finish(request, RequestStatus.FINISHED_ABORTED), finish)
        assert kv.prefix_cache is not None
        timed(lambda: kv.prefix_cache.match(prompt[:context], kv.extra_key), match)
    scheduler.check_integrity()
    return {
        "admit_us": median_us(admit),
        "finish_us": median_us(finish),
        "radix_match_us": median_us(match),
    }


def bench_decode(batch: int, context: int, max_model_len: int, steps: int) -> dict[str, float]:
    rng = np.random.default_rng(2)
    # the first prompts decode while the rest prefill (8,192 tokens a step): their blocks for those tokens too
    prefill_steps = -(-batch * context // 8192)
    blocks_per_seq = -(-(context + prefill_steps + steps + 64) // BLOCK_SIZE)
    scheduler = make_scheduler(batch * blocks_per_seq + 64, max_model_len, max_num_seqs=max(64, batch))
    for i in range(batch):
        tokens = rng.integers(256, 50_000, size=context).tolist()
        scheduler.add(Request(f"s{i}", tokens, SamplingParams(max_tokens=steps + 64)))
    run_to_decode(scheduler, rng)
    graphs = host_graphs(max_model_len, max_batch=max(32, batch))  # the engine's buckets reach 256
    runner = ModelRunner(None, SimpleNamespace(from_host=np.asarray), [], BLOCK_SIZE)
    runner.graphs = graphs
    eager = ModelRunner(None, SimpleNamespace(from_host=np.asarray), [], BLOCK_SIZE)
    samples: dict[str, list[int]] = {
        k: [] for k in ("schedule", "update", "runner_graph", "graphs_run", "eager_metadata")
    }
    for step in range(steps + 20):
        keep = step >= 20  # the first steps warm up
        t: dict[str, list[int]] = samples if keep else {k: [] for k in samples}
        out = timed(scheduler.schedule, t["schedule"])
        chunks = out.chunks
        assert len(chunks) == batch and all(c.num_tokens == 1 for c in chunks)
        timed(runner.run, t["runner_graph"], chunks)
        positions = np.array([c.start for c in chunks], dtype=np.int32)
        width = int(positions.max()) // BLOCK_SIZE + 1
        tables = np.zeros((batch, width), dtype=np.int32)
        for i, c in enumerate(chunks):
            tables[i, : min(width, len(c.request.block_ids))] = list(c.request.block_ids)[:width]
        ids = np.zeros(batch, np.int32)
        timed(graphs.run, t["graphs_run"], ids, positions, positions + 1, tables)
        timed(eager.metadata, t["eager_metadata"], chunks)
        sampled = {c.request.request_id: int(rng.integers(256, 50_000)) for c in chunks}
        timed(scheduler.update, t["update"], out, sampled)
    scheduler.check_integrity()
    return {f"{k}_us": median_us(v) for k, v in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[32_000, 2_000])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-model-len", type=int, default=40_960, help="sizes the graphs' staging area")
    parser.add_argument("--iterations", type=int, default=200, help="admissions per context")
    parser.add_argument("--steps", type=int, default=300, help="decode steps per batch and context")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for context in args.contexts:
        result = bench_admission(context, args.max_model_len, args.iterations)
        rows.append({"op": "admission", "context": context, "batch": 1, **result})
        for batch in args.batches:
            result = bench_decode(batch, context, args.max_model_len, args.steps)
            rows.append({"op": "decode", "context": context, "batch": batch, **result})
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}".strip(),
        "max_model_len": args.max_model_len,
        "rows": rows,
    }
    for row in rows:
        figures = ", ".join(f"{k[:-3]} {v:,.1f}" for k, v in row.items() if k.endswith("_us"))
        print(f"{row['op']:9} ctx {row['context']:>6,} batch {row['batch']:>3}: {figures} (us, median)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
