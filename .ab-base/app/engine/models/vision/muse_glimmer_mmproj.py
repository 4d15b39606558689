"""Muse Glimmer's vision tower from a llama.cpp mmproj GGUF (projector type `muse-glimmer`).

llama.cpp's converter (its `MuseGlimmerVisionModel` class) writes the tower as
tools/mtmd/models/muse-glimmer.cpp runs it; this module undoes what differs from the Hugging Face layout
muse_glimmer_vision.py reads:

- the patch embedding `v.patch_embd.weight` is `[hidden, 3, p, p]`, its temporal halves already summed;
- each block's `attn_q` / `attn_k` rows (and biases) are permuted for ggml's interleaved rotation: put back
  in rotate-half order; `ln1` / `ln2` / `attn_out` / `ffn_up` / `ffn_down` are norm1 / norm2 / proj /
  fc1 / fc2, `v.pre_ln` / `v.post_ln` ln_pre / ln_post, `v.position_embd` the position table;
- the adapter and projection are `mm.0` / `mm.1` (fc1 / fc2) and `mm.2` (vision_projection).

What the file does not say is clip.cpp's: RoPE base 10000, a full-attention layer every 4th and last, windows
the position table's side, a 2x2 merge unless `clip.vision.spatial_merge_size`, at most 4096 image tokens.
The scale-free RMS norm of the features is the text model's in llama.cpp (it norms every input embedding):
here the tower applies it, at the text model's epsilon. Every tensor's shape is checked against the header's
sizes, so a corrupt file is refused naming the file and the tensor.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.muse_glimmer_config import MuseGlimmerVisionConfig, full_layers, tower_shapes
from app.engine.models.vision.qwen_vl_mmproj import image_mean_std, projector_type
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]
PROJECTOR = "muse-glimmer"
DEFAULT_MERGE = 2
MAX_IMAGE_TOKENS = 4096  # clip.cpp: set_limit_image_tokens(1, 4096)

_BLOCK = re.compile(r"^v\.blk\.(\d+)\.(\w+)\.(weight|bias)$")
_BLOCK_PARTS = {
    "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj", "attn_out": "attn.proj",
    "ln1": "norm1", "ln2": "norm2", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2",
}  # fmt: skip
PATCH = "tower.patch_embedder.patch_embedding.weight"
_TOP = {
    "v.patch_embd.weight": PATCH,
    "v.position_embd.weight": "tower.patch_embedder.position_embedding_table.weight",
    "v.pre_ln.weight": "tower.ln_pre.weight", "v.pre_ln.bias": "tower.ln_pre.bias",
    "v.post_ln.weight": "tower.ln_post.weight", "v.post_ln.bias": "tower.ln_post.bias",
    "mm.0.weight": "adapter.fc1.weight", "mm.1.weight": "adapter.fc2.weight", "mm.2.weight": "projection.weight",
}  # fmt: skip


def _key(meta: dict[str, Any], name: str) -> int:
    full = f"clip.vision.{name}"
    value = meta.get(full)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"mmproj metadata has no positive whole number {full} (found {value!r})")
    return value


def muse_glimmer_config_from_gguf(
    meta: dict[str, Any], tensors: Tensors, text_hidden_size: int, text_rms_eps: float
) -> MuseGlimmerVisionConfig:
    """From an mmproj GGUF's `clip.*` keys and its table sizes (the position table's side, the adapter's width)."""
    projector = projector_type(meta)
    if projector != PROJECTOR:
        raise CheckpointError(
            f"mmproj projector type {projector!r} is not Muse Glimmer's ({PROJECTOR!r}): it does not go with this model"
        )
    projection_dim = _key(meta, "projection_dim")
    if projection_dim != text_hidden_size:
        raise CheckpointError(
            f"clip.vision.projection_dim is {projection_dim}, the text model's hidden size {text_hidden_size}"
        )
    for name in ("v.position_embd.weight", "mm.0.weight"):
        if name not in tensors:
            raise CheckpointError(f"the mmproj lacks {name}")
    side = math.isqrt(tensors["v.position_embd.weight"].shape[0])
    if side * side != tensors["v.position_embd.weight"].shape[0]:
        raise CheckpointError(f"v.position_embd.weight has {tensors['v.position_embd.weight'].shape[0]} rows: no square table")
    mean, std = image_mean_std(meta)
    layers = _key(meta, "block_count")
    merge = int(meta.get("clip.vision.spatial_merge_size", DEFAULT_MERGE))
    return MuseGlimmerVisionConfig(
        num_layers=layers,
        hidden_size=_key(meta, "embedding_length"),
        intermediate_size=_key(meta, "feed_forward_length"),
        num_heads=_key(meta, "attention.head_count"),
        patch_size=_key(meta, "patch_size"),
        position_side=side,
        merge_size=merge,
        temporal_patch_size=1,  # the file's patch embedding reads one frame
        full_attention_layers=full_layers(layers),
        projector_hidden_size=tensors["mm.0.weight"].shape[0],
        text_hidden_size=text_hidden_size,
        layer_norm_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-5)),
        text_rms_eps=text_rms_eps,
        max_image_tokens=MAX_IMAGE_TOKENS,
        image_mean=mean,
        image_std=std,
    ).check("mmproj metadata")


