"""The memory a device has free: GPU 0 through CuPy when a GPU is usable, else the CPU's RAM."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MiB = 1024**2
GiB = 1024**3


@dataclass(frozen=True)
class DeviceMemory:
    kind: str  # "cuda" | "cpu"
    name: str
    free_bytes: int | None  # None: could not be read
    total_bytes: int | None

    def describe(self) -> str:
        if self.free_bytes is None:
            return f"{self.name}: free memory unknown"
        total = f" of {format_bytes(self.total_bytes)}" if self.total_bytes else ""
        return f"{self.name}: {format_bytes(self.free_bytes)} free{total}"


def device_memory() -> DeviceMemory:
    """Free memory of GPU 0 through CuPy when a GPU is usable, else the CPU's available RAM."""
    return _cuda_memory() or cpu_memory()


def _cuda_memory() -> DeviceMemory | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        free, total = cupy.cuda.runtime.memGetInfo()
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    except Exception:  # no driver or no device: CuPy imports fine but every call fails
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceMemory("cuda", name, int(free), int(total))


def cpu_memory(meminfo: str | os.PathLike[str] = "/proc/meminfo") -> DeviceMemory:
    """Available RAM from /proc/meminfo (Linux), else from sysconf; 'unknown' when neither works."""
    name = "no GPU: CPU RAM"
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines() if ":" in line)
        kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731 - values are "12345 kB"
        return DeviceMemory("cpu", name, kib("MemAvailable"), kib("MemTotal"))
    except (OSError, KeyError, ValueError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return DeviceMemory("cpu", name, os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page)
    except (AttributeError, OSError, ValueError):
        return DeviceMemory("cpu", name, None, None)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
