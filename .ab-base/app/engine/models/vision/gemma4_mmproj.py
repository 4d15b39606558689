"""Gemma 4's vision tower from a llama.cpp mmproj GGUF (projector type `gemma4v`).

llama.cpp's converter (its `Gemma4VisionAudioModel` class) writes the tower under gguf-py's
`v.*` / `mm.*` names and this module maps them back to the Hugging Face names gemma4_vision.py reads,
undoing what differs:

- the patch embedding `[hidden, p*p*3]` (HF patches are (row, column, channel)) is stored as the
  convolution kernel `[hidden, 3, p, p]`: permuted back;
- the clipped linears' bounds are 1-element tensors beside their weight (`v.blk.{i}.attn_q.input_min`);
  clip.cpp takes a missing bound as unbounded, and so does this;
- the image processor's settings are not written: clip.cpp hard-codes what it needs.

What the file leaves out comes from llama.cpp's defaults (clip.cpp, PROJECTOR_TYPE_GEMMA4V): RoPE base 100,
3x3 pooling unless `clip.vision.projector.scale_factor`, KV heads as query heads unless
`clip.vision.attention.head_count_kv`, a head size of width / heads unless `clip.vision.attention.head_dim`.
Images are prepared as transformers' Gemma4ImageProcessor does with its default budget of 280 soft tokens
(llama.cpp resizes its own way, up to 1120), unless `clip.vision.image_max_pixels` gives the budget as
pixels (tokens * (patch * pooling)^2). Whether image tokens attend both ways in the text model is the
caller's: the text GGUF does not say (llama.cpp: all but the E-series do).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.gemma4_config import SUPPORTED_SOFT_TOKENS, Gemma4VisionConfig, Tensors
from app.engine.models.vision.qwen_vl_mmproj import check_projector
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

PROJECTOR = "gemma4v"
_OTHER_PROJECTORS = {"gemma4uv": "Gemma 4 Unified's (no vision transformer)", "gemma3": "Gemma 3's SigLIP"}
DEFAULT_POOLING = 3
DEFAULT_SOFT_TOKENS = 280  # Gemma4ImageProcessor's max_soft_tokens
ROPE_THETA = 100.0
_F32 = QUANT_TYPES["F32"]
_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
_UNBOUNDED = {"input_min": -np.inf, "input_max": np.inf, "output_min": -np.inf, "output_max": np.inf}

_LINEARS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_NORMS = {
    "ln1": "input_layernorm",
    "attn_post_norm": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "ffn_post_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_TOP = {
    "v.position_embd.weight": "tower.patch_embedder.position_embedding_table",
    "v.std_bias": "tower.std_bias",
    "v.std_scale": "tower.std_scale",
    "mm.input_projection.weight": "embedder.embedding_projection.weight",
}
_PATCH = "v.patch_embd.weight"
_BLOCK = re.compile(r"^v\.blk\.(\d+)\.(\w+)\.(weight|input_min|input_max|output_min|output_max)$")


def _whole(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"mmproj metadata has no positive whole number {key} (found {value!r})")
    return value


def gemma4_config_from_gguf(
    meta: dict[str, Any], tensors: Tensors, text_hidden_size: int, two_way_images: bool
) -> Gemma4VisionConfig:
    """From an mmproj's `clip.*` keys and what its tensors show (standardization, clipping, the
    position table's size); CheckpointError naming what is missing or unsupported."""
    check_projector(meta, PROJECTOR, "Gemma 4", _OTHER_PROJECTORS)
    hidden, heads = (
        _whole(meta, "clip.vision.embedding_length"),
        _whole(meta, "clip.vision.attention.head_count"),
    )
    projection = _whole(meta, "clip.vision.projection_dim")
    if projection != text_hidden_size:
        raise CheckpointError(
            f"clip.vision.projection_dim is {projection}, the text model's hidden size {text_hidden_size}"
        )
    mean, std = meta.get("clip.vision.image_mean"), meta.get("clip.vision.image_std")
    if (mean is not None and list(mean) != [0.0] * 3) or (std is not None and list(std) != [1.0] * 3):
        raise CheckpointError(
            f"clip.vision.image_mean {mean} / image_std {std}: Gemma 4 images are not normalized (0 and 1)"
        )
    patch = _whole(meta, "clip.vision.patch_size")
    pooling = _whole(meta, "clip.vision.projector.scale_factor", DEFAULT_POOLING)
    budget = DEFAULT_SOFT_TOKENS
    if "clip.vision.image_max_pixels" in meta:
        budget = _whole(meta, "clip.vision.image_max_pixels") // (patch * pooling) ** 2
        if budget not in SUPPORTED_SOFT_TOKENS:
            raise CheckpointError(
                f"clip.vision.image_max_pixels allows {budget} soft tokens, not one of {SUPPORTED_SOFT_TOKENS}"
            )
    table = tensors.get("v.position_embd.weight")
    if table is None or len(table.shape) != 3 or table.shape[0] != 2 or table.shape[2] != hidden:
        shape = None if table is None else table.shape
        raise CheckpointError(
            f"tensor v.position_embd.weight has shape {shape}, expected (2, size, {hidden})"
        )
    return Gemma4VisionConfig(
        hidden_size=hidden,
        intermediate_size=_whole(meta, "clip.vision.feed_forward_length"),
        num_layers=_whole(meta, "clip.vision.block_count"),
        num_heads=heads,
        num_kv_heads=_whole(meta, "clip.vision.attention.head_count_kv", heads),
        head_dim=_whole(meta, "clip.vision.attention.head_dim", hidden // heads),
        patch_size=patch,
        position_embedding_size=table.shape[1],
        pooling_kernel_size=pooling,
        rope_theta=ROPE_THETA,
        rms_norm_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        standardize="v.std_bias" in tensors or "v.std_scale" in tensors,
        clipped_linears=any(name.endswith(_BOUNDS) for name in tensors),
        text_hidden_size=text_hidden_size,
        two_way_images=two_way_images,
        max_soft_tokens=budget,
    )


def _scalar(name: str, value: float) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, np.full((1,), value, np.float32), _F32)


