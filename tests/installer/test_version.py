"""`paddock --version`: the version the package declares, the backend this machine gets, CUDA/CuPy versions."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_version(*extra_path: Path) -> list[str]:
    env_path = ":".join(str(p) for p in extra_path)
    code = "import sys; sys.path[:0] = [p for p in sys.argv[1].split(':') if p]; from app.cli import main; main(['--version'])"
    out = subprocess.run([sys.executable, "-c", code, env_path], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_version_is_the_projects_and_names_the_backend():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    lines = run_version()
    assert lines[0] == f"Paddock Studio {declared}"
    import app

    assert app.__version__ == declared  # the bundle reads app.__version__: it has no package metadata
    backend = next(line for line in lines if line.startswith("engine backend: "))
    assert backend.split(":")[1].strip() in ("cpu", "cuda")
    assert any(line.startswith("CuPy: ") for line in lines) and any(line.startswith("CUDA runtime: ") for line in lines)


def fake_cupy(folder: Path, driver: int, device_error: str | None) -> Path:
    """A stand-in `cupy` answering as CuPy does on a machine with this driver (0: none installed)."""
    (folder / "cupy" / "cuda").mkdir(parents=True)
    (folder / "cupy" / "__init__.py").write_text("__version__ = '14.2.0'\nfrom cupy import cuda\n")
    (folder / "cupy" / "cuda" / "__init__.py").write_text(textwrap.dedent(f"""
        class runtime:
            runtimeGetVersion = staticmethod(lambda: 13000)
            driverGetVersion = staticmethod(lambda: {driver})
            @staticmethod
            def getDeviceCount():
                if {device_error!r}:
                    raise RuntimeError({device_error!r})
                return 1
            getDeviceProperties = staticmethod(lambda i: {{"name": b"NVIDIA H200", "major": 9, "minor": 0}})
    """))
    (folder / "cupy_cuda13x-14.2.0.dist-info").mkdir()
    (folder / "cupy_cuda13x-14.2.0.dist-info" / "METADATA").write_text("Name: cupy-cuda13x\nVersion: 14.2.0\n")
    return folder


def test_without_a_driver_it_says_which_driver_the_cuda_13_build_needs(tmp_path):
    lines = run_version(fake_cupy(tmp_path, driver=0, device_error=None))
    assert "engine backend: cpu: no NVIDIA driver is installed" in lines
    assert "CuPy: 14.2.0 (CUDA 13 wheel)" in lines
    assert "CUDA runtime: 13.0; driver supports CUDA: no driver" in lines
    assert any(line.startswith("for the GPU: NVIDIA driver 580.65 or newer on Linux") for line in lines)


def test_a_driver_older_than_the_runtime_is_named_as_the_reason(tmp_path):
    lines = run_version(fake_cupy(tmp_path, driver=12040, device_error="cudaErrorInsufficientDriver"))
    assert "engine backend: cpu: the NVIDIA driver cannot run this CUDA runtime: cudaErrorInsufficientDriver" in lines
    assert "CUDA runtime: 13.0; driver supports CUDA: 12.4" in lines


def test_a_usable_gpu_is_the_backend(tmp_path):
    lines = run_version(fake_cupy(tmp_path, driver=13000, device_error=None))
    assert "engine backend: cuda: NVIDIA H200, sm_90" in lines
    assert not any(line.startswith("for the GPU") for line in lines)


def test_the_banner_speaks_only_when_the_engine_runs_on_the_cpu():
    from app.studio.gpu_support import GpuSupport

    assert GpuSupport("cuda", "NVIDIA H200, sm_90", cuda_major=13).banner() is None
    banner = GpuSupport("cpu", "no NVIDIA driver is installed", cuda_major=12).banner()
    assert banner == ("Running on the CPU: no NVIDIA driver is installed. The GPU engine needs NVIDIA driver "
                      "525.60 or newer on Linux, 527.41 or newer on Windows (CUDA 12).")


def test_building_the_parser_loads_no_cupy():
    code = "import sys; from app.cli import build_parser; build_parser(); print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _pci(root, *devices: tuple[str, str]):
    """A sysfs PCI folder with (vendor, class) devices."""
    for number, (vendor, kind) in enumerate(devices):
        device = root / f"0000:00:{number:02x}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(kind + "\n")
    return root


def test_a_machine_without_an_nvidia_gpu_gets_no_banner(tmp_path):
    from app.studio.gpu_support import GpuSupport, gpu_support, nvidia_gpu_present

    none = _pci(tmp_path / "none", ("0x8086", "0x030000"), ("0x1af4", "0x010000"))  # Intel graphics, virtio disk
    audio = _pci(tmp_path / "audio", ("0x10de", "0x040300"))  # an NVIDIA HDMI audio function is not a GPU
    gpu = _pci(tmp_path / "gpu", ("0x8086", "0x060000"), ("0x10de", "0x030200"))  # a 3D controller (H100)
    assert nvidia_gpu_present(none) is False and nvidia_gpu_present(audio) is False
    assert nvidia_gpu_present(gpu) is True and nvidia_gpu_present(tmp_path / "no-sysfs") is None
    assert gpu_support(none).banner() is None  # the CPU is all there is: nothing to install
    assert gpu_support(none).lines()[0].startswith("engine backend: cpu")  # --version still says why
    assert GpuSupport("cpu", "no NVIDIA driver is installed", cuda_major=12, nvidia_gpu=True).banner()
    assert GpuSupport("cpu", "CuPy is not installed", nvidia_gpu=None).banner()  # cannot tell: say it
