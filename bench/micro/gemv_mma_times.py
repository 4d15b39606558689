"""Products of 2..64 tokens on quantized weights, on the GPU machine: gemv_mma.cu ("v1") and
gemv_mma2.cu ("v2") against cuBLAS on a float16 copy of the weight (blas.matmul_t, what the "auto"
float16 cache does) and against expand-then-cuBLAS (linear.matmul_quantized with no copy).

Products (rows x columns, Q4_K_M's formats: gate+up in Q4_K as two stacked weights, down in Q6_K):
Qwen3-8B q 4096 x 4096, gate+up 2 x 12288 x 4096, down 4096 x 12288, lm_head 151936 x 4096 (Q6_K); the Qwen3.5-27B and Gemma-4-31B
shapes (hidden 5120, intermediate 17408 / 21504) with a 5120 x 5120 q-sized product. "qkv" stacks q, k and v as one
launch does (8B: 4096 + 1024 + 1024 rows; 27B: 5120 + 1024 + 1024; all Q4_K here). Weight bytes are
random (valid scales), in enough copies that cycling through them misses L2, as a decode step does.

    python3 bench/micro/gemv_mma_times.py                    # everything (< 90 s on an H100)
    python3 bench/micro/gemv_mma_times.py --models 8b --tokens 8 32
    python3 bench/micro/gemv_mma_times.py --models 8b --products lm_head gate+up --tokens 16 20 32
    python3 bench/micro/gemv_mma_times.py --list             # the cases only (no GPU)

Prints one JSON line per (product, tokens): microseconds per call of each path, each as CUDA events
around one replay of a graph of ~50 calls (median of 5 replays, after two warm-up calls and one
warm-up replay), TB/s of the quantized weight bytes, v2's launch shape and the relative difference
of the other paths' outputs from cuBLAS on the float16 copy (the same float16 weights and x up to
rounding ties: small). cuBLAS gets x already in float16; v1 and v2 convert it inside their time; v2h is v2 given
the float16 x a producer writes for it (no pre-pass).
Beside v2's picked column splits, v2 at the other splits (fields v2_splits<S>_us) for tuning pick_shape:
1-8 on a device with thread-block clusters (the splits add up in a cluster), else 1-2 (atomics).
The v1 and v2 builds compile first in parallel processes; a last line gives that time and the whole
run's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from app.engine.kernels.gemv_mma import MAX_CLUSTER, MAX_SPLITS, MmaShape, cdiv, module_of, pick_shape
from app.engine.quant.types import QUANT_TYPES

TOKENS = (2, 4, 8, 16, 32, 64)
QWEN3_VOCAB = 151936
SPLITS = tuple(2**i for i in range(MAX_CLUSTER.bit_length()))  # v2's column splits, timed beside its pick
METHODS = ("v1", "v2", "v2h", "cublas16", "expand")  # v2h: v2 on float16 x, its pre-pass skipped (linear.takes_half)
CALLS = 50  # calls a timed graph holds
ROTATE_BYTES = 192 << 20  # copies of a weight set up to here: > 3x the H100's 50 MiB L2
MAX_COPIES = 24
# Where each format keeps its float16 scales in a block (byte offsets): random bytes there could be NaN.
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q6_K": (208,)}


@dataclass(frozen=True)
class Product:
    model: str
    name: str
    qtype: str
    parts: tuple[int, ...]  # rows of each stacked weight
    n_cols: int

    @property
    def n_rows(self) -> int:
        return sum(self.parts)

    @property
    def nbytes(self) -> int:
        return self.n_rows * QUANT_TYPES[self.qtype].row_bytes(self.n_cols)


KV_ROWS = {"8b": 8 * 128, "27b": 4 * 256}  # KV heads x head dim: Qwen3-8B, Qwen3.5-27B


def products(models: list[str]) -> list[Product]:
    shapes = {"8b": (4096, 4096, 12288), "27b": (5120, 5120, 17408), "31b": (5120, 5120, 21504)}
    out = []
    for model in models:
        hidden, q_rows, inter = shapes[model]
        out += [Product(model, "q", "Q4_K", (q_rows,), hidden), Product(model, "gate+up", "Q4_K", (inter, inter), hidden),
                Product(model, "down", "Q6_K", (hidden,), inter)]  # fmt: skip
        if model in KV_ROWS:  # q/k/v stacked, as the decode step launches them (all Q4_K here)
            out.append(Product(model, "qkv", "Q4_K", (q_rows, KV_ROWS[model], KV_ROWS[model]), hidden))
        if model == "8b":  # the output head (Q6_K in Q4_K_M), the decode step's tallest product
            out.append(Product(model, "lm_head", "Q6_K", (QWEN3_VOCAB,), hidden))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", choices=("8b", "27b", "31b"), default=["8b", "27b", "31b"])
    parser.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS))
    parser.add_argument("--products", nargs="*", choices=("q", "qkv", "gate+up", "down", "lm_head"), default=None,
                        help="only these products (default: all)")  # fmt: skip
    parser.add_argument("--methods", nargs="*", choices=METHODS, default=list(METHODS))
    parser.add_argument("--list", action="store_true", help="print the cases and v2's shapes, touch no GPU")
    args = parser.parse_args(argv)
    bad = [t for t in args.tokens if not 2 <= t <= 64]
    if bad:
        parser.error(f"--tokens must be 2..64 (gemv_mma's range), got {bad}")
    return args


def case_line(product: Product, n_tok: int, clusters: bool) -> dict:
    shape = pick_shape(n_tok, product.n_rows, product.n_cols, "v2", clusters)
    return {"model": product.model, "product": product.name, "format": product.qtype,
            "rows": product.n_rows, "cols": product.n_cols, "tokens": n_tok, "mb": round(product.nbytes / 1e6, 1),
            "v2_shape": f"mt{shape.m_tiles} nt{shape.n_tiles} rw{shape.row_warps} kw{shape.warps} "
                        f"splits{shape.k_splits}{' cluster' if shape.clustered() else ''}"}  # fmt: skip


def split_choices(picked: MmaShape, n_cols: int, clusters: bool) -> list[int]:
    """The column splits to time beside the picked one: each keeps >= 2 super-steps a split."""
    super_steps = cdiv(cdiv(n_cols // 32, 4), picked.warps)
    cap = MAX_CLUSTER if clusters else MAX_SPLITS
    return [s for s in SPLITS if s <= cap and s != picked.k_splits and 2 * s <= super_steps]


def module_jobs(cases: list[Product], tokens: list[int], methods: list[str], clusters: bool) -> list[tuple[str, dict]]:
    """The (kernel file, defines) of every v1 and v2 build the run launches, each once (a cluster's size is
    the build's: each split count of v2 is one)."""
    jobs = {}
    for product in cases:
        for n_tok in tokens:
            for kernel in (k for k in ("v1", "v2") if k in methods or (k == "v2" and "v2h" in methods)):
                shape = pick_shape(n_tok, product.n_rows, product.n_cols, kernel, clusters)
                shapes = [shape] + [replace(shape, k_splits=s) for s in split_choices(shape, product.n_cols, clusters)
                                    if kernel == "v2"]  # fmt: skip
                for each in shapes:
                    source, defines = module_of(kernel, [product.qtype] * len(product.parts), each)
                    jobs[source, tuple(sorted(defines.items()))] = (source, defines)
    return list(jobs.values())


def precompile(jobs: list[tuple[str, dict]]) -> float:
    """Compile the builds into the kernel cache in parallel processes (NVRTC under get_module's lock
    would take them one at a time: most of the run); seconds taken."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from app.engine import envs
    from app.engine.kernels.runtime import compile as rc

    started = time.perf_counter()
    arch, nvrtc = rc.device_arch(), rc._nvrtc_version()
    work = []
    for source, defines in jobs:  # get_module's cache path for these options
        options = rc.define_options({**defines, **envs.PADDOCK_KERNEL_DEFINES})
        stem = rc.cache_dir() / f"sm{arch}" / f"{Path(source).stem}-{rc.module_digest(source, options, arch, nvrtc)}"
        if not any(stem.with_suffix(suffix).exists() for suffix in (".cubin", ".ptx")):
            work.append((source, options, arch, str(stem)))
    if work:
        workers = max(1, min(len(work), os.cpu_count() or 1))
        try:
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                list(pool.map(_compile_one, work))
        except Exception as exc:  # the timings still run: their warm-up calls compile what is missing
            print(f"precompile failed ({exc!r}); compiling one at a time", file=sys.stderr, flush=True)
    return time.perf_counter() - started


def _compile_one(job: tuple[str, tuple[str, ...], str, str]) -> None:
    from app.engine.kernels.runtime.compile import _compile_to_file

    source, options, arch, stem = job
    _compile_to_file(source, options, arch, Path(stem))


def random_weight(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> Any:
    """A CudaWeight of random bytes whose float16 scales are small and finite."""
    from app.engine.backend.cuda.weights import upload_matrix
    from app.engine.quant.dispatch import QuantizedTensor

    kind = QUANT_TYPES[qtype]
    data = rng.integers(0, 256, (rows, kind.row_bytes(cols)), dtype=np.uint8)
    blocks = data.reshape(rows, cols // kind.block_size, kind.type_size)
    for offset in SCALE_OFFSETS[qtype]:
        blocks[:, :, offset : offset + 2] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    return upload_matrix(QuantizedTensor("w", kind, (rows, cols), data))


def copies_of(nbytes: int) -> int:
    return max(1, min(MAX_COPIES, -(-ROTATE_BYTES // nbytes)))


def measure(product: Product, tokens: list[int], methods: list[str], rng: np.random.Generator, clusters: bool) -> None:
    import cupy
    from gpu_check import time_graph

    from app.engine.backend.cuda.blas import matmul_t
    from app.engine.backend.cuda.expand import expand_rows
    from app.engine.kernels.gemv_mma import gemv_mma

    weights = [random_weight(product.qtype, r, product.n_cols, rng) for r in product.parts]
    weight_sets = [weights] + [[replace(w, data=cupy.array(w.data)) for w in weights]
                               for _ in range(copies_of(product.nbytes) - 1)]  # fmt: skip
    sets = [[(w.data, product.qtype, w.row_bytes, w.n_rows) for w in ws] for ws in weight_sets]
    dense = cupy.empty((product.n_rows, product.n_cols), cupy.float16)  # [W0; W1] as float16
    row = 0
    for w in weights:
        expand_rows(w, dense[row : row + w.n_rows])
        row += w.n_rows
    dense_sets = [dense] + [dense.copy() for _ in range(copies_of(dense.nbytes) - 1)]
    for n_tok in tokens:
        x = cupy.asarray(rng.standard_normal((n_tok, product.n_cols)).astype(np.float32))
        x16 = x.astype(cupy.float16)
        outs = {m: cupy.empty((n_tok, product.n_rows), cupy.float32) for m in methods}
        calls = {
            "v1": [partial(gemv_mma, s, product.n_cols, x, outs["v1"], kernel="v1") for s in sets] if "v1" in outs else [],
            "v2": [partial(gemv_mma, s, product.n_cols, x, outs["v2"], kernel="v2") for s in sets] if "v2" in outs else [],
            "v2h": [partial(gemv_mma, s, product.n_cols, x16, outs["v2h"], kernel="v2") for s in sets]
            if "v2h" in outs else [],
            "cublas16": [partial(matmul_t, x16, d, outs["cublas16"]) for d in dense_sets] if "cublas16" in outs else [],
            "expand": [partial(_expand_then_cublas, x16, ws, outs["expand"]) for ws in weight_sets]
            if "expand" in outs else [],
        }  # fmt: skip
        line = case_line(product, n_tok, clusters)
        if "v2" in outs:  # v2 at the other column splits (the grid's y; with clusters, each its own build)
            picked = pick_shape(n_tok, product.n_rows, product.n_cols, "v2", clusters)
            for splits in split_choices(picked, product.n_cols, clusters):
                shape = replace(picked, k_splits=splits)
                fns = [partial(gemv_mma, s, product.n_cols, x, outs["v2"], shape=shape, kernel="v2") for s in sets]
                seconds, _ = time_graph([fns[i % len(fns)] for i in range(CALLS)], reps=5)
                line[f"v2_splits{splits}_us"] = round(seconds * 1e6, 2)
        for method in methods:
            fns = [calls[method][i % len(calls[method])] for i in range(CALLS)]
            seconds, how = time_graph(fns, reps=5)
            line[f"{method}_us"] = round(seconds * 1e6, 2)
            line[f"{method}_tb_s"] = round(product.nbytes / seconds / 1e12, 3)
            if how != "graph":
                line[f"{method}_timing"] = how
        if "cublas16" in outs:
            ref = outs["cublas16"]
            for method in ("v1", "v2", "v2h", "expand"):
                if method in outs:
                    diff = cupy.linalg.norm(outs[method] - ref) / cupy.linalg.norm(ref)
                    line[f"{method}_rel_diff"] = float(f"{float(diff):.3g}")
        print(json.dumps(line), flush=True)


def _expand_then_cublas(x16: Any, weights: list, out: Any) -> None:
    """linear's no-copy path: each stacked weight expanded to float16 scratch, then cuBLAS into its columns."""
    from app.engine.backend.cuda.linear import matmul_quantized

    row = 0
    for w in weights:
        matmul_quantized(x16, w, out.data.ptr + 4 * row, out.shape[1])
        row += w.n_rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    cases = [p for p in products(args.models) if args.products is None or p.name in args.products]
    if args.list:  # the shapes of an sm_90 device (clusters)
        for product in cases:
            for n_tok in args.tokens:
                print(json.dumps(case_line(product, n_tok, clusters=True)))
        return
    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.kernels.runtime.compile import clusters_supported

    CudaBackend()  # the device, its memory pool and cuBLAS as the engine sets them up
    clusters = clusters_supported()
    compile_s = precompile(module_jobs(cases, args.tokens, args.methods, clusters))
    rng = np.random.default_rng(0)
    for product in cases:  # anything not compiled ahead compiles in a timing's warm-up calls, not its replays
        measure(product, args.tokens, args.methods, rng, clusters)
    print(json.dumps({"compile_s": round(compile_s, 1), "wall_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
