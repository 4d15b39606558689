"""A Hugging Face folder's processor settings, in either of the layouts transformers writes.

Up to transformers 4, each part of a processor had its own file: the image processor's and the
audio feature extractor's settings in `preprocessor_config.json`, the video processor's in
`video_preprocessor_config.json`. transformers 5 saves them all in `processor_config.json`, one
object per part (`"image_processor": {...}`, `"video_processor"`, `"feature_extractor"`), and
writes no per-part file. Its loaders read the nested object first and the per-part file only when
that is missing; so does this one, so that a folder means what transformers makes of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError

PROCESSOR_FILE = "processor_config.json"
# part -> the file it had to itself before transformers 5
PART_FILES = {
    "image_processor": "preprocessor_config.json",
    "feature_extractor": "preprocessor_config.json",
    "video_processor": "video_preprocessor_config.json",
}


@dataclass(frozen=True)
class ProcessorSettings:
    values: dict[str, Any]
    source: str  # where they came from, for errors: "processor_config.json image_processor"


def read_processor_settings(folder: Path, part: str) -> ProcessorSettings:
    """One part's settings (`image_processor`, `feature_extractor`, `video_processor`); empty
    settings (the processor's defaults) where the folder has neither layout's. Unreadable files
    raise CheckpointError naming the file."""
    if part not in PART_FILES:
        raise ValueError(f"unknown processor part {part!r}; expected one of {', '.join(PART_FILES)}")
    combined = _read_object(folder / PROCESSOR_FILE)
    if combined is not None and part in combined:
        nested = combined[part]
        if not isinstance(nested, dict):
            raise CheckpointError(
                f"{folder / PROCESSOR_FILE}: {part} is a {type(nested).__name__}, not an object of settings"
            )
        return ProcessorSettings(nested, f"{PROCESSOR_FILE} {part}")
    own = _read_object(folder / PART_FILES[part])
    if own is None:
        return ProcessorSettings({}, f"the {part}'s defaults (no {PROCESSOR_FILE} or {PART_FILES[part]})")
    return ProcessorSettings(own, PART_FILES[part])


def _read_object(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(values, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(values).__name__}, not an object of settings")
    return values
