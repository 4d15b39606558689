"""Engine-level checks and timings on the GPU machine (run there; see bench/gpu_run.sh).

python3 bench/suite/gpu_engine.py parity MODEL.gguf     # CUDA (graphs and eager) against the numpy backend
python3 bench/suite/gpu_engine.py speed MODEL.gguf ...  # decode steps/s at batch 1 and 32, host time per step
python3 bench/suite/gpu_engine.py speed MODEL.gguf --batch 32  # one batch size only
python3 bench/suite/gpu_engine.py prefill MODEL.gguf    # prefill graph replay per bucket, ops of 160 tokens
                                                        # (hybrid models: eager prefill steps, 1 and 8/32 prompts)
python3 bench/suite/gpu_engine.py experts MODEL.gguf N [--batch 1 32]  # MoE experts streamed: tok/s, PCIe bytes/token

Speed: 200 decode steps after every sequence's prefill, wall time per `engine.step()`
(schedule, graph replay, sampling, detokenize); the bucket's graph replayed back to back
gives its GPU time, and the rest of the step is host time the GPU waits through. The HBM
bound at batch 1 is the measured copy bandwidth over the weight bytes one token reads
(every matrix once; an untied embedding table only by its one row).

Profile: the same decode step run eagerly with a CUDA event pair around every backend op
(the graph's own inputs and split plan), GPU milliseconds per op kind summed over the
layers. Before each op a spin kernel holds the GPU for SPIN_US while Python enqueues the
start event, the op's kernels and the end event, so the pair times the kernels back to
back rather than the host's launch latency (the first version, without the spin, measured
~40 us of Python per op: bench/results/archive/NOTES-cuda-2026-11.md, run 7).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.kernels.runtime.pdl import programmatic_launches
from app.engine.plan.shape import shape_from_checkpoint
from app.engine.sampling_params import SamplingParams


def parity(model: str) -> dict:
    """Greedy tokens of 8 prompts on CUDA (graphs on, and eager) against the CPU backend."""
    rng = np.random.default_rng(0)
    cpu = LLMEngine(EngineConfig(model=model, device="cpu", max_model_len=2048))
    prompts = [
        rng.integers(0, 256, size=n).tolist() for n in (3, 9, 17, 40, 77, 130, 260, 600, 5, 33, 64, 21)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)
    reference = cpu.generate(prompts, params)
    report = {}
    for graphs in (True, False):
        gpu = LLMEngine(EngineConfig(model=model, device="cuda", max_model_len=2048, cuda_graphs=graphs))
        ours = gpu.generate(prompts, params)
        same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(ours, reference, strict=True))
        # the first step's logprobs of the reference's top tokens: a measure free of divergence
        worst = max(
            abs(dict(o["logprobs"][0].top).get(t, -99.0) - v)
            for o, r in zip(ours, reference, strict=True)
            for t, v in r["logprobs"][0].top
        )
        report["graphs" if graphs else "eager"] = {
            "identical_prompts": f"{same}/{len(prompts)}",
            "first_step_max_lp_diff": worst,
        }
        del gpu
        _release()
    return report


def _release() -> None:
    """Free the last engine's device memory before the next one sizes its caches from what is free."""
    import cupy

    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()


def graph_replay_ms(graph, reps: int = 20) -> float:
    """Milliseconds per replay of a captured graph, replayed back to back after one warm-up."""
    import cupy

    graph.launch()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        graph.launch()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


