"""A vision tower's tensors and config from a Hugging Face folder or a llama.cpp mmproj GGUF.

Both end up named as the mmproj files name them (`v.blk.{i}.attn_q.weight`, `mm.*`) and in the
engine's conventions: the projection as a `[text hidden, vision hidden]` matrix (both files
store its transpose) and the soft-embedding norm as `1 + w` (HF stores `w`; llama.cpp's
converter adds the 1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.models.vision.config import VisionConfig, vision_config_from_gguf, vision_config_from_hf
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]
Config = TypeVar("Config")

_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.(.+)$")
_LAYER_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "layer_norm1": "ln1",
    "layer_norm2": "ln2",
    "mlp.fc1": "ffn_up",
    "mlp.fc2": "ffn_down",
}
_TOP = {
    "embeddings.patch_embedding": "v.patch_embd",
    "embeddings.position_embedding": "v.position_embd",
    "post_layernorm": "v.post_ln",
}
_PROJECTOR = {
    "mm_input_projection_weight": "mm.input_projection.weight",
    "mm_soft_emb_norm.weight": "mm.soft_emb_norm.weight",
}


def mmproj_name(hf_name: str) -> str | None:
    """The mmproj name of one HF tensor of the vision side, or None for a text-side tensor."""
    name = hf_name.removeprefix("model.")
    if name.startswith("multi_modal_projector."):
        return _PROJECTOR.get(name.removeprefix("multi_modal_projector."))
    if not name.startswith("vision_tower."):
        return None
    # published checkpoints say vision_tower.vision_model.*; transformers 5 saves vision_tower.*
    return siglip_tensor_name(name.removeprefix("vision_tower.").removeprefix("vision_model."), hf_name)


def siglip_tensor_name(body: str, hf_name: str) -> str | None:
    """The mmproj name of a SigLIP tower tensor named `body` below its `vision_model.` (Gemma 3's
    tower, and PaddleOCR-VL's: the same modules); None for the pooling head neither uses."""
    module, _, kind = body.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{kind}"
    match = _LAYER.match(module)
    if match and match.group(2) in _LAYER_PARTS:
        return f"v.blk.{match.group(1)}.{_LAYER_PARTS[match.group(2)]}.{kind}"
    if module == "head" or module.startswith("head."):
        return None
    raise CheckpointError(f"unknown vision tensor {hf_name!r}")


def _as_f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, np.ascontiguousarray(values, np.float32), _F32)


def _engine_conventions(tensors: Tensors, hf: bool) -> Tensors:
    out = dict(tensors)
    for name in ("mm.input_projection.weight", "mm.soft_emb_norm.weight"):
        if name not in tensors:
            raise CheckpointError(f"the vision checkpoint has no {name}")
    out["mm.input_projection.weight"] = _as_f32(
        "mm.input_projection.weight", tensors["mm.input_projection.weight"].dequantize().T
    )
    if hf:
        norm = tensors["mm.soft_emb_norm.weight"].dequantize() + np.float32(1.0)
        out["mm.soft_emb_norm.weight"] = _as_f32("mm.soft_emb_norm.weight", norm)
    return out


def load_hf_vision(folder: Path, hf_config: dict) -> tuple[VisionConfig, Tensors] | None:
    """The vision side of a Gemma3ForConditionalGeneration folder; None for a text-only folder."""
    if "vision_config" not in hf_config:
        return None
    settings = read_processor_settings(folder, "image_processor")
    try:
        cfg = vision_config_from_hf(hf_config, settings.values, settings.source)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            name = mmproj_name(hf_name)
            if name is not None:
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    return cfg, _engine_conventions(tensors, hf=True)


def load_mmproj(path: Path, text_hidden_size: int) -> tuple[VisionConfig, Tensors]:
    """An mmproj GGUF (llama.cpp's vision half of a model)."""
    file = read_gguf(path)
    try:
        cfg = vision_config_from_gguf(file.metadata, text_hidden_size)
        tensors = _engine_conventions(dict(file.tensors), hf=False)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    width = tensors["mm.input_projection.weight"].shape[0]
    if width != text_hidden_size:
        raise CheckpointError(
            f"{path}: the projector outputs width {width}, the text model's hidden size is {text_hidden_size}"
        )
    return cfg, tensors


def read_prefixed(folder: Path, prefixes: Mapping[str, str]) -> Tensors:
    """The folder's tensors whose names start with one of `prefixes`, that prefix replaced by its value."""
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            prefix = next((p for p in prefixes if hf_name.startswith(p)), None)
            if prefix is not None:
                name = prefixes[prefix] + hf_name[len(prefix) :]
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    return tensors


def parsed_in(folder: Path, parse: Callable[[], Config]) -> Config:
    """`parse()`'s vision config, its errors (a malformed value's too) as CheckpointErrors naming the folder."""
    try:
        return parse()
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: config.json vision_config is malformed ({exc!r})") from None


def find_mmproj(model_path: Path) -> Path | None:
    """The mmproj GGUF beside a text GGUF (`mmproj*.gguf` in the same folder), if exactly one is there."""
    folder = model_path if model_path.is_dir() else model_path.parent
    found = sorted(p for p in folder.glob("*.gguf") if "mmproj" in p.name.lower())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise CheckpointError(f"{folder}: several mmproj files ({names}); pass one with --mmproj")
    return found[0] if found else None
