"""moe.cu at decode and small batches, at Qwen3.5-35B-A3B's layer shape (hidden 2048, 256 experts, top 8, expert
FFN 512, Q4_K gate/up, Q6_K down, random valid blocks): what the MoE block of one layer costs per token count,
and which kernel takes it. CuPy events only (no Nsight Compute needed).

    python3 bench/micro/moe_times.py [--tokens 1 8 32 128] [--reps 20]
    python3 bench/micro/moe_times.py --compare [--tokens 1 2 4 8]
    python3 bench/micro/moe_times.py --int-x [--tokens 8 32 128]   (each count over float32 x, then int16 x)

One JSON line per token count (`path`: "few_tokens" where moe_forward takes kernels/moe.py's moe_few_tokens, up to
FUSED_DECODE_MAX_TOKENS tokens, else "grouped"):
- `layer_us`: route + grouped products + combine as a decode graph replays them (captured with programmatic
  launches, as the engine's decode graphs; median per call of back-to-back calls);
- `kernels`: microseconds per kernel launch of kernels/moe.py, eager, each between two events with a spin
  kernel queued first so that the host runs ahead and the events time the GPU alone (a memset of cp.zeros
  is not a moe.py launch: it shows in `eager_us`, the whole eager call, and not in `kernels`);
- `experts_hit`, `hit_mb`: the distinct experts the routing chose and their gate + up + down bytes, the bytes the
  products must read; `hit_tb_s`: those bytes over `layer_us`, and per grouped kernel over its own time
  (the bound on an H100 is ~3.3 TB/s).

`--compare`: each token count with the few-tokens path on and off (moe_forward's `fused_decode`, the engine's
PADDOCK_MOE_FUSED_DECODE) in the same process, one line each, then a line per token count with both layer times
and their ratio (`grouped_over_fused`). The run lifts FUSED_DECODE_MAX_TOKENS to its largest token count, so that
every count is timed on both paths (8 tokens included: the data for moving the engine's bound, which the header
line gives as `few_tokens_max`). Default token counts 1 2 4 8: well under a minute on an H100.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from gpu_check import time_graph

from app.engine.kernels import moe as kmoe
from app.engine.kernels.runtime import pdl
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.reference import random_blocks
from app.engine.quant.types import QUANT_TYPES
from app.engine.specs import MoeSpec

HIDDEN, EXPERTS, USED, FFN = 2048, 256, 8, 512  # Qwen3.5-35B-A3B
GATE_UP_TYPE, DOWN_TYPE = "Q4_K", "Q6_K"
SPIN_CYCLES = 4_000_000  # ~2 ms at an H100's clock
SPIN = r"""extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""


def stacked(qtype_name: str, rows: int, cols: int, rng: np.random.Generator, name: str) -> QuantizedTensor:
    """`[EXPERTS, rows, cols]` of random valid blocks, GGUF's `ffn_*_exps` layout."""
    qtype = QUANT_TYPES[qtype_name]
    per_row = cols // qtype.block_size
    blocks = random_blocks(qtype, EXPERTS * rows * per_row, rng)
    return QuantizedTensor(name, qtype, (EXPERTS, rows, cols), blocks.reshape(EXPERTS * rows, -1))


