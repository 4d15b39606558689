"""Where a served step of a hybrid model goes: the engine under `paddock bench`'s closed loop, step by step.

    python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-27b-8l.gguf --concurrency 32 --requests 64
    # a file cut to 8 layers with the whole model's snapshot rows on an H100 and its --kv-host-gb 4 in rows
    # (27B: ~157 MB a row, 66 device rows, 27 host rows; 35B-A3B: ~66 MB, ~136 and ~62)
    python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-27b-8l.gguf --snapshot-rows 66 --kv-host-gb 0.52
    python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-35b-a3b-8l.gguf --snapshot-rows 136 --kv-host-gb 0.8
    python3 bench/lab/hybrid_serve_trace.py /tmp/tiny.gguf --device cpu --concurrency 4 --requests 8 --output-tokens 16
    # the served c=32 wave (147-token prompts, no warm-up), step by step; --legacy-cuts: as before session 17
    python3 bench/lab/hybrid_serve_trace.py /tmp/qwen35-27b-8l.gguf --concurrency 32 --requests 32 --warmup 0 \
        --prompt-tokens 139 --output-tokens 4 --steps [--legacy-cuts]

Drives `LLMEngine` directly (as bench/suite/gpu_engine.py does, no HTTP) with the arrival pattern of
`paddock bench --concurrency C` (app/commands/bench.py): `--warmup` requests (default C) first, then
`--requests` timed ones, C in flight at a time (a finished request's successor is added before the next
step, as a bench worker sends its next request when the last one ends), every request `--prompt-tokens`
random ids between a shared chat head and tail (`--head-tokens`, `--tail-tokens`: the template's turn
markers), `--output-tokens` out (ignore_eos), prompts drawn from a pool of at most 64 as bench draws them
(so timed requests past the pool reuse warm-up prompts: prefix-cache hits, as in the served runs), with
`paddock serve`'s defaults where they differ from EngineConfig's (`--kv-host-gb 4`: evicted snapshots spill
to host RAM; `--max-model-len 16384` as the served runs' --max-ctx).

Each step of the timed phase is recorded: its kind (decode: every chunk one token of output; prefill: no
such chunk; mixed: both), wall ms of `engine.step()`, the part spent waiting on the device (the sampler's
read-back and the look-ahead's resolve: the rest is host time), the host ms of schedule and of the
runner's call, whether the forward replayed a decode graph, a prefill graph or ran eagerly, the tokens,
and the recurrent-state copies the scheduler asked for (restores, loads from host RAM, spills, saves of
prefill and of decode snapshots, speculative checkpoints) in rows and bytes. On CUDA the forward and the
state copies are also timed on the GPU with event pairs (their span on the stream, idle gaps included).
Prints a table per step kind, the state-copy totals, TTFT and ITL p50/p90 (ITL as aiperf: (latency -
TTFT) / (tokens - 1)) and output tok/s; `--json FILE` writes every step's record and the summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.plan.shape import shape_from_checkpoint
from app.engine.sampling_params import SamplingParams

PROMPT_POOL = 64  # app/commands/bench.py: distinct prompts per run at most
COPY_KINDS = ("restores", "loads", "spills", "checkpoints", "saves_prefill", "saves_decode")


@dataclass
class StepRecord:
    kind: str  # decode | mixed | prefill
    wall_ms: float
    wait_ms: float  # blocked on the device (sampler read-back, look-ahead resolve)
    schedule_ms: float
    run_host_ms: float  # host time inside the runner's forward call (launches, metadata, eager ops)
    states_host_ms: float  # host time of the state copies around it (a spill to host RAM waits for the GPU)
    path: str  # decode-graph | prefill-graph | eager | none
    chunks: int
    decodes: int
    prefill_tokens: int
    preempted: int
    copy_rows: dict[str, int] = field(default_factory=dict)
    chunk_sizes: dict[int, int] = field(default_factory=dict)  # prefill chunk tokens -> how many chunks
    first_tokens: int = 0  # chunks that sampled a request's first token
    gpu_forward_ms: float | None = None  # CUDA: event span of the forward on the stream
    gpu_states_ms: float | None = None  # CUDA: event span of the state copies before + after

    @property
    def host_ms(self) -> float:
        return self.wall_ms - self.wait_ms


@dataclass
class _Live:
    """The step being recorded: what the wrappers saw."""

    wait: float = 0.0
    schedule: float = 0.0
    run_host: float = 0.0
    states_host: float = 0.0
    path: str = "none"
    scheduled: Any = None
    events: list[tuple[str, Any, Any]] = field(default_factory=list)


class Tracer:
    """Wraps the engine's scheduler, runner, sampler and pipeline (instance attributes shadow the methods)
    to record each step; a no-op on what they return."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.cuda = engine.backend.name == "cuda"
        runner = engine.runner
        self.row_bytes = sum(int(a[0].nbytes) for a in runner.state_arrays)
        self.live = _Live()
        self.records: list[StepRecord] = []
        self._pending_events: list[tuple[StepRecord, list[tuple[str, Any, Any]]]] = []
        self._wrap(engine.scheduler, "schedule", self._timed_schedule)
        if self.cuda:  # the points where the host waits for the GPU (on the CPU, sampling is host work)
            self._wrap(engine.sampler, "sample", self._waited)
            self._wrap(engine.pipeline, "resolve", self._waited)
        self._wrap(runner, "run", self._forward("eager"))
        self._wrap(runner, "run_from_device", self._forward("eager"))
        self._wrap(runner, "_run_graph", self._path("decode-graph"))
        if runner.prefill_graphs is not None:
            self._wrap(runner.prefill_graphs, "run", self._path("prefill-graph"))
        self._wrap(runner, "states_before", self._states)
        self._wrap(runner, "states_after", self._states)

    @staticmethod
    def _wrap(obj: Any, name: str, wrapper: Callable[[Callable], Callable]) -> None:
        setattr(obj, name, wrapper(getattr(obj, name)))

    def _timed_schedule(self, fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.live.schedule += time.perf_counter() - t0
            self.live.scheduled = out
            return out

        return run

    def _waited(self, fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.live.wait += time.perf_counter() - t0

        return run

    def _forward(self, default_path: str) -> Callable[[Callable], Callable]:
        def wrapper(fn: Callable) -> Callable:
            def run(*args: Any, **kwargs: Any) -> Any:
                if self.live.path == "none":
                    self.live.path = default_path
                start = self._event()
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self.live.run_host += time.perf_counter() - t0
                self._mark("forward", start)
                return out

            return run

        return wrapper

    def _path(self, path: str) -> Callable[[Callable], Callable]:
        def wrapper(fn: Callable) -> Callable:
            def run(*args: Any, **kwargs: Any) -> Any:
                self.live.path = path
                return fn(*args, **kwargs)

            return run

        return wrapper

    def _states(self, fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = self._event()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.live.states_host += time.perf_counter() - t0
            self._mark("states", start)
            return out

        return run

    def _event(self) -> Any:
        if not self.cuda:
            return None
        import cupy

        event = cupy.cuda.Event()
        event.record()
        return event

    def _mark(self, what: str, start: Any) -> None:
        if start is not None:
            self.live.events.append((what, start, self._event()))

    # -- one step ---------------------------------------------------------------------
    def step(self) -> list[Any]:
        """`engine.step()`, recorded."""
        self.live = _Live()
        t0 = time.perf_counter()
        outputs = self.engine.step()
        wall = time.perf_counter() - t0
        live = self.live
        if live.scheduled is None or not live.scheduled.chunks:
            return outputs
        record = self._record(live, wall)
        self.records.append(record)
        if live.events:
            self._pending_events.append((record, live.events))
        return outputs

    def _record(self, live: _Live, wall: float) -> StepRecord:
        scheduled = live.scheduled
        decodes = [c for c in scheduled.chunks if _is_decode(c)]
        prefill = [c for c in scheduled.chunks if not _is_decode(c)]
        kind = "mixed" if decodes and prefill else "decode" if decodes else "prefill"
        return StepRecord(
            kind=kind,
            wall_ms=1000 * wall,
            wait_ms=1000 * live.wait,
            schedule_ms=1000 * live.schedule,
            run_host_ms=1000 * live.run_host,
            states_host_ms=1000 * live.states_host,
            path=live.path,
            chunks=len(scheduled.chunks),
            decodes=len(decodes),
            prefill_tokens=sum(c.num_tokens for c in prefill),
            preempted=len(scheduled.preempted),
            copy_rows=copy_rows(scheduled),
            chunk_sizes=dict(sorted(Counter(c.num_tokens for c in prefill).items(), reverse=True)),
            first_tokens=sum(1 for c in scheduled.chunks if c.samples and c.start < c.request.num_prompt_tokens),
        )

    def finish(self) -> None:
        """Read the CUDA event pairs (after a device sync) into their records."""
        if not self._pending_events:
            return
        import cupy

        cupy.cuda.Device().synchronize()
        for record, events in self._pending_events:
            spans: dict[str, float] = defaultdict(float)
            for what, start, end in events:
                spans[what] += cupy.cuda.get_elapsed_time(start, end)
            record.gpu_forward_ms = spans.get("forward")
            record.gpu_states_ms = spans.get("states")
        self._pending_events.clear()


def _is_decode(chunk: Any) -> bool:
    """One token of output (a running request's next token), not part of a prompt or a recompute."""
    return chunk.num_tokens - len(chunk.draft_token_ids) == 1 and chunk.start >= chunk.request.num_prompt_tokens


def copy_rows(scheduled: Any) -> dict[str, int]:
    """The step's recurrent-state row copies by kind; a save is a decode's (a held row) or a prefill's by the
    chunk of the slot it copies."""
    copies = scheduled.state
    kinds = {c.request.state_slot: _is_decode(c) for c in scheduled.chunks if c.request.state_slot is not None}
    decode_saves = sum(1 for slot, _ in copies.saves if kinds.get(slot, False))
    return {
        "restores": len(copies.restores),
        "loads": len(copies.loads),
        "spills": len(copies.spills),
        "checkpoints": len(copies.checkpoints),
        "saves_prefill": len(copies.saves) - decode_saves,
        "saves_decode": decode_saves,
    }


# -- the load ---------------------------------------------------------------------------
@dataclass
class RequestTimes:
    added: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0


def make_prompts(vocab: int, count: int, args: argparse.Namespace, seed: int = 0) -> list[list[int]]:
    """`count` prompts: the shared head, `--prompt-tokens` random ids, the shared tail."""
    rng = np.random.default_rng(seed)
    low, high = 4, max(5, vocab - 8)  # clear of the small special ids and of the top ids (eos in test files)
    head = rng.integers(low, high, size=args.head_tokens).tolist()
    tail = rng.integers(low, high, size=args.tail_tokens).tolist()
    return [head + rng.integers(low, high, size=args.prompt_tokens).tolist() + tail for _ in range(count)]


def drive(engine: LLMEngine, tracer: Tracer | None, prompts: list[list[int]], concurrency: int,
          output_tokens: int, tag: str) -> tuple[dict[str, RequestTimes], float]:  # fmt: skip
    """Run `prompts` closed-loop, `concurrency` in flight; each request's times and the wall seconds."""
    params = SamplingParams(temperature=1.0, max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True)
    times: dict[str, RequestTimes] = {}
    queue = list(enumerate(prompts))
    queue.reverse()
    in_flight = 0
    started = time.perf_counter()

    def admit() -> None:
        nonlocal in_flight
        while queue and in_flight < concurrency:
            i, ids = queue.pop()
            rid = f"{tag}-{i}"
            engine.add_request(rid, ids, params, session_id=rid)
            times[rid] = RequestTimes(added=time.perf_counter())
            in_flight += 1

    admit()
    while engine.has_unfinished():
        outputs = tracer.step() if tracer is not None else engine.step()
        now = time.perf_counter()
        for out in outputs:
            t = times[out.request_id]
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            if out.new_token_ids:
                t.first = t.first if t.first is not None else now
                t.last = now
                t.tokens += len(out.new_token_ids)
            if out.finished:
                in_flight -= 1
        admit()
    return times, time.perf_counter() - started


# -- the report -------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(records: list[StepRecord], times: dict[str, RequestTimes], wall: float, row_bytes: int) -> dict:
    kinds: dict[str, Any] = {}
    for kind in ("decode", "mixed", "prefill"):
        rows = [r for r in records if r.kind == kind]
        if not rows:
            continue
        gpu = [r.gpu_forward_ms for r in rows if r.gpu_forward_ms is not None]
        states = [r.gpu_states_ms for r in rows if r.gpu_states_ms is not None]
        copied = Counter()
        for r in rows:
            copied.update(r.copy_rows)
        kinds[kind] = {
            "steps": len(rows),
            "wall_ms_p50": _pct([r.wall_ms for r in rows], 50),
            "wall_ms_p90": _pct([r.wall_ms for r in rows], 90),
            "wall_ms_total": sum(r.wall_ms for r in rows),
            "host_ms_p50": _pct([r.host_ms for r in rows], 50),
            "wait_ms_p50": _pct([r.wait_ms for r in rows], 50),
            "schedule_ms_p50": _pct([r.schedule_ms for r in rows], 50),
            "run_host_ms_p50": _pct([r.run_host_ms for r in rows], 50),
            "states_host_ms_p50": _pct([r.states_host_ms for r in rows], 50),
            "states_host_ms_total": sum(r.states_host_ms for r in rows),
            "gpu_forward_ms_p50": _pct(gpu, 50) if gpu else None,
            "gpu_states_ms_p50": _pct(states, 50) if states else None,
            "gpu_states_ms_total": sum(states) if states else None,
            "paths": dict(Counter(r.path for r in rows)),
            "decode_rows_mean": statistics.fmean(r.decodes for r in rows),
            "prefill_tokens_mean": statistics.fmean(r.prefill_tokens for r in rows),
            "prefill_tokens_total": sum(r.prefill_tokens for r in rows),
            "preempted": sum(r.preempted for r in rows),
            "state_rows_copied": dict(copied),
            "state_mb_copied": round(sum(copied.values()) * row_bytes / 1e6, 1),
        }
    done = [t for t in times.values() if t.first is not None]
    ttft = [1000 * (t.first - t.added) for t in done]
    itl = [1000 * (t.last - t.first) / (t.tokens - 1) for t in done if t.tokens > 1 and t.last is not None]
    total_copies = Counter()
    for r in records:
        total_copies.update(r.copy_rows)
    return {
        "steps": len(records),
        "wall_s": wall,
        "output_tok_s": sum(t.tokens for t in times.values()) / wall,
        "ttft_ms_p50": _pct(ttft, 50),
        "ttft_ms_p90": _pct(ttft, 90),
        "itl_ms_p50": _pct(itl, 50),
        "itl_ms_p90": _pct(itl, 90),
        "state_row_mb": row_bytes / 1e6,
        "state_rows_copied": {k: total_copies[k] for k in COPY_KINDS},
        "state_gb_copied": sum(total_copies.values()) * row_bytes / 1e9,
        "by_kind": kinds,
    }


def print_summary(summary: dict, plan: str) -> None:
    print(plan)
    print(f"{summary['steps']} steps in {summary['wall_s']:.2f} s: {summary['output_tok_s']:.1f} output tok/s; "
          f"TTFT p50 {summary['ttft_ms_p50']:.1f} ms p90 {summary['ttft_ms_p90']:.1f} ms; "
          f"ITL p50 {summary['itl_ms_p50']:.2f} ms p90 {summary['itl_ms_p90']:.2f} ms")  # fmt: skip
    head = (f"{'kind':8}{'steps':>6}{'wall p50':>10}{'p90':>9}{'total s':>9}{'host p50':>10}{'wait p50':>10}"
            f"{'sched':>7}{'run':>8}{'states':>8}{'gpu fwd':>9}{'gpu st':>8}{'dec rows':>9}{'pf tok':>8}{'st MB':>9}  paths")
    print(head)
    for kind, k in summary["by_kind"].items():
        gpu = "-" if k["gpu_forward_ms_p50"] is None else f"{k['gpu_forward_ms_p50']:.2f}"
        st = "-" if k["gpu_states_ms_p50"] is None else f"{k['gpu_states_ms_p50']:.2f}"
        print(f"{kind:8}{k['steps']:>6}{k['wall_ms_p50']:>10.2f}{k['wall_ms_p90']:>9.2f}{k['wall_ms_total'] / 1000:>9.2f}"
              f"{k['host_ms_p50']:>10.2f}{k['wait_ms_p50']:>10.2f}{k['schedule_ms_p50']:>7.2f}{k['run_host_ms_p50']:>8.2f}"
              f"{k['states_host_ms_p50']:>8.2f}"
              f"{gpu:>9}{st:>8}{k['decode_rows_mean']:>9.1f}{k['prefill_tokens_mean']:>8.0f}{k['state_mb_copied']:>9.1f}"
              f"  {k['paths']}")  # fmt: skip
    rows = summary["state_rows_copied"]
    print(f"state copies ({summary['state_row_mb']:.2f} MB a row): "
          + ", ".join(f"{k} {v}" for k, v in rows.items())
          + f"; {summary['state_gb_copied']:.2f} GB in all; host ms in the copies "
          + ", ".join(f"{kind} {k['states_host_ms_total']:.0f}" for kind, k in summary["by_kind"].items()))  # fmt: skip


def print_steps(records: list[StepRecord]) -> None:
    """The timed phase step by step until its last prefill token: how a wave's prompts were cut into steps."""
    last = max((i for i, r in enumerate(records) if r.prefill_tokens), default=-1)
    print(f"{'step':>4} {'kind':8}{'wall ms':>9}{'gpu fwd':>9}{'st host':>8}{'decodes':>8}{'pf tok':>7}{'firsts':>7}"
          f"{'saves':>6}{'spills':>7}  prefill chunks (tokens x count)")  # fmt: skip
    for i, r in enumerate(records[: last + 1]):
        gpu = "-" if r.gpu_forward_ms is None else f"{r.gpu_forward_ms:.1f}"
        saves = r.copy_rows.get("saves_prefill", 0) + r.copy_rows.get("saves_decode", 0)
        chunks = " ".join(f"{size}x{n}" for size, n in r.chunk_sizes.items())
        print(f"{i + 1:>4} {r.kind:8}{r.wall_ms:>9.1f}{gpu:>9}{r.states_host_ms:>8.1f}{r.decodes:>8}{r.prefill_tokens:>7}"
              f"{r.first_tokens:>7}{saves:>6}{r.copy_rows.get('spills', 0):>7}  {chunks}")  # fmt: skip


def use_legacy_cuts(engine: LLMEngine) -> None:
    """The prefill cuts and order before session 17, for a before/after in one run: snapshot points at the
    multiples of the interval (not spaced from the chunk's start), and a prompt's tail after a cut at its
    last block boundary waits for its session's turn (behind every newcomer) instead of going with the
    decodes."""
    state = engine.scheduler.kv.state
    if state is None:
        return

    def chunk_tokens(request: Any, start: int, num_tokens: int) -> int:
        if not state.snapshots.num_rows or num_tokens < 2:
            return num_tokens
        bs, end, total = state.block_size, start + num_tokens, request.num_tokens
        points = [total // bs * bs]
        if state.interval:
            points.append((start // state.interval + 1) * state.interval)
        if end < total:
            points.append(end // bs * bs)
        inside = [p for p in points if start < p < end]
        return min(inside) - start if inside else num_tokens

    state.chunk_tokens = chunk_tokens  # type: ignore[method-assign]
    engine.scheduler._is_prompt_tail = lambda request: False  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF (bench/make_random_hybrid_gguf.py --layers 8 makes the cut files)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--cpu-kernels", default="auto", help="numpy or numba on the CPU (EngineConfig.cpu_kernels)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64, help="timed requests")
    parser.add_argument("--warmup", type=int, help="untimed requests first (default: --concurrency, as paddock bench)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--head-tokens", type=int, default=3, help="shared ids before each prompt (<|im_start|>user\\n)")
    parser.add_argument("--tail-tokens", type=int, default=5, help="shared ids after it (<|im_end|>\\n<|im_start|>assistant\\n)")
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=16384, help="as the served runs' --max-ctx")
    parser.add_argument("--kv-host-gb", type=float, default=4.0,
                        help="paddock serve's default: a hybrid model's evicted snapshots spill to host RAM")  # fmt: skip
    parser.add_argument("--max-num-batched-tokens", type=int, help="EngineConfig's default unless given")
    parser.add_argument("--no-prefix-cache", action="store_true")
    parser.add_argument("--snapshot-rows", type=int,
                        help="device snapshot rows (--state-snapshot-gb in rows): a file cut to 8 layers gets ~4x the "
                             "rows the whole model gets (Qwen3.5-27B on an H100: ~66), so evictions come later")  # fmt: skip
    parser.add_argument("--json", type=Path, help="every step's record and the summary")
    parser.add_argument("--legacy-cuts", action="store_true",
                        help="the prefill cuts and tail order before session 17 (use_legacy_cuts), to compare")  # fmt: skip
    parser.add_argument("--steps", action="store_true",
                        help="print the timed phase step by step until its last prefill chunk (chunk sizes, first tokens)")  # fmt: skip
    args = parser.parse_args(argv)
    if min(args.concurrency, args.requests, args.prompt_tokens, args.output_tokens) < 1:
        parser.error("--concurrency, --requests, --prompt-tokens and --output-tokens must be positive")
    warmup = args.concurrency if args.warmup is None else args.warmup
    fields: dict[str, Any] = dict(model=args.model, device=args.device, max_model_len=args.max_model_len,
                                  max_num_seqs=args.concurrency, enable_prefix_caching=not args.no_prefix_cache,
                                  kv_host_gb=args.kv_host_gb)  # fmt: skip
    if args.device == "cpu":
        fields["cpu_kernels"] = args.cpu_kernels
    if args.snapshot_rows is not None:
        per_sequence = shape_from_checkpoint(args.model).state_bytes_per_sequence
        fields["state_snapshot_gb"] = args.snapshot_rows * per_sequence / (1 << 30) + 1e-9
    if args.max_num_batched_tokens:
        fields["max_num_batched_tokens"] = args.max_num_batched_tokens
    engine = LLMEngine(EngineConfig(**fields))
    if args.legacy_cuts:
        use_legacy_cuts(engine)
    if not engine.runner.state_arrays:
        print(f"note: {args.model} has no recurrent layers (state copies will be 0)")
    pool = make_prompts(engine.model_config.vocab_size, min(warmup + args.requests, PROMPT_POOL), args)
    texts = [pool[i % len(pool)] for i in range(warmup + args.requests)]
    if warmup:
        drive(engine, None, texts[:warmup], args.concurrency, args.output_tokens, "warmup")
    tracer = Tracer(engine)
    times, wall = drive(engine, tracer, texts[warmup:], args.concurrency, args.output_tokens, "timed")
    tracer.finish()
    summary = summarize(tracer.records, times, wall, tracer.row_bytes)
    summary["model"] = Path(args.model).name
    summary["concurrency"], summary["requests"] = args.concurrency, args.requests
    print_summary(summary, engine.plan.describe())
    if args.steps:
        print_steps(tracer.records)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "steps": [asdict(r) for r in tracer.records]}, indent=1))
    return summary


if __name__ == "__main__":
    main()
