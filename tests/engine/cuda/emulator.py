"""Build and run the SIMT-emulator harnesses of tests/engine/cuda/host (CUDA kernels as host C++)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from app.engine.kernels.runtime.compile import KERNEL_DIR

HOST_DIR = Path(__file__).parent / "host"
TIMEOUT = 300


def build(tmp_path_factory, main: str, defines: tuple[str, ...] = ()) -> Path:
    """Compile host/`main` with the emulator force-included (and `defines`, "-DNAME=VALUE"); skip
    where no C++20 compiler is. A build is kept in `cache_dir()` under a hash of everything it is
    made from, so later runs (and the other modules' builds of the same harness) skip the compiler."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    flags = ["-std=c++20", "-O1", "-ffp-contract=off", "-w", "-pthread", "-DPADDOCK_HOST_SHIM", "-include",
             str(HOST_DIR / "simt_emulator.h"), f"-I{KERNEL_DIR}", *defines, str(HOST_DIR / main)]  # fmt: skip
    cache = cache_dir()
    exe = (cache or tmp_path_factory.mktemp("emu")) / f"{Path(main).stem}-{_build_key(cxx, flags)}"
    if exe.exists():
        return exe
    partial = exe.with_name(f"{exe.name}.{os.getpid()}.partial")  # renamed when whole: parallel runs share the cache
    done = subprocess.run([cxx, *flags, "-o", str(partial)], capture_output=True, text=True)
    if done.returncode and "barrier" in done.stderr:
        pytest.skip("the C++ compiler lacks C++20 <barrier>")
    assert done.returncode == 0, done.stderr
    partial.replace(exe)
    return exe


def cache_dir() -> Path | None:
    """PADDOCK_EMULATOR_CACHE, else the user cache folder's paddock/emulator; None (build in the test's
    temporary folder every time) where it is set to "off" or cannot be created."""
    chosen = os.environ.get("PADDOCK_EMULATOR_CACHE", "").strip()
    if chosen == "off":
        return None
    folder = Path(chosen) if chosen else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paddock" / "emulator"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def _build_key(cxx: str, flags: list[str]) -> str:
    """Hash of the compiler (path and version), the flags and every source a harness may include."""
    digest = hashlib.sha256()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    for part in (cxx, version, *flags):
        digest.update(part.encode() + b"\0")
    for folder in (HOST_DIR, KERNEL_DIR):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def run(exe: Path, *args: object) -> None:
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"emulator exit {done.returncode}"