def tower_tensors(file_tensors: Tensors, cfg: Gemma4VisionConfig) -> Tensors:
    """The mmproj's vision tensors under the names gemma4_vision.py reads, each checked for its
    shape; CheckpointError naming a tensor that is missing, misshapen or unknown. Audio tensors (`a.*`,
    `mm.a.*`, an E-series mmproj holds both towers) are left out."""
    out: Tensors = {}
    for name, tensor in file_tensors.items():
        match = _BLOCK.match(name)
        if name in _TOP:
            out[_TOP[name]] = tensor
        elif match is not None and match.group(2) in _LINEARS:
            layer, part, kind = match.groups()
            suffix = "linear.weight" if kind == "weight" else kind
            out[f"tower.encoder.layers.{layer}.{_LINEARS[part]}.{suffix}"] = tensor
        elif match is not None and match.group(2) in _NORMS and match.group(3) == "weight":
            out[f"tower.encoder.layers.{match.group(1)}.{_NORMS[match.group(2)]}.weight"] = tensor
        elif name.startswith("v.") and name != _PATCH:
            raise CheckpointError(f"tensor {name!r} is not part of a Gemma 4 vision tower")
    out["tower.patch_embedder.input_proj.weight"] = _patch_embedding(file_tensors.get(_PATCH), cfg)
    for name, shape in expected_shapes(cfg).items():
        found = out.get(name)
        gguf_name = _gguf_name(name)
        if found is None:
            if cfg.clipped_linears and name.endswith(_BOUNDS):
                out[name] = _scalar(name, _UNBOUNDED[name.rpartition(".")[2]])
                continue
            raise CheckpointError(f"tensor {gguf_name!r} is missing")
        if tuple(found.shape) != shape and not (name.endswith(_BOUNDS) and int(np.prod(found.shape)) == 1):
            raise CheckpointError(f"tensor {gguf_name!r} has shape {tuple(found.shape)}, expected {shape}")
    return out


def expected_shapes(cfg: Gemma4VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower reads, under its HF name, with its shape."""
    h, ff, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "tower.patch_embedder.position_embedding_table": (2, cfg.position_embedding_size, h),
        "embedder.embedding_projection.weight": (cfg.text_hidden_size, h),
    }
    if cfg.standardize:
        shapes |= {"tower.std_bias": (h,), "tower.std_scale": (h,)}
    linears = {
        "self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q), "mlp.gate_proj": (ff, h), "mlp.up_proj": (ff, h), "mlp.down_proj": (h, ff),
    }  # fmt: skip
    for i in range(cfg.num_layers):
        p = f"tower.encoder.layers.{i}"
        for norm in _NORMS.values():
            shapes[f"{p}.{norm}.weight"] = (d,) if "self_attn" in norm else (h,)
        for linear, shape in linears.items():
            shapes[f"{p}.{linear}.linear.weight"] = shape
            if cfg.clipped_linears:
                shapes |= {f"{p}.{linear}.{bound}": (1,) for bound in _BOUNDS}
    return shapes


def _gguf_name(hf_name: str) -> str:
    """The mmproj name of one of the tower's tensors (for errors)."""
    reverse_top = {ours: theirs for theirs, ours in _TOP.items()}
    if hf_name in reverse_top:
        return reverse_top[hf_name]
    if hf_name == "tower.patch_embedder.input_proj.weight":
        return _PATCH
    layer, _, rest = hf_name.removeprefix("tower.encoder.layers.").partition(".")
    module, _, kind = rest.rpartition(".")
    if module.endswith(".linear"):
        module, kind = module.removesuffix(".linear"), "weight"
    part = {**{v: k for k, v in _LINEARS.items()}, **{v: k for k, v in _NORMS.items()}}[module]
    return f"v.blk.{layer}.{part}.{kind}"


def _patch_embedding(kernel: QuantizedTensor | None, cfg: Gemma4VisionConfig) -> QuantizedTensor:
    """The convolution kernel `[hidden, 3, p, p]` back as the HF linear `[hidden, p*p*3]`."""
    p = cfg.patch_size
    shape = (cfg.hidden_size, 3, p, p)
    if kernel is None:
        raise CheckpointError(f"tensor {_PATCH!r} is missing")
    if tuple(kernel.shape) != shape:
        raise CheckpointError(f"tensor {_PATCH!r} has shape {tuple(kernel.shape)}, expected {shape}")
    values = kernel.dequantize().astype(np.float32).transpose(0, 2, 3, 1).reshape(cfg.hidden_size, -1)
    name = "tower.patch_embedder.input_proj.weight"
    return QuantizedTensor.from_float(name, np.ascontiguousarray(values), _F32)


def load_gemma4_mmproj(
    path: Path, text_hidden_size: int, two_way_images: bool
) -> tuple[Gemma4VisionConfig, Tensors] | None:
    """A Gemma 4 mmproj GGUF: the tower's config and its tensors under the HF names; errors name the file.
    None for an audio-only mmproj (llama.cpp's audio half alone): core/audio.py loads that one."""
    file = read_gguf(path)
    if file.metadata.get("clip.has_audio_encoder") and not file.metadata.get("clip.has_vision_encoder"):
        return None
    try:
        tensors = dict(file.tensors)
        cfg = gemma4_config_from_gguf(file.metadata, tensors, text_hidden_size, two_way_images)
        return cfg, tower_tensors(tensors, cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
