"""Qwen2.5-VL's vision tower from a llama.cpp mmproj GGUF (projector type `qwen2.5vl_merger`).

llama.cpp's convert_hf_to_gguf.py writes the tower as it runs it in tools/mtmd, and this module
undoes what differs from the Hugging Face layout the tower code (qwen_vl.py) reads:

- the Conv3d patch embedding `[hidden, C, 2, p, p]` is split into its two temporal halves,
  `v.patch_embd.weight` and `v.patch_embd.weight.1` (each `[hidden, C, p, p]`): stacked back;
- each block's fused `attn.qkv` is split into `attn_q` / `attn_k` / `attn_v`: their rows joined
  back in the file's own format where the three share it;
- `fullatt_block_indexes` is stored as a period, `clip.vision.n_wa_pattern` = first index + 1
  (the converter refuses uneven ones): layer i attends fully when (i + 1) % n == 0, as clip.cpp;
- the merger is `v.post_ln` (its RMSNorm, ln_q) and `mm.0` / `mm.2` (its two linears).

What the converter does not write comes from llama.cpp's defaults, so a published file behaves
here as it does there: a 112-pixel attention window unless `clip.vision.window_size` says
otherwise, a 2x2 merge unless `clip.vision.spatial_merge_size`, and 8 to 4096 image tokens per
image unless `clip.vision.image_min_pixels` / `image_max_pixels` give the bounds in pixels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.qwen_vl_config import RMS_EPS, QwenVisionConfig
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]

PROJECTOR = "qwen2.5vl_merger"
# Projectors of the family that are a different tower: said by name rather than "unknown".
_OTHER_PROJECTORS = {
    "qwen2vl_merger": "Qwen2-VL's (LayerNorm blocks, QuickGELU MLP, no window attention)",
    "qwen2.5o": "Qwen2.5-Omni's",
    "qwen3vl_merger": "Qwen3-VL's",
}
# llama.cpp's values when the file leaves them out (clip.cpp, PROJECTOR_TYPE_QWEN25VL)
DEFAULT_WINDOW_SIZE = 112
DEFAULT_MERGE = 2
DEFAULT_TOKENS = (8, 4096)  # image tokens (merged patches) per image
TEMPORAL_PATCH = 2  # the converter only splits a temporal patch of 2

_BLOCK = re.compile(r"^v\.blk\.(\d+)\.(\w+)\.(weight|bias)$")
_BLOCK_PARTS = {
    "attn_out": "attn.proj",
    "ln1": "norm1",
    "ln2": "norm2",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_qkv": "attn.qkv",  # fused, as some conversions leave it
}
_QKV = ("attn_q", "attn_k", "attn_v")
_TOP = {
    "v.post_ln.weight": "merger.ln_q.weight",
    "mm.0.weight": "merger.mlp.0.weight",
    "mm.0.bias": "merger.mlp.0.bias",
    "mm.2.weight": "merger.mlp.2.weight",
    "mm.2.bias": "merger.mlp.2.bias",
}
_PATCH = ("v.patch_embd.weight", "v.patch_embd.weight.1")


def projector_type(meta: Mapping[str, Any]) -> Any:
    return meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")


def image_mean_std(meta: Mapping[str, Any]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The processor's per-channel mean and std from `clip.vision.image_mean` / `image_std` (the mmproj
    readers of Qwen2.5-VL, PaddleOCR-VL and Muse Glimmer); CheckpointError unless both have 3 channels."""
    mean, std = meta.get("clip.vision.image_mean"), meta.get("clip.vision.image_std")
    if not (isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == 3):
        raise CheckpointError("mmproj metadata lacks the 3-channel clip.vision.image_mean / image_std")
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def check_projector(meta: Mapping[str, Any], expected: str, family: str, others: Mapping[str, str]) -> None:
    """CheckpointError unless the mmproj's projector type is `expected` (`family`'s); a known other
    tower (`others`: type -> whose) is said by name rather than as unknown."""
    projector = projector_type(meta)
    if projector in others:
        raise CheckpointError(
            f"mmproj projector type {projector!r} is {others[projector]} vision tower, which is not supported; "
            f"{family}'s ({expected!r}) is"
        )
    if projector != expected:
        raise CheckpointError(
            f"mmproj projector type {projector!r} is not {family}'s ({expected!r}): it does not go with this model"
        )


