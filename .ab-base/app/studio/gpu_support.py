"""What this installation can run on: its CuPy build, the CUDA driver found, and what to do about it.

`paddock --version` prints it and the Studio shows `banner()` when the engine would run on
the CPU on a machine that has an NVIDIA GPU (one with none has nothing to install: no banner;
the PCI bus in sysfs says which, without any driver): an installer built with `--cuda 12` or `--cuda 13` carries one CuPy wheel, and each
needs an NVIDIA driver at least as new as its CUDA major version. CuPy is imported lazily and
only here, so the CPU path and machines without a driver never load the CUDA libraries; any
call that needs a driver is caught and reported as the reason.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from dataclasses import dataclass
from pathlib import Path

# The oldest driver each CUDA major version runs on (NVIDIA's CUDA release notes, "minor version
# compatibility": any 12.x runtime works from the 12.0 driver, any 13.x from the 13.0 driver).
DRIVER_NEEDED = {
    12: "NVIDIA driver 525.60 or newer on Linux, 527.41 or newer on Windows (CUDA 12)",
    13: "NVIDIA driver 580.65 or newer on Linux, 580.88 or newer on Windows (CUDA 13)",
}
CUPY_DISTRIBUTIONS = {"cupy-cuda12x": 12, "cupy-cuda13x": 13}
NVIDIA_PCI_VENDOR = "0x10de"
PCI_DEVICES = Path("/sys/bus/pci/devices")


@dataclass(frozen=True)
class GpuSupport:
    backend: str  # "cuda" when the engine's "auto" device would pick the GPU, else "cpu"
    reason: str  # what was found, or why the GPU cannot be used
    cupy_version: str | None = None
    cuda_major: int | None = None  # of the CuPy wheel this installation carries
    cuda_runtime: str | None = None  # "13.0"
    driver_cuda: str | None = None  # the newest CUDA version the installed driver supports
    gpu: str | None = None
    nvidia_gpu: bool | None = None  # an NVIDIA GPU on the PCI bus; None: cannot tell here (not Linux)

    @property
    def driver_needed(self) -> str:
        if self.cuda_major in DRIVER_NEEDED:
            return DRIVER_NEEDED[self.cuda_major]
        if getattr(sys, "frozen", False):  # an installed bundle built with --cuda none
            return f"the CUDA download of Paddock Studio and an {DRIVER_NEEDED[12]}"
        return "CuPy: pip install 'paddock-studio[cuda12]' or '[cuda13]', matching the driver (nvidia-smi)"

    def banner(self) -> str | None:
        """One sentence for the window when the engine runs on the CPU of a machine with an NVIDIA GPU; None
        when it uses the GPU or the machine has none (nothing to install would change that)."""
        if self.backend == "cuda" or self.nvidia_gpu is False:
            return None
        return f"Running on the CPU: {self.reason}. The GPU engine needs {self.driver_needed}."

    def lines(self) -> list[str]:
        """`paddock --version`'s report, one fact a line."""
        out = [f"engine backend: {self.backend}: {self.reason}"]
        out.append(f"CuPy: {self.cupy_version or 'not installed'}"
                   + (f" (CUDA {self.cuda_major} wheel)" if self.cuda_major else ""))
        out.append(f"CUDA runtime: {self.cuda_runtime or 'none'}; driver supports CUDA: {self.driver_cuda or 'no driver'}")
        if self.backend != "cuda":
            out.append(f"for the GPU: {self.driver_needed}")
        return out


def gpu_support(pci_devices: Path = PCI_DEVICES) -> GpuSupport:
    """Probe CuPy and the driver once (about a second with a GPU; instant without CuPy)."""
    major, present = cupy_cuda_major(), nvidia_gpu_present(pci_devices)
    try:
        import cupy
    except ImportError:
        return GpuSupport("cpu", "this installation has no CUDA support: CuPy is not installed", cuda_major=major,
                          nvidia_gpu=present)
    found: dict = dict(cupy_version=cupy.__version__, cuda_major=major, nvidia_gpu=present)
    with contextlib.suppress(Exception):  # a CuPy whose CUDA runtime library is missing from this machine
        found["cuda_runtime"] = _cuda_version(cupy.cuda.runtime.runtimeGetVersion())
    try:
        driver = cupy.cuda.runtime.driverGetVersion()
    except Exception as exc:
        return GpuSupport("cpu", f"no NVIDIA driver could be loaded: {_first_line(exc)}", **found)
    if driver == 0:
        return GpuSupport("cpu", "no NVIDIA driver is installed", **found)
    found["driver_cuda"] = _cuda_version(driver)
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        props = cupy.cuda.runtime.getDeviceProperties(0) if count else None
    except Exception as exc:  # a driver older than the runtime: cudaErrorInsufficientDriver
        return GpuSupport("cpu", f"the NVIDIA driver cannot run this CUDA runtime: {_first_line(exc)}", **found)
    if props is None:
        return GpuSupport("cpu", "the NVIDIA driver found no GPU", **found)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return GpuSupport("cuda", f"{name}, sm_{props['major']}{props['minor']}", gpu=name, **found)


def nvidia_gpu_present(pci_devices: Path = PCI_DEVICES) -> bool | None:
    """Whether the PCI bus has an NVIDIA display or 3D controller (vendor 0x10de, class 0x03xxxx), read from
    sysfs without any driver; None where there is no sysfs to read (Windows, macOS, a container without it)."""
    if not pci_devices.is_dir():
        return None
    for device in pci_devices.iterdir():
        with contextlib.suppress(OSError):
            vendor = (device / "vendor").read_text().strip().lower()
            if vendor == NVIDIA_PCI_VENDOR and (device / "class").read_text().strip().lower().startswith("0x03"):
                return True
    return False


def cupy_cuda_major() -> int | None:
    """The CUDA major version of the installed CuPy wheel, from its distribution name."""
    for distribution, major in CUPY_DISTRIBUTIONS.items():
        try:
            importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return major
    return None


def _cuda_version(encoded: int) -> str:
    """CUDA's integer versions (13000 -> "13.0")."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
