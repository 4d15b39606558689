"""Build and run the SIMT-emulator harnesses of tests/engine/cuda/host (CUDA kernels as host C++)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.engine.kernels.runtime.compile import KERNEL_DIR

HOST_DIR = Path(__file__).parent / "host"
TIMEOUT = 300


def build(tmp_path_factory, main: str, defines: tuple[str, ...] = ()) -> Path:
    """Compile host/`main` with the emulator force-included (and `defines`, "-DNAME=VALUE"); skip
    where no C++20 compiler is."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("emu") / Path(main).stem
    cmd = [cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-w", "-pthread", "-DPADDOCK_HOST_SHIM", "-include",
           str(HOST_DIR / "simt_emulator.h"), f"-I{KERNEL_DIR}", *defines, str(HOST_DIR / main), "-o", str(exe)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode and "barrier" in done.stderr:
        pytest.skip("the C++ compiler lacks C++20 <barrier>")
    assert done.returncode == 0, done.stderr
    return exe


def run(exe: Path, *args: object) -> None:
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"emulator exit {done.returncode}"
