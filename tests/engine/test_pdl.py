"""kernels/runtime/pdl.py and launch.py without a GPU: the ctypes mirrors of the driver's launch structs
against cuda.h's layout, the packing of kernel arguments, and which launcher a launch takes."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from app.engine import envs
from app.engine.kernels.runtime import compile as kernel_compile
from app.engine.kernels.runtime import launch as launch_module
from app.engine.kernels.runtime import pdl

CUDA_H = Path("/usr/local/cuda/include/cuda.h")
LAYOUT_PROGRAM = r"""
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
    printf("%zu %zu %zu\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
           (size_t)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    printf("%zu %zu %zu %zu %zu %zu\n", offsetof(CUlaunchConfig, gridDimX), offsetof(CUlaunchConfig, blockDimX),
           offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),
           offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs));
    return 0;
}
"""


def _ours() -> list[list[int]]:
    attr, config = pdl._LaunchAttribute, pdl._LaunchConfig
    return [
        [ctypes.sizeof(attr), attr.value.offset, pdl.PROGRAMMATIC_STREAM_SERIALIZATION],
        [config.grid.offset, config.block.offset, config.shared_mem.offset, config.stream.offset,
         config.attrs.offset, config.num_attrs.offset],
    ]  # fmt: skip


def test_launch_structs_match_cuda_h(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not CUDA_H.exists():
        pytest.skip("needs a C compiler and the CUDA toolkit's cuda.h")
    source = tmp_path / "layout.c"
    source.write_text(LAYOUT_PROGRAM)
    exe = tmp_path / "layout"
    subprocess.run([compiler, f"-I{CUDA_H.parent}", str(source), "-o", str(exe)], check=True)
    printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert _ours() == [[int(v) for v in line.split()] for line in printed.splitlines()]


class _FakeArray:
    """Stands in for a CuPy array: what pdl reads of one is `.data.ptr`."""

    def __init__(self, ptr: int) -> None:
        self.data = type("Pointer", (), {"ptr": ptr})()


def test_arguments_pack_as_the_kernel_parameters() -> None:
    packed = [pdl._argument(v) for v in (np.int32(-7), np.int64(1 << 40), np.uint64(0), np.float32(0.5))]
    assert [type(v) for v in packed] == [ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float]
    assert [v.value for v in packed] == [-7, 1 << 40, 0, 0.5]
    pointer = pdl._argument(_FakeArray(0xDEAD0000))
    assert isinstance(pointer, ctypes.c_void_p) and pointer.value == 0xDEAD0000
    for bad in (3, 2.5, np.float64(1.0), "x"):  # a bare Python number does not say its C type
        with pytest.raises(TypeError):
            pdl._argument(bad)


def test_launch_takes_cupys_launcher_outside_programmatic_launches() -> None:
    calls = []

    def kernel(grid, block, args, shared_mem=0):
        calls.append((grid, block, args, shared_mem))

    launch_module.launch(kernel, [4], [128], [np.int32(1)], shared_mem=256)
    assert calls == [((4,), (128,), (np.int32(1),), 256)]
    assert not pdl.active()


def test_programmatic_launches_switched_off_stay_plain() -> None:
    """KernelOptions.pdl off: the capture's launches keep CuPy's launcher (no device is asked)."""
    with pdl.programmatic_launches(False):
        assert not pdl.active()
    assert not pdl.active()


def test_experiment_defines_parse(monkeypatch) -> None:
    monkeypatch.setenv("PADDOCK_KERNEL_DEFINES", "PDL_PREFETCH_WARP_BYTES=0,PDL_PREFETCH_BLOCK_BYTES=0 FLAG")
    envs.reload()
    try:
        assert envs.PADDOCK_KERNEL_DEFINES == {
            "PDL_PREFETCH_WARP_BYTES": "0", "PDL_PREFETCH_BLOCK_BYTES": "0", "FLAG": "1",
        }  # fmt: skip
        options = kernel_compile.define_options({"XQ_R": 2, **envs.PADDOCK_KERNEL_DEFINES})
        assert options == ("-DFLAG=1", "-DPDL_PREFETCH_BLOCK_BYTES=0", "-DPDL_PREFETCH_WARP_BYTES=0", "-DXQ_R=2")
    finally:
        monkeypatch.delenv("PADDOCK_KERNEL_DEFINES")
        envs.reload()


def test_kernel_cache_folder(monkeypatch, tmp_path: Path) -> None:
    """$PADDOCK_KERNEL_CACHE, else the user cache folder's paddock/kernels."""
    try:
        monkeypatch.setenv("PADDOCK_KERNEL_CACHE", str(tmp_path / "k"))
        envs.reload()
        assert kernel_compile.cache_dir() == tmp_path / "k"
        monkeypatch.delenv("PADDOCK_KERNEL_CACHE")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        envs.reload()
        assert kernel_compile.cache_dir() == tmp_path / "xdg" / "paddock" / "kernels"
    finally:
        monkeypatch.undo()
        envs.reload()
