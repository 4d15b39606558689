"""Open any checkpoint the engine understands as one `Checkpoint`: GGUF-named tensors in their file's layout.

A checkpoint is a `.gguf` file, or a Hugging Face folder (config.json + safetensors). A
folder that holds a single .gguf and no config.json, as model folders downloaded for
llama.cpp or LM Studio do, opens that file (an `mmproj*.gguf` beside it, a vision model's
projector, is not counted: models/vision loads it with the model).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gguf as gguf_constants
import numpy as np

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError, architecture_of
from app.engine.loader.safetensors import read_safetensors_folder
from app.engine.quant.dispatch import QuantizedTensor

__all__ = ["Checkpoint", "CheckpointError", "describe_quantization", "open_checkpoint", "parameter_count"]


@dataclass(frozen=True)
class Checkpoint:
    format: Literal["gguf", "safetensors"]
    path: Path
    architecture: str  # GGUF architecture name: "gemma3", "llama", "qwen2", "qwen3", ...
    tensors: dict[str, QuantizedTensor]  # by GGUF name
    metadata: dict[str, Any] = field(default_factory=dict)  # GGUF key/values (empty for safetensors)
    hf_config: dict[str, Any] | None = None  # config.json (None for GGUF)
    tokenizer_dir: Path | None = None  # folder with tokenizer.json, when the checkpoint has one

    @property
    def parameter_count(self) -> int:
        return parameter_count(self.tensors)

    @property
    def quantization(self) -> str:
        return describe_quantization(self.tensors, self.metadata)

    @property
    def quant_mix(self) -> tuple[tuple[str, int], ...]:
        """(format, tensor count) of every format present, most tensors first: a mixed file at a glance."""
        return tuple(Counter(t.qtype.name for t in self.tensors.values()).most_common())


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open a .gguf file or a Hugging Face safetensors folder; CheckpointError naming the path if it cannot be."""
    path = Path(path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return _open_safetensors(path)
        return _open_gguf(_single_gguf_in(path))
    if path.is_file():
        if path.suffix == ".safetensors" and (path.parent / "config.json").is_file():
            return _open_safetensors(path.parent)
        return _open_gguf(path)
    raise CheckpointError(f"{path}: no such file or folder")


def _single_gguf_in(folder: Path) -> Path:
    """The folder's model GGUF; an mmproj beside it is its vision tower, not a second model."""
    ggufs = sorted(folder.glob("*.gguf"))
    found = [p for p in ggufs if "mmproj" not in p.name.lower()]
    if len(found) == 1:
        return found[0]
    if not found:
        alone = " (an mmproj file is a vision projector: it needs its model GGUF beside it)"
        raise CheckpointError(
            f"{folder}: not a checkpoint folder (expected config.json with safetensors, or a .gguf file)"
            + (alone if ggufs else "")
        )
    names = ", ".join(p.name for p in found)
    raise CheckpointError(f"{folder}: holds several .gguf files ({names}); pass the one to open")


def _open_gguf(path: Path) -> Checkpoint:
    gguf_file = read_gguf(path)
    architecture = gguf_file.metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise CheckpointError(f"{path}: metadata has no general.architecture")
    return Checkpoint("gguf", path, architecture, gguf_file.tensors, metadata=gguf_file.metadata)


def _open_safetensors(folder: Path) -> Checkpoint:
    config_path = folder / "config.json"
    try:
        hf_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_path}: cannot read config.json: {exc}") from None
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: config.json is not a JSON object")
    try:
        architecture = architecture_of(hf_config)
    except CheckpointError as exc:
        raise CheckpointError(f"{config_path}: {exc}") from None
    quant_config = hf_config.get("quantization_config")
    tensors = read_safetensors_folder(
        folder, architecture, quant_config if isinstance(quant_config, dict) else None
    )
    tokenizer_dir = folder if (folder / "tokenizer.json").is_file() else None
    return Checkpoint(
        "safetensors", folder, architecture, tensors, hf_config=hf_config, tokenizer_dir=tokenizer_dir
    )


def parameter_count(tensors: dict[str, QuantizedTensor]) -> int:
    return sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensors.values())


def describe_quantization(tensors: dict[str, QuantizedTensor], metadata: dict[str, Any] | None = None) -> str:
    """e.g. "Q4_K_M (Q8_0, Q5_0, Q6_K, Q4_K, F32)": the file's declared type, then the formats present by bytes.

    The label is GGUF's `general.file_type` when the file states it; otherwise the one format
    present, or "mixed".
    """
    bytes_by_type: Counter[str] = Counter()
    for tensor in tensors.values():
        bytes_by_type[tensor.qtype.name] += tensor.nbytes
    present = [name for name, _ in bytes_by_type.most_common()]
    label = _file_type_name((metadata or {}).get("general.file_type"))
    if label is None:
        label = present[0] if len(present) == 1 else "mixed"
    return label if present == [label] or not present else f"{label} ({', '.join(present)})"


def _file_type_name(file_type: Any) -> str | None:
    try:
        name = gguf_constants.LlamaFileType(file_type).name
    except ValueError:
        return None
    if name == "GUESSED":
        return None
    return "F32" if name == "ALL_F32" else name.removeprefix("MOSTLY_")