class KernelTimer:
    """Events around every launch of kernels/moe.py (names from its `_kernel`), summed per kernel name."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.events: list[tuple[str, Any, Any]] = []
        self._kernel, self._launch = kmoe._kernel, kmoe.launch

    def __enter__(self) -> KernelTimer:
        def kernel(name: str, *args: Any) -> Any:
            k = self._kernel(name, *args)
            self.names[id(k)] = name
            return k

        def launch(k: Any, *args: Any, **kwargs: Any) -> None:
            import cupy as cp

            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            self._launch(k, *args, **kwargs)
            stop.record()
            self.events.append((self.names.get(id(k), "?"), start, stop))

        kmoe._kernel, kmoe.launch = kernel, launch
        return self

    def __exit__(self, *exc: object) -> None:
        kmoe._kernel, kmoe.launch = self._kernel, self._launch

    def take(self) -> dict[str, float]:
        """Microseconds per kernel name of the launches since the last take (the caller synchronised)."""
        import cupy as cp

        times: dict[str, float] = collections.defaultdict(float)
        for name, start, stop in self.events:
            times[name] += cp.cuda.get_elapsed_time(start, stop) * 1e3
        self.events.clear()
        return dict(times)


PRODUCTS = ("moe_grouped", "moe_pair", "moe_down_combine")  # kernels that read expert weights


class Layer:
    """One 35B-A3B-shaped MoE layer on the device, and what its experts weigh."""

    def __init__(self, rng: np.random.Generator) -> None:
        weights = {
            "gate": stacked(GATE_UP_TYPE, FFN, HIDDEN, rng, "gate"),
            "up": stacked(GATE_UP_TYPE, FFN, HIDDEN, rng, "up"),
            "down": stacked(DOWN_TYPE, HIDDEN, FFN, rng, "down"),
        }
        self.gate, self.up, self.down = (kmoe.upload_stacked(w) for w in weights.values())
        self.expert_bytes = {part: w.data.nbytes // EXPERTS for part, w in weights.items()}
        self.spec = MoeSpec(EXPERTS, USED, FFN, routing="softmax_topk", normalize=True, activation="silu")


def measure(layer: Layer, n_tok: int, fused_decode: bool, reps: int, rng: np.random.Generator,
            int_x: bool = False) -> dict[str, Any]:  # fmt: skip
    """One JSON row: the layer at `n_tok` tokens in a graph, eager, and per kernel (module docstring); `int_x`: the
    grouped products over int16 x (moe_forward's, the engine's PADDOCK_MOE_INT_X)."""
    import cupy as cp

    spec = layer.spec
    x = cp.asarray(rng.standard_normal((n_tok, HIDDEN)).astype(np.float32))
    logits = cp.asarray(rng.standard_normal((n_tok, EXPERTS)).astype(np.float32))

    def call() -> Any:
        return kmoe.moe_forward(x, logits, spec, layer.gate, layer.up, layer.down, fused_decode=fused_decode,
                                int_x=int_x)  # fmt: skip

    hit = int(cp.unique(kmoe.moe_route(logits, spec)[0]).size)
    with pdl.programmatic_launches():
        layer_s, how = time_graph([call] * 10, reps=reps)
    spin = cp.RawKernel(SPIN, "spin")
    per_kernel: dict[str, list[float]] = collections.defaultdict(list)
    eager: list[float] = []
    with KernelTimer() as timer:
        call()
        cp.cuda.Device().synchronize()
        timer.take()
        for _ in range(reps):
            spin((1,), (1,), (np.int64(SPIN_CYCLES),))  # the host queues the whole call meanwhile
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            call()
            stop.record()
            stop.synchronize()
            eager.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
            for name, us in timer.take().items():
                per_kernel[name].append(us)
    kernels = {name: round(statistics.median(v), 2) for name, v in per_kernel.items()}
    hit_bytes = hit * sum(layer.expert_bytes.values())
    reads = {part: hit * size for part, size in layer.expert_bytes.items()}
    product_tb_s = {}
    for name, us in kernels.items():
        if name.startswith(PRODUCTS):  # <kernel>_<fmt>: the down product is the Q6_K one
            down_type = name.endswith(DOWN_TYPE.lower())
            part_bytes = reads["down"] if down_type else reads["gate"] + reads["up"]
            product_tb_s[name] = round(part_bytes / (us * 1e-6) / 1e12, 3)  # all of its calls' reads
    few = fused_decode and kmoe.few_tokens_serve(n_tok, spec, layer.gate, layer.up)
    return {
        "tokens": n_tok, "fused_decode": fused_decode, "int_x": int_x, "path": "few_tokens" if few else "grouped", "pairs": n_tok * USED, "experts_hit": hit,
        "hit_mb": round(hit_bytes / 1e6, 2), "layer_us": round(layer_s * 1e6, 2), "timing": how,
        "hit_tb_s": round(hit_bytes / layer_s / 1e12, 3), "eager_us": round(statistics.median(eager), 2),
        "kernels": kernels, "grouped_tb_s": product_tb_s,
    }  # fmt: skip


def compare_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per token count, the layer's time on each path and grouped / few-tokens (rows from `measure`)."""
    by_tokens: dict[int, dict[bool, float]] = collections.defaultdict(dict)
    for row in rows:
        by_tokens[row["tokens"]][row["fused_decode"]] = row["layer_us"]
    return [
        {"tokens": n, "fused_us": t[True], "grouped_us": t[False], "grouped_over_fused": round(t[False] / t[True], 3)}
        for n, t in by_tokens.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=None, help="default 1 8 32 128 (--compare: 1 2 4 8)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--compare", action="store_true", help="each token count with the few-tokens path on and off")
    parser.add_argument("--int-x", action="store_true", help="each token count over float32 x, then over int16 x")
    args = parser.parse_args()
    tokens = args.tokens or ([1, 2, 4, 8] if args.compare else [1, 8, 32, 128])
    import cupy as cp

    rng = np.random.default_rng(0)
    layer = Layer(rng)
    print(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "hidden": HIDDEN,
                      "experts": EXPERTS, "used": USED, "expert_ffn": FFN, "gate_up": GATE_UP_TYPE,
                      "down": DOWN_TYPE, "expert_mb": round(sum(layer.expert_bytes.values()) / 1e6, 3),
                      "few_tokens_max": kmoe.FUSED_DECODE_MAX_TOKENS}), flush=True)  # fmt: skip
    if args.compare:
        kmoe.FUSED_DECODE_MAX_TOKENS = max(kmoe.FUSED_DECODE_MAX_TOKENS, *tokens)  # each count on both paths
    rows = []
    for n_tok in tokens:
        for fused in (True, False) if args.compare else (True,):
            for int_x in (False, True) if args.int_x else (False,):
                rows.append(measure(layer, n_tok, fused, args.reps, rng, int_x))
                print(json.dumps(rows[-1]), flush=True)
    if args.compare:
        for line in compare_rows(rows):
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
