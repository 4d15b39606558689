"""Which mmproj file (a GGUF model's vision projector, published beside it by llama.cpp's converters)
goes with a GGUF model in a hub repo.

The engine loads an mmproj only from the model's own folder, and refuses a folder with several
(models/vision/weights.find_mmproj), so the pick is one file from the same folder, and always the
same one for every quantization of the repo: two downloaded side by side share it. Of several,
F16 first (what ggml-org's own repos publish, and lossless for the BF16 originals in practice),
then BF16, F32, Q8_0, then the smallest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Protocol, TypeVar

from app.engine.plan.fit import is_mmproj_name

PREFERENCE = ("f16", "bf16", "f32", "q8_0")


class HubFile(Protocol):
    path: str
    size: int


def is_mmproj(path: str) -> bool:
    return is_mmproj_name(PurePosixPath(path).name)


F = TypeVar("F", bound=HubFile)


def pick_mmproj(files: Sequence[F], model_path: str) -> F | None:
    """The mmproj file for the GGUF model at `model_path` among a repo's `files`, or None."""
    if is_mmproj(model_path):
        return None
    folder = PurePosixPath(model_path).parent
    beside = [f for f in files if is_mmproj(f.path) and PurePosixPath(f.path).parent == folder]
    return min(beside, key=_rank, default=None)


def _rank(file: HubFile) -> tuple[int, int, str]:
    stem = PurePosixPath(file.path).stem.lower()
    tags = stem.replace("_", "-").replace(".", "-").split("-")
    tags += [stem.rsplit("-", 1)[-1]]  # "q8_0" keeps its underscore
    preferred = next((i for i, tag in enumerate(PREFERENCE) if tag in tags), len(PREFERENCE))
    return preferred, file.size, file.path
