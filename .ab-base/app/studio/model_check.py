"""Is a model's file whole and usable? Asked before a switch unloads anything, and for the library's marks.

The checks are the engine's own (`app.engine.loader.gguf.read_gguf`: magic, version, every
tensor's type, shape and extent against the file's size); they read the header and map
the file, never the weights, so a 20 GB model is checked in well under a second. A
safetensors folder is checked the same way: each file holds the bytes its header declares.
A file that ends before its tensors do is an incomplete download; anything else that
fails is corrupt or unsupported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from app.engine.loader import gguf as gguf_loader
from app.engine.loader import safetensors as safetensors_loader
from app.studio.model_parts import model_files

INCOMPLETE_HINT = "incomplete download — resume or delete"
_TRUNCATION_WORDS = ("truncated", "ends inside", "runs past the end")


@dataclass(frozen=True)
class FileProblem:
    incomplete: bool  # the file stops short of what its header declares
    detail: str  # the engine's own sentence, naming file and tensor

    @property
    def message(self) -> str:
        what = INCOMPLETE_HINT if self.incomplete else "corrupt or unsupported file"
        return f"{what}: {self.detail}"


def check_model_files(files: tuple[Path, ...]) -> FileProblem | None:
    """None when every file of the model is whole; else what is wrong. `files`: GGUF shards, or a
    safetensors folder followed by its .safetensors files (as the library lists them)."""
    if files and files[0].is_dir():
        return _check_safetensors(files[1:])
    for file in files:
        if not file.is_file():
            return FileProblem(True, f"{file.name} is missing")
        try:
            gguf_loader.read_gguf(file)
        except (ValueError, OSError) as exc:  # CheckpointError is a ValueError
            detail = str(exc)
            return FileProblem(any(word in detail for word in _TRUNCATION_WORDS), detail)
    return None


def check_model_path(path: str | os.PathLike[str]) -> FileProblem | None:
    """The same for a path as EngineConfig names it; None for what is not a local file (left to the engine)."""
    path = Path(path).expanduser()
    return check_model_files(model_files(path)) if path.exists() else None


def _check_safetensors(files: tuple[Path, ...]) -> FileProblem | None:
    if not files:
        return FileProblem(False, "the folder holds no .safetensors files")
    for file in files:
        try:
            table, data_start = safetensors_loader.read_header(file)  # the engine's reader: it loads the same
            table.pop("__metadata__", None)
            end = data_start + max((t["data_offsets"][1] for t in table.values()), default=0)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return FileProblem(False, f"{file.name}: unreadable safetensors header ({exc})")
        size = file.stat().st_size
        if size < end:
            return FileProblem(True, f"{file.name} has {size:,} bytes; its tensors need {end:,}")
    return None