def qwen_config_from_gguf(meta: dict[str, Any], text_hidden_size: int) -> QwenVisionConfig:
    """From an mmproj GGUF's `clip.*` keys; CheckpointError naming what is missing or unsupported."""
    check_projector(meta, PROJECTOR, "Qwen2.5-VL", _OTHER_PROJECTORS)
    if not meta.get("clip.use_silu"):
        raise CheckpointError("mmproj metadata lacks clip.use_silu = true (Qwen2.5-VL's SwiGLU blocks)")

    def key(name: str) -> int:
        full = f"clip.vision.{name}"
        value = meta.get(full)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"mmproj metadata has no whole number {full} (found {value!r})")
        return value

    depth, period = key("block_count"), key("n_wa_pattern")
    # n_wa_pattern 0: no window attention (clip.cpp: every layer attends fully)
    fullatt = tuple(i for i in range(depth) if period == 0 or (i + 1) % period == 0)
    patch = key("patch_size")
    merge = int(meta.get("clip.vision.spatial_merge_size", DEFAULT_MERGE))
    area = (patch * merge) ** 2
    low = int(meta.get("clip.vision.image_min_pixels") or DEFAULT_TOKENS[0] * area)
    high = int(meta.get("clip.vision.image_max_pixels") or DEFAULT_TOKENS[1] * area)
    out_hidden = key("projection_dim")
    if out_hidden != text_hidden_size:
        raise CheckpointError(
            f"clip.vision.projection_dim is {out_hidden}, the text model's hidden size {text_hidden_size}"
        )
    mean, std = image_mean_std(meta)
    return QwenVisionConfig(
        depth=depth,
        hidden_size=key("embedding_length"),
        intermediate_size=key("feed_forward_length"),
        num_heads=key("attention.head_count"),
        in_channels=3,
        patch_size=patch,
        temporal_patch_size=TEMPORAL_PATCH,
        merge_size=merge,
        window_size=int(meta.get("clip.vision.window_size") or DEFAULT_WINDOW_SIZE),
        out_hidden_size=out_hidden,
        fullatt_block_indexes=fullatt,
        rope_theta=10_000.0,  # clip.cpp's, as transformers'
        min_pixels=low,
        max_pixels=high,
        image_mean=mean,
        image_std=std,
        rms_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", RMS_EPS)),
    ).check("mmproj metadata", "mmproj metadata")


def _as_f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, np.ascontiguousarray(values, np.float32), _F32)


def _joined_rows(name: str, parts: list[QuantizedTensor]) -> QuantizedTensor:
    """q, k and v as one tensor, rows one after another: in their own format where they share a
    plain one (the bytes of whole rows concatenate), else as float32."""
    first = parts[0]
    if (
        len(first.shape) == 2
        and not first.qtype.split
        and all(p.qtype == first.qtype and p.shape[1:] == first.shape[1:] for p in parts)
    ):
        shape = (sum(p.shape[0] for p in parts), first.shape[1])
        return QuantizedTensor(name, first.qtype, shape, np.concatenate([p.data for p in parts]))
    return _as_f32(name, np.concatenate([p.dequantize() for p in parts]))