def speed(model: str, batch: int, steps: int = 200) -> dict:
    import cupy

    engine = LLMEngine(
        EngineConfig(model=model, device="cuda", max_model_len=4096, max_num_seqs=max(batch, 1))
    )
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=1.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", rng.integers(0, 256, size=128).tolist(), params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.running) or engine.scheduler.num_waiting:
        engine.step()  # prefill everyone first
    cupy.cuda.Device().synchronize()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    # GPU time of the bucket's graph alone (replayed back to back), for the host-overhead estimate
    graphs = engine.runner.graphs
    replay_ms = graph_replay_ms(graphs._graphs[graphs.bucket_for(batch)][0])
    tensors = engine.checkpoint.tensors
    weight_bytes = sum(t.nbytes for t in tensors.values())
    if "output.weight" in tensors:  # untied: the embedding table is read one row per token
        weight_bytes -= tensors["token_embd.weight"].nbytes
    step_ms = 1000 * statistics.median(walls)
    # SPEED_QUICK=1: step and replay times only (A/B runs of one switch)
    quick = os.environ.get("SPEED_QUICK") == "1"
    joins = {} if quick else joining_steps(engine, batch, rng, params)
    profiled = {} if quick else profile(engine, batch)
    ablated = {} if quick else ablate(engine, batch)
    return {
        "model": Path(model).name,
        "batch": batch,
        "step_ms_p50": step_ms,
        "tok_s": batch * 1000 / step_ms,
        "graph_replay_ms": replay_ms,
        "host_ms_per_step": step_ms - replay_ms,
        "weight_gb_per_token": weight_bytes / 1e9,
        "dense_cache": engine.backend.dense_cache.describe(),
        "join_step_ms": joins,
        "profile_ms": profiled,
        "profile_sum_ms": sum(profiled.values()),
        "graph_ms_saved_without": ablated,
    }


def joining_steps(engine: LLMEngine, batch: int, rng: np.random.Generator, params: SamplingParams) -> dict:
    """Wall ms of the eager steps in which a new request's 128-token prompt joins the running
    decodes (one running request is aborted to make room), and of that prompt alone."""
    import cupy

    def timed_step() -> float:
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        engine.step()
        cupy.cuda.Device().synchronize()
        return 1000 * (time.perf_counter() - t0)

    mixed = []
    for i in range(5):
        engine.abort(f"r{i % batch}" if batch > 1 else "r0")
        engine.add_request(f"join{i}", rng.integers(0, 256, size=128).tolist(), params)
        mixed.append(timed_step())
        engine.abort(f"join{i}")
        engine.add_request(f"r{i % batch}", rng.integers(0, 256, size=128).tolist(), params)
        timed_step()
    return {"with_decodes_p50": statistics.median(mixed), "with_decodes_all": [round(m, 2) for m in mixed]}


PROFILED_OPS = (  # those the backend has (a hybrid model's recurrent ops among them)
    "embedding",
    "rms_norm",
    "add_rms_norm",
    "linear",
    "gated_linear",
    "add_rms_norm_linear",  # the norm before a product and the product, one op where fused (kind: the product's)
    "add_rms_norm_gated_linear",
    "rope_and_cache",
    "attention",
    "rope_cache_attention",  # where it is one kernel; else its rope_and_cache and attention count
    "causal_conv1d",  # Gated DeltaNet and Mamba-2 layers
    "gated_delta_net_rule",
    "gated_rms_norm",
    "ssd_scan",
    "gated_group_rms_norm",
)
_LINEAR_KINDS = (("attn_q", "qkv"), ("attn_output", "o"), ("ffn_down", "down"), ("ffn_gate", "gate_up"),
                 ("ssm_in", "ssm_in"), ("ssm_out", "ssm_out"))  # fmt: skip


def _op_kind(op: str, args: tuple) -> str:
    if op not in ("linear", "gated_linear", "add_rms_norm_linear", "add_rms_norm_gated_linear"):
        return op
    name = getattr(args[1] if op in ("linear", "gated_linear") else args[4], "name", "")
    return next((kind for key, kind in _LINEAR_KINDS if key in name), "lm_head")


