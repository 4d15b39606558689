"""What one model on disk is made of: a safetensors folder and its files, or a GGUF's shards.

Below both library.py (which lists models) and model_check.py (which checks their files), so the two
share it without importing each other.
"""

from __future__ import annotations

import re
from pathlib import Path

GGUF_SHARD_PATTERN = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def model_files(path: Path) -> tuple[Path, ...]:
    """A safetensors folder followed by its .safetensors files, or every shard of the GGUF at `path`."""
    if path.is_dir():
        return (path, *sorted(path.glob("*.safetensors")))
    return gguf_shards(path)


def gguf_shards(path: Path) -> tuple[Path, ...]:
    """Every shard of a split GGUF named by any one of them ("x-00002-of-00003.gguf"); else the file alone."""
    match = GGUF_SHARD_PATTERN.match(path.name)
    if match is None:
        return (path,)
    count = int(match["count"])
    return tuple(path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
