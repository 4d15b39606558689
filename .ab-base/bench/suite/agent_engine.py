"""The coding-agent workload at engine level, on the GPU machine (issue 16's rows, no HTTP in between).

python3 bench/suite/agent_engine.py MODEL.gguf [--cases prefill8k,hit,c8,prefill32k,decode32k] [--simt]
python3 bench/suite/agent_engine.py MODEL.gguf --cases interfere --decode-latency-factors 0,2 [--device cpu]

Cases (random token ids, so no unplanned prefix hits; TTFT = wall time from add_request to the
step that returns the first token, the engine stepped back to back):
- prefill8k:  an 8,000-token prompt alone, 3 times (each a fresh prompt).
- hit:        an 8,000-token prefix prefilled once, then 3 requests of that prefix + 140 new tokens.
- c8:         8 sessions of the shared 8,000-token prefix + 140 own tokens at once, 128 out each:
              step time p50 while all 8 decode (ITL) and output tok/s over the whole run.
- prefill32k: a 32,000-token prompt.
- prefill_ops, prefill_ops32k: GPU ms per op kind of the first and the last chunk of an 8,000- / 32,000-token
              prompt (where its TTFT goes).
- decode32k:  one session at 32k context: step time p50 over 64 decode steps.
- interfere:  8 sessions decoding at 2k context while a 16k-token prompt prefills: their step-time
              p99 against p50 without it, and the long prompt's TTFT (what pacing costs it), once per
              `--decode-latency-factors` value (0: pacing off, core/step_pacing.py), each with a fresh pacer;
              `--interfere D,C,P` sets the decoders, their context and the prompt (a CPU run: 4,64,1500).
c8 reports the decode steps that replayed a cascade graph (PADDOCK_CASCADE=1: the shared prefix read
once per step, kernels/attention_cascade.py) and that graph's replay time beside the plain one's.
`--decode-blocks-per-sm N` overrides the tuning table's decode attention parallelism (A/B runs).
Products of 2-64 tokens run on gemv_mma.cu with PADDOCK_GEMV_MMA_MAX_TOKENS=64 (off by default; A/B).
`--simt` runs prefill attention on the SIMT kernel (attention.cu) instead of the tensor-core one, in eager
steps (the prefill graphs of up to 512 tokens are captured with the default at load).
Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.core.step_pacing import StepPacer
from app.engine.sampling_params import SamplingParams
from bench.suite.gpu_engine import graph_replay_ms, op_times, profile

VOCAB_SAFE = 30000  # ids below every shipped shape's vocabulary size


def _sync(engine: LLMEngine) -> None:
    if engine.backend.name != "cuda":  # a CPU run: nothing is queued
        return
    import cupy

    cupy.cuda.Device().synchronize()


class Driver:
    def __init__(self, engine: LLMEngine, seed: int = 0) -> None:
        self.engine = engine
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def tokens(self, n: int) -> list[int]:
        high = min(VOCAB_SAFE, self.engine.model_config.vocab_size)  # the tiny shapes' 1,024 (a CPU run)
        return self.rng.integers(100, high, size=n).tolist()

    def add(self, ids: list[int], max_tokens: int, session: str = "default") -> str:
        self.n += 1
        rid = f"r{self.n}"
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.engine.add_request(rid, ids, params, session)
        return rid

    def ttft(self, ids: list[int]) -> tuple[float, int]:
        """Milliseconds to the first token of a lone request (then drained), and its cached tokens."""
        _sync(self.engine)
        t0 = time.perf_counter()
        rid = self.add(ids, 2)
        first, cached = None, 0
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id == rid and out.new_token_ids and first is None:
                    first = time.perf_counter()
                    cached = out.num_cached_tokens
        return 1000 * (first - t0), cached

    def steps(self, count: int) -> list[float]:
        walls = []
        for _ in range(count):
            t0 = time.perf_counter()
            self.engine.step()
            walls.append(1000 * (time.perf_counter() - t0))
        return walls

    def drain(self) -> None:
        while self.engine.has_unfinished():
            self.engine.step()


def case_prefill(d: Driver, n: int, reps: int) -> dict:
    d.ttft(d.tokens(256))  # warm the kernels of this shape family
    times = [d.ttft(d.tokens(n))[0] for _ in range(reps)]
    return {"tokens": n, "ttft_ms": times, "ttft_p50_ms": statistics.median(times),
            "prefill_tok_s": n / (statistics.median(times) / 1000)}  # fmt: skip


def case_prefill_ops(d: Driver, n: int = 8000) -> dict:
    """GPU ms per op kind of the first and the last chunk of an n-token prefill (the last one attends
    to everything before it), each step run once with every op timed (gpu_engine.op_times)."""
    d.add(d.tokens(n), 2)
    first = op_times(d.engine.backend, d.engine.step, reps=1)
    while not any(
        r.num_computed_tokens + d.engine.config.max_num_batched_tokens >= n
        for r in d.engine.scheduler.running
    ):
        d.engine.step()
    last = op_times(d.engine.backend, d.engine.step, reps=1)
    d.drain()
    return {"tokens": n, "first_chunk_ms": first, "first_sum_ms": round(sum(first.values()), 2),
            "last_chunk_ms": last, "last_sum_ms": round(sum(last.values()), 2)}  # fmt: skip


def case_hit(d: Driver) -> dict:
    prefix = d.tokens(8000)
    d.ttft(prefix)
    runs = [d.ttft(prefix + d.tokens(140)) for _ in range(3)]
    return {"prefix": 8000, "new": 140, "ttft_ms": [r[0] for r in runs], "cached": [r[1] for r in runs],
            "ttft_p50_ms": statistics.median(r[0] for r in runs)}  # fmt: skip


def gpu_split(d: Driver, batch: int) -> dict:
    """The decode graph's GPU time at this batch (replayed back to back) and GPU ms per op kind of
    the same step run eagerly: what of a step is the GPU's and where it goes."""
    graphs = d.engine.runner.graphs
    if graphs is None:
        return {}
    bucket = graphs.bucket_for(batch)
    replay = graph_replay_ms(graphs._graphs[bucket][0])
    ops = profile(d.engine, batch, reps=3)
    times = {"graph_replay_ms": round(replay, 3)}
    if bucket in graphs._cascade_graphs:  # its shared length is the last cascade step's, still staged
        times["cascade_replay_ms"] = round(graph_replay_ms(graphs._cascade_graphs[bucket][0]), 3)
    return {**times, "ops_ms": ops}


