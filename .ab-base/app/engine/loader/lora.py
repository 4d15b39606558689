"""A PEFT LoRA adapter merged into a Hugging Face checkpoint's weights at load.

PEFT's LoRA layer computes `W x + s * B (A x)` with `s = lora_alpha / r` (`/ sqrt(r)` with
use_rslora; a per-module alpha from `alpha_pattern`), so merging `W + s * B @ A` gives the same
products: what PEFT's own `merge_and_unload` does. Granite Speech ships one (adapter_config.json and
adapter_model.safetensors beside the model) that transformers turns on whenever audio is in the input;
a transcription engine always has audio, so its weights are merged once.

Adapter tensors are named `base_model.model.<module>.lora_{A,B}.weight`, the module as the model held
it when saved (transformers 5's `model.language_model.layers.N...` or the hub's older
`language_model.model.layers.N...`); the loader's name table maps both to GGUF names. What this merge
cannot reproduce (DoRA, adapter biases, fully trained `modules_to_save`, transposed Conv1D weights,
targets outside the text model) is refused naming the file and the setting.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError, gguf_name
from app.engine.loader.safetensors import read_safetensors_file
from app.engine.quant.dispatch import QuantizedTensor

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_LORA_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.default)?\.weight$")
_FLOAT_TYPES = ("F32", "F16", "BF16")
# settings whose non-default value means the adapter is not a plain low-rank delta on weights
# (an activated LoRA applies only after its invocation tokens: no single merged weight reproduces it)
_REFUSED = {"use_dora": False, "fan_in_fan_out": False, "lora_bias": False, "bias": "none",
            "modules_to_save": None, "target_parameters": None, "alora_invocation_tokens": None,
            "use_qalora": False}  # fmt: skip


@dataclass(frozen=True)
class LoraDelta:
    """One weight's low-rank update: `scale * b @ a` with `a [r, in]`, `b [out, r]`."""

    a: np.ndarray
    b: np.ndarray
    scale: float


@dataclass(frozen=True)
class LoraAdapter:
    folder: Path
    deltas: dict[str, LoraDelta]  # by the GGUF name of the weight they update

    @property
    def parameter_count(self) -> int:
        return sum(d.a.size + d.b.size for d in self.deltas.values())


def has_lora_adapter(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file()


def read_lora_adapter(folder: Path, architecture: str) -> LoraAdapter:
    """The adapter in `folder` (adapter_config.json + adapter_model.safetensors) for a checkpoint of
    `architecture`; CheckpointError naming the file and what is wrong."""
    settings = _read_settings(folder / ADAPTER_CONFIG)
    weights_file = folder / ADAPTER_WEIGHTS
    if not weights_file.is_file():
        raise CheckpointError(f"{weights_file}: missing (adapter_config.json names a LoRA adapter)")
    pairs: dict[str, dict[str, QuantizedTensor]] = {}
    for name, tensor in read_safetensors_file(weights_file).items():
        match = _LORA_NAME.match(name.removeprefix(_PEFT_PREFIX))
        if match is None:
            raise CheckpointError(f"{weights_file}: tensor {name!r} is not a LoRA A or B matrix")
        pairs.setdefault(match["module"], {})[match["part"]] = tensor
    deltas = {}
    for module, parts in pairs.items():
        if set(parts) != {"A", "B"}:
            raise CheckpointError(f"{weights_file}: {module} has lora_{next(iter(parts))} without its pair")
        target = gguf_name(f"{module}.weight", architecture)
        if target is None:
            raise CheckpointError(
                f"{weights_file}: the adapter updates {module}, outside the text model; only text-model "
                "projections can be merged"
            )
        a, b = parts["A"].dequantize(), parts["B"].dequantize()
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise CheckpointError(
                f"{weights_file}: {module} lora_A {list(a.shape)} and lora_B {list(b.shape)} are not a rank-r pair"
            )
        deltas[target] = LoraDelta(a, b, _scale(settings, module, a.shape[0], folder / ADAPTER_CONFIG))
    if not deltas:
        raise CheckpointError(f"{weights_file}: holds no LoRA matrices")
    return LoraAdapter(folder, deltas)


def merge_lora(checkpoint: Any, adapter: LoraAdapter) -> Any:
    """The checkpoint with every updated weight replaced by `W + scale * B @ A`, computed in float32 and
    stored in the weight's own float format (a quantized weight is refused: it has no exact merge)."""
    if checkpoint.format != "safetensors":
        raise CheckpointError(
            f"{adapter.folder}: a LoRA adapter merges into a Hugging Face folder's weights only"
        )
    tensors = dict(checkpoint.tensors)
    for name, delta in adapter.deltas.items():
        weight = tensors.get(name)
        if weight is None:
            raise CheckpointError(
                f"{adapter.folder / ADAPTER_WEIGHTS}: updates {name}, which the model lacks"
            )
        if weight.qtype.name not in _FLOAT_TYPES:
            raise CheckpointError(
                f"{adapter.folder / ADAPTER_WEIGHTS}: {name} is stored as {weight.qtype.name}; LoRA merges into "
                f"{', '.join(_FLOAT_TYPES)} weights only"
            )
        expected = (delta.b.shape[0], delta.a.shape[1])
        if tuple(weight.shape) != expected:
            raise CheckpointError(
                f"{adapter.folder / ADAPTER_WEIGHTS}: the update of {name} is {list(expected)}, "
                f"the weight {list(weight.shape)}"
            )
        merged = weight.dequantize() + np.float32(delta.scale) * (delta.b @ delta.a)
        tensors[name] = QuantizedTensor.from_float(name, merged.astype(np.float32), weight.qtype)
    return replace(checkpoint, tensors=tensors)


def _read_settings(path: Path) -> dict[str, Any]:
    try:
        settings = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read the adapter's settings ({exc})") from None
    if not isinstance(settings, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(settings).__name__}, not the adapter's settings")
    if settings.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(
            f"{path}: peft_type {settings.get('peft_type')!r}; only LORA adapters are merged"
        )
    for key, default in _REFUSED.items():
        value = settings.get(key, default)
        if value not in (default, [], {}) and not (key == "bias" and value is None):
            raise CheckpointError(f"{path}: {key} is {value!r}; only plain LoRA (no {key}) is merged")
    alpha = settings.get("lora_alpha")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise CheckpointError(f"{path}: lora_alpha is {alpha!r}, not a positive number")
    return settings


def _scale(settings: dict[str, Any], module: str, rank: int, source: Path) -> float:
    """PEFT's scaling for one module: its alpha (alpha_pattern's, matched as PEFT matches: the key is the
    module name's tail) over its rank, or over the rank's square root with use_rslora."""
    alpha = settings["lora_alpha"]
    for key, value in (settings.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            alpha = value
            break
    if not isinstance(alpha, (int, float)) or alpha <= 0:
        raise CheckpointError(
            f"{source}: alpha_pattern gives {module} alpha {alpha!r}, not a positive number"
        )
    return float(alpha) / (math.sqrt(rank) if settings.get("use_rslora") else rank)
