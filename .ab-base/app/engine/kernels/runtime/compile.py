"""Run-time compilation of the CUDA kernels: NVRTC through CuPy, cached on disk.

A module is one `.cu` file of this folder compiled with a set of `-D` defines (one
format, one head size...). Its cubin is stored under the cache folder, named by a hash
of everything that decides the machine code: the sources (the `.cu` and every `.cuh`
here), the options, the GPU architecture and the NVRTC version. A second run, or a
second process, loads the cubin without compiling. The folder is
`$PADDOCK_KERNEL_CACHE`, else `<user cache>/paddock/kernels` (app/engine/envs.py).

CuPy is imported lazily: importing this module costs nothing on a machine without a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from app.engine import envs

KERNEL_DIR = Path(__file__).resolve().parents[1] / "csrc"  # the .cu sources and their .cuh headers
BASE_OPTIONS = ("-std=c++17",)
_lock = threading.Lock()


def cache_dir() -> Path:
    if envs.PADDOCK_KERNEL_CACHE:
        return Path(envs.PADDOCK_KERNEL_CACHE)
    root = envs.XDG_CACHE_HOME or envs.LOCALAPPDATA or Path.home() / ".cache"
    return Path(root) / "paddock" / "kernels"


def define_options(defines: dict[str, str | int]) -> tuple[str, ...]:
    return tuple(f"-D{key}={value}" for key, value in sorted(defines.items()))


@functools.cache
def _headers_text() -> str:
    return "".join(p.read_text() for p in sorted(KERNEL_DIR.glob("*.cuh")))


def module_digest(name: str, options: tuple[str, ...], arch: str, compiler: str) -> str:
    """Hash of every input that decides the compiled code of one module."""
    h = hashlib.sha256()
    for part in ((KERNEL_DIR / name).read_text(), _headers_text(), "\0".join(options), arch, compiler):
        h.update(part.encode())
        h.update(b"\x01")
    return h.hexdigest()[:24]


def device_arch() -> str:
    """Compute capability of the current device as NVRTC spells it ("90")."""
    import cupy

    return str(cupy.cuda.Device().compute_capability)


MIN_CLUSTER_CC = 90  # thread-block clusters and distributed shared memory: sm_90+
MAX_CLUSTER = 8  # blocks per thread-block cluster: the portable maximum on sm_90


@functools.cache
def clusters_supported() -> bool:
    """Whether this device can run thread-block clusters: sm_90+."""
    return int(device_arch()) >= MIN_CLUSTER_CC


def _nvrtc_version() -> str:
    from cupy.cuda import nvrtc

    return "nvrtc-{}.{}".format(*nvrtc.getVersion())


def _compile_to_file(name: str, options: tuple[str, ...], arch: str, path: Path) -> Path:
    from cupy.cuda import compiler

    source = (KERNEL_DIR / name).read_text()
    all_options = (*BASE_OPTIONS, f"-I{KERNEL_DIR}", *options)
    binary, _ = compiler.compile_using_nvrtc(source, all_options, arch, filename=name)
    # NVRTC returns a cubin for architectures it knows and PTX (JIT-compiled by the driver) for newer ones.
    suffix = ".cubin" if binary[:4] == b"\x7fELF" else ".ptx"
    path = path.with_suffix(suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(binary if isinstance(binary, bytes) else binary.encode())
    os.replace(tmp, path)  # atomic: a concurrent process sees the whole file or none
    return path


@functools.cache
def get_module(name: str, options: tuple[str, ...] = ()) -> Any:
    """The loaded `cupy.RawModule` of kernel file `name` compiled with `options`."""
    import cupy

    arch = device_arch()
    digest = module_digest(name, options, arch, _nvrtc_version())
    stem = cache_dir() / f"sm{arch}" / f"{Path(name).stem}-{digest}"
    with _lock:
        for suffix in (".cubin", ".ptx"):
            if stem.with_suffix(suffix).exists():
                return cupy.RawModule(path=str(stem.with_suffix(suffix)))
        try:
            path = _compile_to_file(name, options, arch, stem)
        except (AttributeError, ImportError, TypeError):
            # CuPy moved its NVRTC helper: let RawModule compile (and cache, in CuPy's own folder).
            source = (KERNEL_DIR / name).read_text()
            return cupy.RawModule(code=source, options=(*BASE_OPTIONS, f"-I{KERNEL_DIR}", *options))
        return cupy.RawModule(path=str(path))


def get_kernel(name: str, kernel: str, defines: dict[str, str | int] | None = None) -> Any:
    """One `extern "C"` kernel of a module, ready to launch as `k(grid, block, args)`, with
    $PADDOCK_KERNEL_DEFINES added (A/B runs of a kernel constant without editing the sources)."""
    options = define_options({**(defines or {}), **envs.PADDOCK_KERNEL_DEFINES})
    return get_module(name, options).get_function(kernel)