def case_c8(d: Driver, sessions: int = 8, out_tokens: int = 128) -> dict:
    prefix = d.tokens(8000)
    d.ttft(prefix)
    _sync(d.engine)
    t0 = time.perf_counter()
    for i in range(sessions):
        d.add(prefix + d.tokens(140), out_tokens, session=f"s{i}")
    walls, produced = [], 0
    while d.engine.has_unfinished():
        s0 = time.perf_counter()
        outs = d.engine.step()
        walls.append((1000 * (time.perf_counter() - s0), len(outs)))
        produced += sum(len(o.new_token_ids) for o in outs)
    total = time.perf_counter() - t0
    split = gpu_split(d, sessions)  # the static inputs still hold the last step's 8 sequences
    decode = [w for w, n in walls if n == sessions]
    graphs = d.engine.runner.graphs
    cascade = {} if graphs is None else {"cascade_steps": graphs.cascade_steps}
    return {"sessions": sessions, "itl_p50_ms": statistics.median(decode), "steps": len(walls),
            "output_tok_s": produced / total, "wall_s": total, **cascade, **split}  # fmt: skip


def case_decode_long(d: Driver, context: int) -> dict:
    d.add(d.tokens(context), 80)
    while not any(r.num_output_tokens > 2 for r in d.engine.scheduler.running):
        d.engine.step()
    walls = d.steps(64)
    d.drain()
    split = gpu_split(d, 1)
    return {"context": context, "itl_p50_ms": statistics.median(walls), **split}


def case_small_batches(d: Driver, batches: tuple[int, ...] = (2, 4, 8)) -> dict:
    """Decode step time p50 at a few small batches of 128-token prompts (the short workload's range
    between concurrency 1 and 32)."""
    result = {}
    for batch in batches:
        for i in range(batch):
            d.add(d.tokens(128), 60, session=f"b{i}")
        while (
            any(r.num_output_tokens == 0 for r in d.engine.scheduler.running)
            or d.engine.scheduler.num_waiting
        ):
            d.engine.step()
        result[f"step_ms_b{batch}"] = round(statistics.median(d.steps(40)), 3)
        d.drain()
    return result