@contextmanager
def _wrapped_ops(backend, wrap: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """The backend's PROFILED_OPS replaced by `wrap(op, method)` for the block (instance attributes
    shadow the methods the layers call). An op called inside another (rope_cache_attention's
    composition) runs unwrapped: it is part of the outer op's time."""
    depth = [0]

    def outermost(op: str, fn: Callable) -> Callable:
        wrapped = wrap(op, fn)

        def run(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            try:
                return wrapped(*args, **kwargs)
            finally:
                depth[0] -= 1

        return run

    ops = [op for op in PROFILED_OPS if hasattr(backend, op)]
    for op in ops:
        setattr(backend, op, outermost(op, getattr(backend, op)))
    try:
        yield
    finally:
        for op in ops:
            delattr(backend, op)


SPIN_US = 300  # longer than the host time to enqueue any one op (attention: ~60 us of Python)
_SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def op_times(backend, forward: Callable[[], object], reps: int = 5) -> dict[str, float]:
    """GPU ms per op kind of `forward()` run eagerly (median of `reps`), each op timed by an
    event pair behind a spin kernel (module docstring)."""
    import cupy

    events: list[tuple[str, object, object]] = []
    spin = cupy.RawKernel(_SPIN_SOURCE, "spin")
    clock_khz = cupy.cuda.Device().attributes["ClockRate"]
    cycles = np.int64(SPIN_US * clock_khz // 1000)

    def timed(op: str, fn):
        def run(*args, **kwargs):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            spin((1,), (1,), (cycles,))  # the GPU waits here while the op below is enqueued
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            events.append((_op_kind(op, args), start, end))
            return out

        return run

    samples: dict[str, list[float]] = defaultdict(list)
    with _wrapped_ops(backend, timed):
        for _ in range(reps):
            events.clear()
            forward()
            cupy.cuda.Device().synchronize()
            step: dict[str, float] = defaultdict(float)
            for kind, start, end in events:
                step[kind] += cupy.cuda.get_elapsed_time(start, end)
            for kind, ms in step.items():
                samples[kind].append(ms)
    return {kind: round(statistics.median(ms), 4) for kind, ms in samples.items()}


def profile(engine: LLMEngine, batch: int, reps: int = 5) -> dict[str, float]:
    """GPU ms per op kind of one eager decode step at this batch's bucket (median of `reps`): the
    graph's step on the inputs of the last replay."""
    graphs = engine.runner.graphs
    bucket = graphs.bucket_for(batch)
    return op_times(engine.backend, lambda: graphs._forward(bucket), reps)


def prefill(model: str, buckets: tuple[int, ...] = (64, 128, 160, 192, 256)) -> dict:
    """One sequence's prefill: the prefill graph's replay ms per token bucket
    (what a prompt of that many tokens costs before its first token), and GPU ms per op kind of
    the 160-token bucket run eagerly (the workload's 147-token chat prompt lands there). A hybrid
    model has no prefill graphs (their captures hold no state rows): `hybrid_prefill` instead."""
    if shape_from_checkpoint(model).state_bytes_per_sequence:
        return hybrid_prefill(model, buckets)
    engine = LLMEngine(EngineConfig(model=model, device="cuda", max_model_len=4096, max_num_seqs=1))
    graphs = engine.runner.prefill_graphs
    replay = {t: round(graph_replay_ms(graphs._graphs[t][0]), 4) for t in buckets if t in graphs._graphs}
    ops = op_times(engine.backend, lambda: graphs._forward(160))
    return {"model": Path(model).name, "prefill_replay_ms": replay, "prefill_160_ops_ms": ops,
            "prefill_160_ops_sum_ms": round(sum(ops.values()), 4)}  # fmt: skip


def hybrid_prefill(model: str, buckets: tuple[int, ...], batches: tuple[int, ...] = (1, 8, 32), reps: int = 3,
                   device: str = "cuda") -> dict:  # fmt: skip
    """A hybrid model's prefill, eager as the engine runs it: wall ms of the step that prefills one prompt of
    each bucket's tokens and samples its first token (synchronised; median of `reps`), of the step that
    prefills `batches` prompts of 128 tokens together (a served wave arriving at once: one varlen step), and
    (CUDA) GPU ms per op kind of the 160-token prompt (the recurrent layers' conv, delta rule / scan and
    gated norm among them). Prefix caching off: every prompt is computed from zero. `device` "cpu" runs the
    same steps on the numpy kernels, without the op times (a check of this function off the GPU)."""
    fields = dict(cpu_kernels="numpy") if device == "cpu" else {}
    engine = LLMEngine(EngineConfig(model=model, device=device, max_model_len=4096, max_num_seqs=max(batches),
                                    max_num_batched_tokens=max(4096, 128 * max(batches)),
                                    enable_prefix_caching=False, **fields))  # fmt: skip
    rng = np.random.default_rng(2)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    ids = iter(range(1 << 30))

    def sync() -> None:
        if device == "cuda":
            import cupy

            cupy.cuda.Device().synchronize()

    def prompts(n: int, tokens: int) -> None:
        """`n` prompts of `tokens` prefilled in one step (asserted), and their first tokens."""
        before = engine.counters.prompt_tokens
        for _ in range(n):
            engine.add_request(f"p{next(ids)}", rng.integers(0, 256, size=tokens).tolist(), params)
        engine.step()
        assert engine.counters.prompt_tokens - before == n * tokens, f"{n} prompts of {tokens} took two steps"
        while engine.has_unfinished():  # with async decode the first tokens are read back in the next call
            engine.step()

    def step_ms(n: int, tokens: int) -> float:
        prompts(n, tokens)  # warm-up: kernels compiled, pools grown
        walls = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            prompts(n, tokens)
            sync()
            walls.append(1000 * (time.perf_counter() - t0))
        return round(statistics.median(walls), 3)

    single = {t: step_ms(1, t) for t in buckets}
    batched = {n: step_ms(n, 128) for n in batches}
    ops = op_times(engine.backend, lambda: prompts(1, 160)) if device == "cuda" else {}
    return {"model": Path(model).name, "prefill_eager_step_ms": single, "prefill_128_batch_step_ms": batched,
            "prefill_160_ops_ms": ops, "prefill_160_ops_sum_ms": round(sum(ops.values()), 4)}  # fmt: skip


ABLATED_KINDS = (
    "attention",
    "rope_and_cache",
    "rope_cache_attention",
    "add_rms_norm",
    "qkv",
    "o",
    "gate_up",
    "down",
    "lm_head",
)


def ablate(engine: LLMEngine, batch: int, reps: int = 50) -> dict[str, float]:
    """In-graph cost of each op kind: the bucket's graph captured again with that kind's calls
    returning their outputs from an eager run (no kernel), replayed; ms saved against the full
    graph. The kernels around the ablated ones still run on the same inputs."""
    import cupy

    backend, graphs = engine.backend, engine.runner.graphs
    bucket = graphs.bucket_for(batch)

    def replay_ms(graph) -> float:
        return graph_replay_ms(graph, reps)

    recorded: list[tuple[str, object]] = []
    state = {"ablated": None, "call": 0}

    def wrap(op: str, fn):
        def run(*args, **kwargs):
            kind = _op_kind(op, args)
            if state["ablated"] is None:
                out = fn(*args, **kwargs)
                recorded.append((kind, out))
                return out
            index = state["call"]
            state["call"] += 1
            if state["ablated"] in (kind, "all"):
                return recorded[index][1]
            return fn(*args, **kwargs)

        return run

    saved: dict[str, float] = {}
    with _wrapped_ops(backend, wrap):
        graphs._forward(bucket)
        cupy.cuda.Device().synchronize()
        full = replay_ms(graphs._graphs[bucket][0])
        stream = cupy.cuda.Stream(non_blocking=True)
        for kind in (*ABLATED_KINDS, "all"):
            state["ablated"] = kind
            with stream, programmatic_launches():  # as DecodeGraphs.capture launches
                state["call"] = 0
                graphs._forward(bucket)
                stream.synchronize()
                state["call"] = 0
                stream.begin_capture()
                graphs._forward(bucket)
                graph = stream.end_capture()
            stream.synchronize()
            saved[kind] = round(full - replay_ms(graph), 4)
    return {"full_replay_ms": round(full, 4), **saved}


def copy_bandwidth() -> float:
    import cupy

    a = cupy.empty(2 << 30, dtype=cupy.uint8)
    b = cupy.empty_like(a)
    b[:] = a
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(10):
        b[:] = a
    end.record()
    end.synchronize()
    return 2 * 10 * a.nbytes / (cupy.cuda.get_elapsed_time(start, end) / 1000) / 1e12  # TB/s, read + write


def host_profile(model: str, batch: int, steps: int = 300) -> None:
    """cProfile of `steps` decode steps (graphs) at `batch`: where the host time of a step goes."""
    import cProfile
    import pstats

    engine = LLMEngine(
        EngineConfig(model=model, device="cuda", max_model_len=4096, max_num_seqs=max(batch, 1))
    )
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=1.0, max_tokens=steps + 8, min_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", rng.integers(0, 256, size=128).tolist(), params)
    for _ in range(10):
        engine.step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(28)


def experts(model: str, on_gpu: str, batch: int, steps: int = 64) -> dict:
    """Decode with `--experts-on-gpu on_gpu` (no CUDA graphs: the router's choices come to the host):
    wall time per step and the expert bytes copied over PCIe per generated token (the engine's
    counter over the decode steps alone, after every prefill)."""
    import cupy

    config = EngineConfig(model=model, device="cuda", max_model_len=4096, max_num_seqs=max(batch, 1),
                          experts_on_gpu=on_gpu)  # fmt: skip
    engine = LLMEngine(config)
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=1.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", rng.integers(0, 256, size=128).tolist(), params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.running) or engine.scheduler.num_waiting:
        engine.step()
    cupy.cuda.Device().synchronize()
    before = engine.stats()
    t0 = time.perf_counter()
    walls = []
    for _ in range(steps):
        s0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - s0)
    wall = time.perf_counter() - t0
    after = engine.stats()
    tokens = after.generation_tokens_total - before.generation_tokens_total
    copied = after.expert_bytes_copied_total - before.expert_bytes_copied_total
    streaming = engine.expert_streaming
    return {
        "model": Path(model).name, "batch": batch, "experts_on_gpu": on_gpu,
        "resident_per_layer": None if streaming is None else streaming.on_gpu,
        "step_ms_p50": 1000 * statistics.median(walls), "tok_s": tokens / wall,
        "pcie_bytes_per_token": copied / max(tokens, 1), "pcie_gb_s": copied / wall / 1e9,
        "graphs": engine.runner.graphs is not None,
    }  # fmt: skip


def main() -> None:
    what, *models = sys.argv[1:]
    if what == "experts":
        model, on_gpu, *rest = models
        for batch in [int(b) for b in rest[1:]] if rest[:1] == ["--batch"] else [1, 32]:
            print(json.dumps(experts(model, on_gpu, batch)), flush=True)
            _release()
        return
    if what == "hostprof":
        host_profile(models[0], int(models[1]) if len(models) > 1 else 1)
        return
    if what == "prefill":
        for model in models:
            print(json.dumps(prefill(model)), flush=True)
            _release()
        return
    if what == "parity":
        print(json.dumps({"parity": parity(models[0])}))
        return
    batches = [1, 32]
    if "--batch" in models:
        at = models.index("--batch")
        batches = [int(b) for b in models[at + 1 :]]
        models = models[:at]
    bandwidth = copy_bandwidth()
    print(json.dumps({"copy_tb_s": bandwidth}))
    for model in models:
        for batch in batches:
            result = speed(model, batch)
            _release()
            bound = bandwidth * 1e12 / (result["weight_gb_per_token"] * 1e9)
            result["hbm_bound_tok_s_batch1"] = bound
            if batch == 1:
                result["fraction_of_hbm_bound"] = result["tok_s"] / bound
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
