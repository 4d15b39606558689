"""Per-kernel GPU time of one batch-1 decode step, read by Nsight Compute from the decode graph.

    python3 bench/micro/decode_kernel_times.py MODEL.gguf [--context 330] [--batch 1] [--out DIR] [--shared]

Runs itself under `ncu --graph-profiling node` (each kernel node of one graph replay measured
alone: duration and DRAM bytes read, caches left as the step leaves them, clocks untouched),
then prints one line per kernel name: calls, total and mean microseconds, and read bandwidth;
and the kernels of one middle layer in order. The sum of the lone kernel times against the
replay time shows how much the kernels overlap in the graph (programmatic dependent launch).
`--shared`: the batch's prompts share their first `context - 32` tokens (agent sessions over one system
prompt) and the engine runs cascade attention (PADDOCK_CASCADE=1): the profiled graph is the cascade one.
Needs ncu (the lent H200 has it on its Firecracker machines).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

METRICS = "gpu__time_duration.sum,dram__bytes_read.sum"


def target(model: str, context: int, batch: int = 1, shared: bool = False) -> None:
    """The profiled process: an engine decoding `batch` requests at ~`context` tokens, then one replay
    of their decode graph (or, where the engine runs that batch without graphs, one eager step).
    `shared`: the prompts share all but their last 32 tokens, the first request's prefill caches them
    before the others arrive, and the replayed graph is the cascade one."""
    import cupy
    import numpy as np
    from gpu_engine import graph_replay_ms

    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, device="cuda", max_model_len=max(4096, context + 256),
                                    max_num_seqs=batch))  # fmt: skip
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 256, size=max(1, context - 32)).tolist()
    if shared:  # the prefix in the cache before the batch looks it up
        engine.add_request("prefix", prefix, SamplingParams(temperature=1.0, max_tokens=1, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    for i in range(batch):
        own = rng.integers(0, 256, size=32 if shared else max(1, context - 32)).tolist()
        prompt = prefix + own if shared else own
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=96, ignore_eos=True))
    for _ in range(40):
        engine.step()
    cupy.cuda.Device().synchronize()
    graphs = engine.runner.graphs
    bucket = graphs.bucket_for(batch) if graphs is not None else None
    cascade = bool(shared and bucket is not None and bucket in graphs._cascade_graphs and graphs.cascade_steps)
    if not cascade and (bucket is None or bucket not in graphs._graphs):
        started = time.perf_counter()
        engine.step()
        print(json.dumps({"eager_step_ms": (time.perf_counter() - started) * 1e3}), flush=True)
        cupy.cuda.runtime.profilerStart()
        engine.step()
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.profilerStop()
        return
    graph = (graphs._cascade_graphs if cascade else graphs._graphs)[bucket][0]
    line = {"replay_ms": graph_replay_ms(graph)} | ({"cascade_steps": graphs.cascade_steps} if cascade else {})
    print(json.dumps(line), flush=True)
    cupy.cuda.runtime.profilerStart()
    graph.launch()
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()


def _num(text: str) -> float:
    """ncu writes thousands with commas ("4,512")."""
    return float(text.replace(",", "") or 0)


def report(rows: list[dict[str, str]], replay_ms: float | None) -> dict:
    kernels = [(r["Kernel Name"].split("(")[0], _num(r["gpu__time_duration.sum"]), r) for r in rows]
    unit = rows[0].get("_unit", "ns") if rows else "ns"
    scale = 1e-3 if unit == "ns" else 1.0  # to microseconds
    by_name: dict[str, list[float]] = defaultdict(list)
    read: dict[str, float] = defaultdict(float)
    for name, duration, row in kernels:
        by_name[name].append(duration * scale)
        read[name] += _num(row.get("dram__bytes_read.sum", "0"))
    total = sum(sum(v) for v in by_name.values())
    table = sorted(
        (
            {"kernel": name, "calls": len(times), "total_us": round(sum(times), 1),
             "mean_us": round(sum(times) / len(times), 2),
             "dram_read_mb": round(read[name] / 1e6, 1),
             "read_tb_s": round(read[name] / (sum(times) * 1e-6) / 1e12, 2) if sum(times) else 0.0}
            for name, times in by_name.items()
        ),
        key=lambda row: -row["total_us"],
    )  # fmt: skip
    middle = len(kernels) // 2
    layer = [(name, round(d * scale, 2)) for name, d, _ in kernels[middle : middle + 10]]
    return {"kernels": len(kernels), "sum_alone_us": round(total, 1), "replay_us": replay_ms and replay_ms * 1000,
            "by_name": table, "middle_kernels": layer}  # fmt: skip


def parse_csv(text: str) -> list[dict[str, str]]:
    """ncu --csv --page raw: a header row, a units row, then one row per kernel."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    reader = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not reader:
        return []
    units = reader[0]
    rows = reader[1:]
    for row in rows:
        row["_unit"] = units.get("gpu__time_duration.sum", "ns")
    return rows


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--target":
        target(args[1], int(args[2]), int(args[3]), args[4:] == ["--shared"])
        return
    model = args[0]
    context = int(args[args.index("--context") + 1]) if "--context" in args else 330
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 1
    out = Path(args[args.index("--out") + 1]) if "--out" in args else Path("/tmp")
    shared = "--shared" in args
    ncu = os.environ.get("NCU", "ncu")
    command = [ncu, "--graph-profiling", "node", "--profile-from-start", "off", "--cache-control", "none",
               "--clock-control", "none", "--metrics", METRICS, "--csv", "--page", "raw",
               sys.executable, __file__, "--target", model, str(context), str(batch), *(["--shared"] * shared)]  # fmt: skip
    env = {**os.environ, "PADDOCK_CASCADE": "1"} if shared else None
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    (out / "decode-kernel-times.csv").write_text(done.stdout)
    (out / "decode-kernel-times.err").write_text(done.stderr)
    replay = None
    eager = None
    for line in done.stdout.splitlines():
        if line.startswith('{"replay_ms"'):
            replay = json.loads(line)["replay_ms"]
        elif line.startswith('{"eager_step_ms"'):
            eager = json.loads(line)["eager_step_ms"]
    result = report(parse_csv(done.stdout), replay)
    result.update(model=Path(model).name, batch=batch, context=context, shared=shared, eager_step_ms=eager)
    print(json.dumps(result))
    if not result["kernels"]:
        print(done.stderr[-3000:], file=sys.stderr)


if __name__ == "__main__":
    main()