def tower_tensors(file_tensors: Tensors, cfg: QwenVisionConfig) -> Tensors:
    """The mmproj's tensors under the Hugging Face names qwen_vl.py reads (CheckpointError naming
    a tensor it does not know or one it lacks)."""
    out: Tensors = {}
    qkv: dict[tuple[int, str], dict[str, QuantizedTensor]] = {}
    unknown = []
    for name, tensor in file_tensors.items():
        if name in _TOP:
            out[_TOP[name]] = tensor
        elif name in _PATCH:
            continue
        elif (match := _BLOCK.match(name)) is not None:
            layer, part, kind = int(match.group(1)), match.group(2), match.group(3)
            if part in _QKV:
                qkv.setdefault((layer, kind), {})[part] = tensor
            elif part in _BLOCK_PARTS:
                out[f"blocks.{layer}.{_BLOCK_PARTS[part]}.{kind}"] = tensor
            else:
                unknown.append(name)
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(
            f"the mmproj holds tensors a Qwen2.5-VL tower has not: {', '.join(sorted(unknown)[:4])}"
        )
    for (layer, kind), parts in sorted(qkv.items()):
        if set(parts) != set(_QKV):
            raise CheckpointError(f"v.blk.{layer}: the mmproj has {sorted(parts)} of attn_q/k/v.{kind}")
        name = f"blocks.{layer}.attn.qkv.{kind}"
        out[name] = _joined_rows(name, [parts[p] for p in _QKV])
    out["patch_embed.proj.weight"] = _patch_embedding(file_tensors, cfg)
    _unswap_ffn(out, cfg)
    expected = ["merger.ln_q.weight", "merger.mlp.0.weight", "merger.mlp.2.weight"]
    for i in range(cfg.depth):
        expected += [f"blocks.{i}.{part}.weight" for part in ("attn.qkv", "attn.proj", "norm1", "norm2")]
        expected += [f"blocks.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    missing = [n for n in expected if n not in out]
    if missing:
        raise CheckpointError(f"the mmproj lacks the tower's {', '.join(missing[:4])}")
    return out


def _patch_embedding(file_tensors: Tensors, cfg: QwenVisionConfig) -> QuantizedTensor:
    halves = [file_tensors.get(name) for name in _PATCH]
    if any(h is None for h in halves):
        raise CheckpointError(
            "the mmproj lacks v.patch_embd.weight and v.patch_embd.weight.1 (the two temporal halves "
            "of Qwen2.5-VL's patch embedding)"
        )
    shape = (cfg.hidden_size, cfg.in_channels, cfg.patch_size, cfg.patch_size)
    values = []
    for name, half in zip(_PATCH, halves, strict=True):
        if half.shape != shape:
            raise CheckpointError(f"{name} has shape {half.shape}, expected {shape}")
        values.append(half.dequantize())
    return _as_f32("patch_embed.proj.weight", np.stack(values, axis=2))  # [hidden, C, T, p, p]


def _unswap_ffn(tensors: Tensors, cfg: QwenVisionConfig) -> None:
    """Older conversions stored each block's MLP up and down projections under each other's
    names; clip.cpp swaps them back when ffn_down takes the hidden width, and so does this."""
    for i in range(cfg.depth):
        up, down = f"blocks.{i}.mlp.up_proj", f"blocks.{i}.mlp.down_proj"
        weight = tensors.get(f"{down}.weight")
        if weight is None or weight.shape[-1] != cfg.hidden_size or weight.shape[0] == cfg.hidden_size:
            continue
        for kind in ("weight", "bias"):
            a, b = tensors.pop(f"{up}.{kind}", None), tensors.pop(f"{down}.{kind}", None)
            if b is not None:
                tensors[f"{up}.{kind}"] = b
            if a is not None:
                tensors[f"{down}.{kind}"] = a


def load_qwen_mmproj(path: Path, text_hidden_size: int) -> tuple[QwenVisionConfig, Tensors]:
    """A Qwen2.5-VL mmproj GGUF: the tower's config and its tensors under the HF names."""
    file = read_gguf(path)
    try:
        cfg = qwen_config_from_gguf(file.metadata, text_hidden_size)
        tensors = tower_tensors(dict(file.tensors), cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    width = tensors["merger.mlp.2.weight"].shape[0]
    if width != text_hidden_size:
        raise CheckpointError(
            f"{path}: the merger outputs width {width}, the text model's hidden size is {text_hidden_size}"
        )
    return cfg, tensors