def case_interfere(d: Driver, factor: float, sessions: int = 8, context: int = 2000, prompt: int = 16000) -> dict:
    """`factor` 0: pacing off; else a fresh pacer (its model learns from this case's own steps)."""
    d.engine.pacer = StepPacer(factor) if factor else None
    for i in range(sessions):
        d.add(d.tokens(context), 400, session=f"s{i}")
    while any(r.num_output_tokens == 0 for r in d.engine.scheduler.running) or d.engine.scheduler.num_waiting:
        d.engine.step()
    alone = d.steps(40)
    _sync(d.engine)
    t0 = time.perf_counter()
    long_id = d.add(d.tokens(prompt), 2, session="long")
    during = []
    while True:  # until the long prompt's first token: every step meanwhile carries the decodes too
        s0 = time.perf_counter()
        outs = d.engine.step()
        during.append(1000 * (time.perf_counter() - s0))
        if any(o.request_id == long_id and o.new_token_ids for o in outs):
            break
    ttft = 1000 * (time.perf_counter() - t0)
    d.drain()
    p50, p99 = statistics.median(alone), float(np.percentile(during, 99))
    pacer = d.engine.pacer
    fit = {} if pacer is None else {"fit_decode_ms": pacer.model.decode_ms,
                                    "fit_c0_a_b": [round(x, 9) for x in pacer.model.coefficients]}  # fmt: skip
    return {"decode_latency_factor": factor, "decoders": sessions, "context": context, "prompt": prompt,
            "itl_p50_alone_ms": p50, "itl_p50_during_ms": statistics.median(during), "itl_p99_during_ms": p99,
            "itl_max_during_ms": max(during), "p99_over_p50": p99 / p50, "steps_during": len(during),
            "long_ttft_ms": ttft, "split_steps": d.engine.runner.split_steps, **fit}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--cases", default="prefill8k,hit,c8,prefill32k,decode32k,interfere")
    ap.add_argument("--simt", action="store_true")
    ap.add_argument(
        "--gemv-small-batches",
        action="store_true",
        help="2-8 token products on the quantized GEMVs even where a float16 copy exists",
    )
    ap.add_argument("--max-batched-tokens", type=int, default=None)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--max-ctx", type=int, default=40000)
    ap.add_argument("--kv-dtype", default="auto", help="the KV cache's element type: auto, f16 or fp8")
    ap.add_argument(
        "--decode-latency-factors", default="0,2", metavar="X,Y",
        help="interfere: run once per value (0: pacing off; the engine's default is 2)",
    )  # fmt: skip
    ap.add_argument("--interfere", default="8,2000,16000", metavar="D,C,P",
                    help="interfere: decoders, their prompt tokens, the long prompt's tokens")  # fmt: skip
    ap.add_argument(
        "--decode-blocks-per-sm",
        type=int,
        default=None,
        help="decode attention's blocks per multiprocessor instead of the tuning table's",
    )
    args = ap.parse_args()
    if args.decode_blocks_per_sm is not None:
        from app.engine.kernels.tuning import Tuning

        Tuning.decode_blocks_per_sm = property(lambda _: args.decode_blocks_per_sm)
    extra = {} if args.max_batched_tokens is None else {"max_num_batched_tokens": args.max_batched_tokens}
    if args.gemv_small_batches:
        from app.engine.backend.cuda import linear

        linear.DENSE_FROM_TOKENS = linear.GEMV_MAX_TOKENS + 1
    engine = LLMEngine(
        EngineConfig(model=args.model, device=args.device, max_model_len=args.max_ctx, max_num_seqs=16,
                     kv_dtype=args.kv_dtype, **extra)
    )
    engine.backend.tensor_core_prefill = not args.simt
    d = Driver(engine)
    shape = [int(x) for x in args.interfere.split(",")]
    runs = {
        "prefill8k": lambda: case_prefill(d, 8000, 3),
        "prefill_ops": lambda: case_prefill_ops(d),
        "prefill_ops32k": lambda: case_prefill_ops(d, 32000),
        "hit": lambda: case_hit(d),
        "c8": lambda: case_c8(d),
        "prefill32k": lambda: case_prefill(d, 32000, 1),
        "decode32k": lambda: case_decode_long(d, 32000),
        "interfere": lambda: [case_interfere(d, float(f), *shape) for f in args.decode_latency_factors.split(",")],
        "small": lambda: case_small_batches(d),
    }
    kernel = "simt" if args.simt else "tensor_cores"
    for name in args.cases.split(","):
        results = runs[name]()
        for result in results if isinstance(results, list) else [results]:
            print(json.dumps({"case": name, "attention": kernel, "device": args.device, "kv_dtype": args.kv_dtype,
                              "batched_tokens": engine.config.max_num_batched_tokens, **result}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
