"""Every CUDA kernel source compiles for the release architectures, without a GPU.

Each `.cu` file is compiled with PADDOCK_ALL_VARIANTS (every format, head size and
group variant the wrappers can ask for) to PTX for sm_86, sm_89, sm_90 and sm_120, with
`nvcc` when it is on the machine, else with NVRTC from the `cuda-bindings` wheels.
`PADDOCK_COMPILE_WITH=nvrtc|nvcc` forces one; `PADDOCK_COMPILE_CUBIN=1` also assembles
machine code (slower, catches register and shared-memory limits). Skipped when neither
compiler is present.

With nvcc the all-variants builds skip NVVM's optimizer (`-Xcicc -O0`): what they check, that every
instantiation parses, type-checks and lowers to PTX for each architecture, is the front end's and
the code generator's work, and the optimizer took ~4x their time (gemv.cu: 16 s -> 4 s on the 2-core
VM; the matrix: minutes of `make test`). `PADDOCK_COMPILE_OPTIMIZED=1` optimizes them too. The
selected variants below are built with the runtime's defines, likewise without the optimizer (they check
the macro plumbing: 22 -> 11 CPU-s on the 2-core VM); the spill checks assemble optimized machine code.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from app.engine.kernels import attention_prefill, gemv_int, moe_mma, tuning
from app.engine.kernels.gemv import format_defines
from app.engine.kernels.gemv_plan import GemvPlan
from app.engine.kernels.runtime.compile import BASE_OPTIONS, KERNEL_DIR

ARCHS = ("86", "89", "90", "120")
SOURCES = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
DEFINES = ("-DPADDOCK_ALL_VARIANTS",)


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def _nvrtc_module():
    try:
        from cuda.bindings import nvrtc  # type: ignore[import-not-found]
    except ImportError:
        return None
    return nvrtc


def _compiler() -> str | None:
    forced = os.environ.get("PADDOCK_COMPILE_WITH")
    if forced == "nvrtc":
        return "nvrtc" if _nvrtc_module() else None
    if forced in ("nvcc", None) and _nvcc():
        return "nvcc"
    return "nvrtc" if forced is None and _nvrtc_module() else None


def _cubin() -> bool:
    return os.environ.get("PADDOCK_COMPILE_CUBIN") == "1"


def _optimized() -> bool:
    return os.environ.get("PADDOCK_COMPILE_OPTIMIZED") == "1"


# One variant per file as the wrappers compile it (-D selects it), for one architecture:
# catches macro plumbing that the all-variants build does not exercise. A key "file#name" is a
# second selection of the same file.
SELECTED = {
    "gemv.cu": ("-DPADDOCK_FORMAT=q6_k", "-DPADDOCK_FORMAT_STRUCT=FmtQ6_K"),
    "dequant.cu": ("-DPADDOCK_FORMAT=q5_0", "-DPADDOCK_FORMAT_STRUCT=FmtQ5_0"),
    "gemv.cu#lowbit": ("-DPADDOCK_FORMAT=iq4_xs", "-DPADDOCK_FORMAT_STRUCT=FmtIQ4_XS"),  # quant_lowbit.cuh
    "dequant.cu#lowbit": ("-DPADDOCK_FORMAT=mxfp4", "-DPADDOCK_FORMAT_STRUCT=FmtMXFP4"),
    "moe.cu": ("-DPADDOCK_FORMAT=q4_k", "-DPADDOCK_FORMAT_STRUCT=FmtQ4_K"),  # the name kernels/moe.py looks up
    # kernels/moe_mma.py's build for experts with few pairs: 32 pairs x 128 rows
    "moe_mma.cu": ("-DPADDOCK_FORMAT=q6_k", "-DPADDOCK_FORMAT_STRUCT=FmtQ6_K", "-DMMA_BM=32", "-DMMA_BN=128"),
    "gemv_split.cu": ("-DSPLIT_CODES=e2m1", "-DSPLIT_CODES_STRUCT=CodesE2M1", "-DSPLIT_SCALE=2"),  # NVFP4
    "attention.cu": ("-DATTN_D=64", "-DATTN_G=2"),
    "gated_delta.cu": ("-DGDN_DK=256",),  # two q/k elements a thread, 64 state rows in registers
    "ssd.cu": ("-DSSD_NJ=8",),  # d_state 256: eight state columns a lane, the most kernels/ssd.py asks for
    # sm_90: a cluster of two, so each thread merges two output elements
    "attention_decode.cu": ("-DATTN_D=256", "-DATTN_G=2", "-DATTN_CL=2"),
    # the rope_cache-fused build (attention_decode_qkv) as Qwen3-8B asks for it
    "attention_decode.cu#rope": ("-DATTN_D=128", "-DATTN_G=4", "-DATTN_CL=8", "-DATTN_ROPE=1"),
    # float16 output for an output projection on its float16 copy (serving batches), clusters merging
    "attention_decode.cu#half": ("-DATTN_D=128", "-DATTN_G=4", "-DATTN_CL=2", "-DDEC_OUT_HALF=1"),
    # the plain value loop (DEC_PVEC=0), 4 blocks an SM's register budget (A/B builds)
    "attention_decode.cu#loop": ("-DATTN_D=256", "-DATTN_G=8", "-DATTN_CL=2", "-DDEC_PVEC=0", "-DDEC_MIN_BLOCKS=4"),
    "gemv_fused.cu": (
        "-DMULTI_F0=FmtQ5_K",
        "-DMULTI_F1=FmtQ8_0",
        "-DMULTI_F2=FmtF16",
        "-DMULTI_R0=2",
        "-DMULTI_R1=2",
        "-DMULTI_R2=2",
        "-DMULTI_T=4",
        "-DGATED_FA=FmtQ6_K",
        "-DGATED_FB=FmtBF16",
        "-DGATED_RH=1",
        "-DGATED_T=8",
        "-DGATED_ACT=1",
    ),
    "gemv_int.cu": (
        "-DXQ_F0=FmtQ8_0",
        "-DXQ_F1=FmtQ5_1",
        "-DXQ_F2=FmtQ4_0",
        "-DXQ_R=4",
        "-DXQ_U=1",
        "-DXQ_ACT=1",
    ),
    # The FP8 KV builds (kernels/kv_format.py adds KV_FP8=1 for an FP8 cache).
    # sm_90: gate/up at 8 tokens, its column splits a cluster of 8 adding up through distributed shared memory
    "gemv_mma2.cu": ("-DGM_F0=FmtQ4_K", "-DGM_F1=FmtQ4_K", "-DGM_F2=FmtQ4_K", "-DGM_MT=1", "-DGM_NT=1", "-DGM_RW=4",
                     "-DGM_KW=2", "-DGM_CL=8"),
    "attention.cu#fp8": ("-DATTN_D=128", "-DATTN_G=4", "-DKV_FP8=1"),
    "attention_decode.cu#fp8": ("-DATTN_D=64", "-DATTN_G=16", "-DATTN_CL=8", "-DKV_FP8=1"),
    "attention_prefill.cu#fp8": ("-DPF_D=256", "-DKV_FP8=1"),
    # the cascade's shared part: warps split each tile's keys (attention_prefill.KEY_WARPS), the block size built in
    "attention_prefill.cu#keywarps": ("-DPF_D=128", "-DPF_KEY_WARPS=1", "-DPF_VBUF=2", "-DPF_BS=16"),
    "kv_cache.cu#fp8": ("-DKV_FP8=1",),
    "rope_cache.cu#fp8": ("-DKV_FP8=1",),
}
SELECTED_ENTRIES = {
    "gemv.cu": "gemv_q6_k_t1_r8",
    "dequant.cu": "dequant_q5_0_f16",
    "gemv.cu#lowbit": "gemv_iq4_xs_t1_r8",
    "dequant.cu#lowbit": "dequant_mxfp4_f16",
    "moe.cu": "moe_grouped_q4_k",
    "moe_mma.cu": "moe_mma_q6_k",
    "gemv_split.cu": "gemv_split_e2m1_s2_t1_r4",
    "attention.cu": "attn_d64_g2",
    "gated_delta.cu": "gated_delta_varlen",
    "ssd.cu": "ssd_scan",
    "attention_decode.cu": "attn_dec_d256_g2",
    "attention_decode.cu#rope": "attn_dec_rope_d128_g4",
    "attention_decode.cu#half": "attn_dec_d128_g4",
    "attention_decode.cu#loop": "attn_dec_d256_g8",
    "gemv_fused.cu": "gemv_multi",
    "gemv_int.cu": "gemv_int_gated",
    "gemv_mma2.cu": "gemv_mma2",
    "attention.cu#fp8": "attn_d128_g4",
    "attention_decode.cu#fp8": "attn_dec_d64_g16",
    "attention_prefill.cu#fp8": "attn_prefill_d256",
    "attention_prefill.cu#keywarps": "attn_prefill_d128",
    "kv_cache.cu#fp8": "write_kv_fp8",
    "rope_cache.cu#fp8": "rope_cache",
}


def _compile_nvcc(
    source: str, arch: str, defines: tuple[str, ...] = DEFINES, out: str | None = None, optimize: bool = True
) -> str:
    """`optimize=False` skips NVVM's optimizer, for PTX only: cubin checks register counts, which need it."""
    kind = ["-cubin", f"-arch=sm_{arch}"] if _cubin() else ["--ptx", f"-arch=compute_{arch}"]
    if not (optimize or _cubin()):
        kind += ["-Xcicc", "-O0"]
    with tempfile.TemporaryDirectory() as tmp:
        target = out or f"{tmp}/out"
        cmd = [
            _nvcc(),
            *kind,
            *BASE_OPTIONS,
            *defines,
            f"-I{KERNEL_DIR}",
            str(KERNEL_DIR / source),
            "-o",
            target,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def _nvrtc_include_dirs() -> list[str]:
    dirs = [str(KERNEL_DIR)]
    try:
        from cuda.pathfinder import find_nvidia_header_directory  # type: ignore[import-not-found]

        found = find_nvidia_header_directory("cudart")
        if found:
            dirs.append(found)
    except Exception:
        pass
    if Path("/usr/local/cuda/include").exists():
        dirs.append("/usr/local/cuda/include")
    return dirs


def _compile_nvrtc(source: str, arch: str) -> str:
    nvrtc = _nvrtc_module()
    text = (KERNEL_DIR / source).read_bytes()
    err, prog = nvrtc.nvrtcCreateProgram(text, source.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"nvrtcCreateProgram: {err}"
    target = f"-arch=sm_{arch}" if _cubin() else f"-arch=compute_{arch}"
    opts = [target, *BASE_OPTIONS, *DEFINES, *(f"-I{d}" for d in _nvrtc_include_dirs())]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    log = ""
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = f"{err}: {buf.decode(errors='replace')}"
    nvrtc.nvrtcDestroyProgram(prog)
    return log


@pytest.fixture(scope="module")
def compile_results() -> dict[tuple[str, str], str]:
    """Compile everything once, in parallel; map (source, arch) to the error log ('' if fine)."""
    compiler = _compiler()
    if compiler is None:
        pytest.skip("neither nvcc nor NVRTC (cuda-bindings) is available")
    if compiler == "nvcc":
        run = functools.partial(_compile_nvcc, optimize=_optimized())
    else:
        run = _compile_nvrtc
    jobs = [(s, a) for s in SOURCES for a in ARCHS]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        logs = list(pool.map(lambda job: run(*job), jobs))
    return dict(zip(jobs, logs, strict=True))


def test_every_kernel_file_is_checked() -> None:
    assert {
        "gemv.cu",
        "gemv_fused.cu",
        "dequant.cu",
        "attention.cu",
        "norm.cu",
        "rope.cu",
        "rope_cache.cu",
        "gemv_split.cu",
    } <= set(SOURCES)


@pytest.mark.slow  # ~1 min: compile_results runs NVRTC over every source for every architecture
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_kernel_compiles(compile_results: dict[tuple[str, str], str], source: str, arch: str) -> None:
    log = compile_results[(source, arch)]
    assert log == "", f"{source} failed for sm_{arch}:\n{log}"


@pytest.mark.parametrize("source", sorted(SELECTED))
def test_selected_variant_compiles(source: str, tmp_path: Path) -> None:
    if _nvcc() is None:
        pytest.skip("needs nvcc")
    if _cubin():
        pytest.skip("checked in PTX mode only")
    out = tmp_path / "out.ptx"
    log = _compile_nvcc(source.partition("#")[0], "90", SELECTED[source], str(out), optimize=_optimized())
    assert log == "", log
    assert f".entry {SELECTED_ENTRIES[source]}(" in out.read_text()


XQ_ENTRIES = {"SINGLE": "gemv_int", "GATED": "gemv_int_gated", "MULTI": "gemv_int_multi"}
SM90 = GemvPlan(tuning=tuning.for_arch("90"))  # the builds ptxas is asked about below


def _spill_stores(defines: list[str], entry: str, source: str = "gemv_int.cu") -> int:
    """Bytes of register spill stores ptxas reports for `entry` of `source` built for sm_90."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [_nvcc(), "-cubin", "-arch=sm_90", "-Xptxas", "-v", *BASE_OPTIONS, *defines, f"-I{KERNEL_DIR}",
               str(KERNEL_DIR / source), "-o", f"{tmp}/out.cubin"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = done.stdout + done.stderr
    properties = report.split(f"Function properties for {entry}\n", 1)[1]
    return int(re.search(r"(\d+) bytes spill stores", properties).group(1))


# the hidden width in the slow tier: each build is a second or two of ptxas, and every FFN-width build uses
# as many registers as its hidden-width twin or more (sm_90, 2026-12-07: SINGLE_Q4_K 103 against 88, the rest equal)
@pytest.mark.parametrize(
    "n_cols",
    [pytest.param(SM90.tuning.gemv_int_wide_cols, marks=pytest.mark.slow), 3 * SM90.tuning.gemv_int_wide_cols],
)
@pytest.mark.parametrize("key", SM90.tuning.gemv_int_by_format)
def test_wide_gemv_shapes_do_not_spill(key: str, n_cols: int) -> None:
    """The wide builds gemv_int gives their own shape and register cap hold without spilling, at
    hidden and FFN widths (x loaded one or two groups per thread), also with a Q4_K_M file's Q6_K
    third weight (v of q/k/v)."""
    if _nvcc() is None:
        pytest.skip("needs nvcc")
    name, _, first = key.partition("_")
    shape = gemv_int._build_shape(name, n_cols, first, None, None, None, SM90)
    variants = [[first, first, first]] + ([[first, first, "Q6_K"]] if name == "MULTI" else [])
    for formats in variants:
        defines = gemv_int._defines(formats, shape, n_cols, plan=SM90)
        flags = [f"-D{k}={v}" for k, v in defines.items()]
        assert _spill_stores(flags, XQ_ENTRIES[name]) == 0, f"{key} {formats} at {shape}, {n_cols} columns"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "BF16"])
# 64 x 64 in the slow tier: 32 x 128 decodes twice the weight units a thread and uses more registers in every
# format (sm_90, 2026-12-07: 114-128 against 106-116)
@pytest.mark.parametrize(
    "shape", [pytest.param(moe_mma.SQUARE, marks=pytest.mark.slow), moe_mma.FEW_PAIRS], ids=["64x64", "32x128"]
)
def test_moe_mma_builds_do_not_spill(qtype: str, shape: moe_mma.TileShape) -> None:
    """moe_mma.cu's products within their two-blocks-a-multiprocessor register cap (128) without spilling,
    in both tile shapes, for the formats of the Q4_K_M and bf16 files."""
    if _nvcc() is None:
        pytest.skip("needs nvcc")
    flags = [f"-D{k}={v}" for k, v in format_defines(qtype).items()]
    flags += [f"-DMMA_BM={shape.pairs}", f"-DMMA_BN={shape.rows}"]
    assert _spill_stores(flags, f"moe_mma_{qtype.lower()}", "moe_mma.cu") == 0


@pytest.mark.parametrize(("head_dim", "tile"), [(64, "key_warps"), (128, "key_warps"), (256, "key_warps"), (128, "wide")])
def test_prefill_attention_builds_do_not_spill(head_dim: int, tile: str) -> None:
    """attention_prefill.cu's builds as attention_prefill.py makes them, within their 128 threads' registers: the
    key-split build (the cascade's shared part; a quarter of a tile's scores a warp leaves room for O: 224 registers
    at head dim 128) and the wide tile of head dim 128 (255, sm_90, 2026-12-07), the block size built in."""
    if _nvcc() is None:
        pytest.skip("needs nvcc")
    build = attention_prefill.KEY_WARPS if tile == "key_warps" else attention_prefill.WIDE_TILE
    flags = [f"-D{k}={v}" for k, v in {"PF_D": head_dim, "PF_BS": 16, **build}.items()]
    assert _spill_stores(flags, f"attn_prefill_d{head_dim}", "attention_prefill.cu") == 0


HOST_DIR = Path(__file__).parent / "cuda" / "host"


@pytest.fixture(scope="module")
def host_decoder(tmp_path_factory) -> Path:
    """quant.cuh's block decoders built as a host program (see cuda/host/host_cuda_shim.h)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("decoder") / "decode"
    cmd = [cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wno-unknown-pragmas", "-DPADDOCK_HOST_SHIM", "-include",
           str(HOST_DIR / "host_cuda_shim.h"), f"-I{KERNEL_DIR}", str(HOST_DIR / "decode_main.cpp"), "-o", str(exe)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return exe


def _host_cases() -> list[tuple[str, int, int]]:
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "cuda"))
    from cuda_samples import ALL_QTYPES

    cases = []
    for q in ALL_QTYPES:
        cases += [(q, 3, 256), (q, 5, 1024)]
        if not q.endswith("_K") and q not in ("IQ4_XS", "NVFP4"):  # 256- and 64-weight blocks
            cases += [(q, 4, 96), (q, 3, 640)]
    return cases


@pytest.mark.parametrize(("qtype", "rows", "cols"), _host_cases())
def test_block_decoders_match_oracle(
    request: pytest.FixtureRequest, host_decoder: Path, tmp_path: Path, qtype: str, rows: int, cols: int
) -> None:
    """The GPU kernels' decoders, run on the CPU, reproduce the numpy dequantizers.

    Fresh random blocks every run; runs without a GPU, so a layout mistake in quant.cuh
    shows up in CI rather than on the lent device.
    """
    from cuda_samples import dequantize_oracle, fresh_rng, random_tensor

    rng, seed = fresh_rng(request.node.nodeid)
    tensor = random_tensor(qtype, rows, cols, rng)
    tensor.data.tofile(tmp_path / "in")
    args = [qtype.lower(), tmp_path / "in", rows, cols, tensor.data.shape[1], tmp_path / "out"]
    done = subprocess.run([str(host_decoder), *map(str, args)], capture_output=True)
    assert done.returncode == 0, f"decoder exit {done.returncode}"
    got = np.fromfile(tmp_path / "out", np.float32).reshape(rows, cols)
    np.testing.assert_allclose(got, dequantize_oracle(tensor), rtol=1e-6, atol=1e-6, err_msg=f"seed={seed}")