def _target(name: str) -> str | None:
    """The tower's name for a file tensor, or None for one a Muse Glimmer tower has not."""
    if name in _TOP:
        return _TOP[name]
    match = _BLOCK.match(name)
    if match is None or match.group(2) not in _BLOCK_PARTS:
        return None
    layer, part, kind = match.groups()
    return f"tower.layers.{layer}.{_BLOCK_PARTS[part]}.{kind}"


def _file_name(target: str) -> str:
    """The file's name for a tensor the tower reads (the inverse of `_target`)."""
    for name, mapped in _TOP.items():
        if mapped == target:
            return name
    layer, rest = target.removeprefix("tower.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    part = next(p for p, m in _BLOCK_PARTS.items() if m == module)
    return f"v.blk.{layer}.{part}.{kind}"


def rotate_half_rows(values: np.ndarray, heads: int) -> np.ndarray:
    """Rows of q or k (or their bias) from ggml's interleaved pairs back to transformers' rotate-half order
    (the inverse of the converter's `_unpermute_for_rope`)."""
    rows = values.shape[0]
    split = values.reshape(heads, rows // heads // 2, 2, *values.shape[1:])
    return np.ascontiguousarray(split.swapaxes(1, 2).reshape(values.shape), np.float32)


def tower_tensors(file_tensors: Tensors, cfg: MuseGlimmerVisionConfig) -> Tensors:
    """The mmproj's tensors under the names muse_glimmer_vision.py reads; CheckpointError naming a tensor
    missing, unknown or of the wrong shape."""
    shapes = tower_shapes(cfg)
    shapes[PATCH] = (cfg.hidden_size, 3, cfg.patch_size, cfg.patch_size)  # the file's conv layout
    out: Tensors = {}
    for name, tensor in file_tensors.items():
        target = _target(name)
        if target is None:
            raise CheckpointError(f"the mmproj holds {name}, which a Muse Glimmer tower has not")
        if tuple(tensor.shape) != shapes[target]:
            raise CheckpointError(f"tensor {name} has shape {tuple(tensor.shape)}, expected {shapes[target]}")
        if name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias")):
            tensor = QuantizedTensor.from_float(target, rotate_half_rows(tensor.dequantize(), cfg.num_heads), _F32)
        out[target] = tensor
    missing = [_file_name(target) for target in shapes if target not in out]
    if missing:
        raise CheckpointError(f"the mmproj lacks {', '.join(missing[:4])}")
    patch = out[PATCH].dequantize().reshape(cfg.hidden_size, cfg.frame_dim)
    out[PATCH] = QuantizedTensor.from_float(PATCH, np.ascontiguousarray(patch, np.float32), _F32)
    return out


def load_muse_glimmer_mmproj(
    path: Path, text_hidden_size: int, text_rms_eps: float
) -> tuple[MuseGlimmerVisionConfig, Tensors]:
    """A Muse Glimmer mmproj GGUF: the tower's config and its tensors under the HF names (CheckpointError
    naming the file, and the tensor where one is wrong)."""
    file = read_gguf(path)
    try:
        tensors = dict(file.tensors)
        cfg = muse_glimmer_config_from_gguf(file.metadata, tensors, text_hidden_size, text_rms_eps)
        return cfg, tower_tensors(tensors, cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
