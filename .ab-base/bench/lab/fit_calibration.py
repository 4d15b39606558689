"""Will-it-fit's prediction against the measured device memory, on the GPU machine.

For each checkpoint, one subprocess (a fresh CUDA context) loads the engine for exactly
`--ctx` tokens x `--batch` sequences of KV, runs that many requests with prompts filling
most of the context (chunked prefill at the default token budget) and a few decode steps,
and reports the device memory in use at the end (total - free, as nvidia-smi counts it:
the CUDA context, cuBLAS, and everything CuPy's pool holds, which keeps its peak). The
parent compares that with `app.engine.plan.memory.memory` for the same options.

    python3 bench/lab/fit_calibration.py /tmp/qwen3-0.6b.gguf /tmp/qwen3-4b.gguf /tmp/qwen3-8b.gguf
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def measure(model: str, ctx: int, batch: int) -> dict:
    import cupy
    import numpy as np

    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    blocks = batch * -(-ctx // 16) + 1
    free_at_start = int(cupy.cuda.runtime.memGetInfo()[0])
    engine = LLMEngine(
        EngineConfig(model=model, device="cuda", max_model_len=ctx, max_num_seqs=batch, num_kv_blocks=blocks)
    )
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", rng.integers(0, 256, size=ctx - 16).tolist(), params)
    while engine.has_unfinished():
        engine.step()
    cupy.cuda.Device().synchronize()
    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    return {"used": total - free, "free_at_start": free_at_start, "pool_total": pool.total_bytes(),
            "pool_used": pool.used_bytes(), "weight_cache": engine.backend.dense_cache.cached_bytes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.models[0], args.ctx, args.batch)))
        return
    from app.engine.plan.fit import FitOptions, shape_from_checkpoint
    from app.engine.plan.memory import memory

    rows = []
    for model in args.models:
        done = subprocess.run(
            [sys.executable, __file__, "--child", "--ctx", str(args.ctx), "--batch", str(args.batch), model],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode:
            print(f"{model}: failed\n{done.stderr[-1500:]}")
            continue
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        options = FitOptions(context_length=args.ctx, batch=args.batch, max_num_seqs=args.batch)
        predicted = memory(shape_from_checkpoint(model), options, "cuda", measured["free_at_start"])
        error = (predicted.total - measured["used"]) / measured["used"]
        rows.append({"model": Path(model).name, "predicted": predicted.total, "measured": measured["used"],
                     "error": error, "breakdown": predicted.__dict__, **measured})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    print(f"\nctx {args.ctx} x batch {args.batch}")
    for r in rows:
        print(f"{r['model']:<22} predicted {r['predicted'] / 2**30:7.2f} GiB  measured {r['measured'] / 2**30:7.2f} GiB"
              f"  error {100 * r['error']:+.1f}%")  # fmt: skip


if __name__ == "__main__":
    main()
