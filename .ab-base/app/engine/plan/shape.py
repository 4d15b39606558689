"""`ModelShape`: what the memory plan needs to know about a model, derived from its `ModelConfig`.

Each family's own parser (models/registry.py `family`) reads the checkpoint's description of itself
into a `ModelConfig`, and the shape is derived from that config, whether the engine is loading the
weights (`shape_of`), `paddock fit` reads a local checkpoint (`shape_from_checkpoint`), or the
Studio reads only a GGUF header or a config.json (`shape_from_gguf`, `shape_from_hf_config`: a
model before download). Architectures the engine has no family for are read with the keys every
decoder shares (`common_from_gguf` / `common_from_hf`), so their memory can still be predicted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.engine.kernels import gemv_q4r
from app.engine.loader.lora import ADAPTER_WEIGHTS
from app.engine.loader.names import CheckpointError
from app.engine.models.config import GGUF_KEYS, ModelConfig, common_from_gguf, common_from_hf
from app.engine.plan.audio_fit import AudioShape, audio_beside_gguf, audio_from_hf_config
from app.engine.plan.vision_fit import (
    VisionShape,
    is_vision_tensor,
    takes_images,
    vision_beside_gguf,
    vision_from_hf_config,
)
from app.engine.specs import MoeSpec

# GGUF keys that some files store per layer (an array); the plan counts the largest layer.
_PER_LAYER_FIELDS = ("num_heads", "num_kv_heads", "intermediate_size", "head_dim")


@dataclass(frozen=True)
class ModelShape:
    """What the memory prediction needs to know about a model."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # key dimension per head
    intermediate_size: int  # a mixture of experts: one expert's times the experts used per token
    vocab_size: int
    context_length: int  # the model's own maximum
    weight_bytes: int
    value_head_dim: int | None = None  # None: same as head_dim
    num_experts: int = 0  # per layer; 0: a dense model
    experts_used: int = 0  # per token
    expert_bytes: int = 0  # all layers' expert tensors, part of weight_bytes
    vision: VisionShape | None = None  # the image tower the engine loads beside it (not in weight_bytes)
    audio: AudioShape | None = None  # its audio side: encoder, projector, adapter (not in weight_bytes)
    # A hybrid model's recurrent state per sequence (all its recurrent layers), held beside the paged
    # KV cache in rows (a slot per sequence, snapshots for the prefix cache); 0 for a pure attention model.
    state_bytes_per_sequence: int = 0
    # (KV heads, head dim) of each layer that owns a KV cache, where they are not every layer's
    # num_kv_heads x head_dim (a hybrid model's recurrent layers own none, Gemma 4's shared-KV layers
    # read another's, its global layers have heads of their own); empty: every layer, uniform.
    kv_layers: tuple[tuple[int, int], ...] = ()
    # Device bytes of the repacked copies gemv_q4r reads (backend/cuda/dense.py, when PADDOCK_Q4R_MAX_TOKENS
    # turns them on): known where the tensors' formats are (`repacked_bytes`), else 0.
    repacked_bytes: int = 0

    @property
    def owned_kv_layers(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, key dim) of every KV cache the model owns."""
        return self.kv_layers or ((self.num_kv_heads, self.head_dim),) * self.num_layers

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        if self.kv_layers:  # the engine keeps values at the key's width
            return sum(2 * heads * dim for heads, dim in self.kv_layers) * bytes_per_element
        value_dim = self.value_head_dim or self.head_dim
        return self.num_layers * self.num_kv_heads * (self.head_dim + value_dim) * bytes_per_element


def with_mtp_kv(shape: ModelShape) -> ModelShape:
    """`shape` with one more KV cache like its first owned one: `--speculative mtp`'s head keeps its K/V
    in such an array beside the model's (core/mtp_drafter.py), so each block costs that much more."""
    owned = shape.owned_kv_layers
    if not owned:
        return shape
    return replace(shape, kv_layers=(*owned, owned[0]))


def shape_from_config(
    cfg: ModelConfig,
    weight_bytes: int,
    expert_bytes: int | None = None,
    vision: VisionShape | None = None,
    audio: AudioShape | None = None,
    repacked: int = 0,
) -> ModelShape:
    """The shape of a parsed model. `expert_bytes` None: estimated from the parameter counts."""
    moe = cfg.moe
    shape = ModelShape(
        architecture=cfg.architecture,
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        value_head_dim=cfg.head_dim,  # the engine's KV cache keeps values at the key's width
        # the experts a token picks run side by side: their intermediates are alive together
        intermediate_size=moe.intermediate_size * moe.num_used if moe else cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
        context_length=cfg.context_length,
        weight_bytes=int(weight_bytes),
        num_experts=moe.num_experts if moe else 0,
        experts_used=moe.num_used if moe else 0,
        vision=vision,
        audio=audio,
        state_bytes_per_sequence=cfg.state_bytes_per_sequence,
        kv_layers=_kv_layers(cfg),
        repacked_bytes=repacked,
    )
    if expert_bytes is not None:
        return replace(shape, expert_bytes=expert_bytes)
    return with_estimated_expert_bytes(shape, moe.intermediate_size if moe else 0)


def _kv_layers(cfg: ModelConfig) -> tuple[tuple[int, int], ...]:
    """The model's owned KV caches where they differ from num_layers x (num_kv_heads, head_dim)."""
    owned = cfg.kv_layer_shapes
    uniform = ((cfg.num_kv_heads, cfg.head_dim),) * cfg.num_layers
    return () if owned == uniform else owned


def gguf_config(meta: Mapping[str, Any], vocab_size: int) -> ModelConfig:
    """The `ModelConfig` of GGUF key-values, by the architecture's family parser (or the shared keys)."""
    from app.engine.models.registry import UnsupportedArchitecture, family

    arch = str(meta.get("general.architecture") or "")
    if not arch:
        raise ValueError("GGUF metadata has no general.architecture")
    try:
        parse = family(arch).config_from_gguf
    except UnsupportedArchitecture:
        return _shared_gguf_config(_largest_per_layer(dict(meta), arch), arch, vocab_size)
    try:  # the hybrid and Gemma 4 families read their per-layer arrays (which layers have attention...)
        return parse(dict(meta), vocab_size)
    except (CheckpointError, TypeError):  # a family that takes scalars only: each array's largest value
        return parse(_largest_per_layer(dict(meta), arch), vocab_size)


def hf_config(config: Mapping[str, Any]) -> ModelConfig:
    """The `ModelConfig` of a config.json, by the architecture's family parser (or the shared keys)."""
    from app.engine.models.registry import UnsupportedArchitecture, family

    name = hf_architecture(config)
    try:
        return family(name).config_from_hf(dict(config))
    except UnsupportedArchitecture:
        return _shared_hf_config(dict(config), name)


def shape_from_gguf(meta: Mapping[str, Any], weight_bytes: int, vocab_size: int | None = None) -> ModelShape:
    """The shape from GGUF key-values alone (a header); vocab from the token list's length."""
    vocab = _gguf_vocab_size(meta) if vocab_size is None else vocab_size
    return shape_from_config(gguf_config(meta, vocab), weight_bytes)


def _gguf_vocab_size(meta: Mapping[str, Any]) -> int:
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_size = len(tokens) if tokens is not None else meta.get(f"{meta.get('general.architecture')}.vocab_size")
    if vocab_size is None:
        raise ValueError("GGUF metadata has neither tokenizer.ggml.tokens nor a vocab_size")
    return int(vocab_size)


def shape_from_hf_config(config: Mapping[str, Any], weight_bytes: int) -> ModelShape:
    """The shape from a Hugging Face config.json alone (multimodal wrappers: its text_config), named
    by the config's own architecture (the class name the Studio shows)."""
    return replace(shape_from_config(hf_config(config), weight_bytes), architecture=hf_architecture(config))


def hf_architecture(config: Mapping[str, Any]) -> str:
    return str((config.get("architectures") or [config.get("model_type", "unknown")])[0])


def shape_of(checkpoint: Any, cfg: ModelConfig) -> ModelShape:
    """The shape of an opened checkpoint whose config is parsed: exact weight and expert bytes, and the
    vision and audio towers the engine would load beside it."""
    weight_bytes = sum(t.nbytes for t in checkpoint.tensors.values())  # the text model's (the loader's names)
    expert_bytes = None
    if cfg.moe is not None:  # the tensors are here: their exact bytes, not an estimate
        expert_bytes = sum(t.nbytes for name, t in checkpoint.tensors.items() if "_exps" in name)
    audio = None
    if checkpoint.format == "gguf":
        vision = vision_beside_gguf(checkpoint.path, checkpoint.architecture)
        audio = audio_beside_gguf(checkpoint.path, checkpoint.architecture)
    else:  # a folder's tower counts where the engine gives its family one (Muse Glimmer's is skipped)
        vision = None
        if takes_images(checkpoint.architecture):
            vision = _hf_folder_vision(Path(checkpoint.path), checkpoint.hf_config or {})
        audio = _hf_folder_audio(Path(checkpoint.path), checkpoint.hf_config or {})
        cfg = replace(cfg, architecture=hf_architecture(checkpoint.hf_config or {}))  # the name, as above
    tensors = ((name, t.qtype.name, t.shape) for name, t in checkpoint.tensors.items())
    return shape_from_config(cfg, weight_bytes, expert_bytes, vision, audio, repacked_bytes(tensors))


# Weights the layers fuse into one product (layers/attention.py, layers/mlp.py), as GGUF names' parts: their
# repacked copies are stacked, all in the byte layout where a Q6_K part meets Q4_K ones (Q4_K_M's q/k/v).
_FUSED_PARTS = {"attn_q": "attn_qkv", "attn_k": "attn_qkv", "attn_v": "attn_qkv",
                "ffn_gate": "ffn_gate_up", "ffn_up": "ffn_gate_up"}  # fmt: skip
_BLOCK_WEIGHT = re.compile(r"^(blk\.\d+\.)(\w+)\.weight$")
_NEVER_MULTIPLIED = ("token_embd.weight",)  # read a row per token (a tied head has no repacked copy either)


def repacked_bytes(tensors: Iterable[tuple[str, str, tuple[int, ...]]]) -> int:
    """Device bytes of gemv_q4r's repacked copies of the matrices `(GGUF name, format, numpy shape)`: each one
    the kernel packs, a fused group's parts in one layout. Only where every part of a group packs is the group
    stacked; otherwise each part that packs has its own copy, as the loader makes them."""
    groups: dict[str, list[tuple[str, int, int]]] = {}
    for name, qtype, shape in tensors:
        if len(shape) != 2 or name in _NEVER_MULTIPLIED:
            continue
        block = _BLOCK_WEIGHT.match(name)
        fused = _FUSED_PARTS.get(block.group(2)) if block else None
        groups.setdefault(block.group(1) + fused if block and fused else name, []).append((qtype, *shape))
    total = 0
    for parts in groups.values():
        packing = [(q, rows, cols) for q, rows, cols in parts if gemv_q4r.packs(q, rows, cols)]
        if len(packing) == len(parts) and len({cols for _, _, cols in parts}) == 1:  # stacked as one
            total += gemv_q4r.packed_bytes([q for q, _, _ in parts], sum(r for _, r, _ in parts), parts[0][2])
        else:
            total += sum(gemv_q4r.packed_bytes([q], rows, cols) for q, rows, cols in packing)
    return total


def shape_from_checkpoint(path: str | os.PathLike[str]) -> ModelShape:
    """The shape of a local checkpoint (GGUF file or safetensors folder), parsed by its family's parser
    (the tensors are checked against it when the engine loads them, not here)."""
    from app.engine.loader.weights import open_checkpoint

    checkpoint = open_checkpoint(path)
    if checkpoint.format == "gguf":
        embedding = checkpoint.tensors.get("token_embd.weight")
        vocab = embedding.shape[0] if embedding is not None else None
        meta = checkpoint.metadata
        cfg = gguf_config(meta, vocab if vocab is not None else _gguf_vocab_size(meta))
    else:
        cfg = hf_config(checkpoint.hf_config or {})
    return shape_of(checkpoint, cfg)


def with_estimated_expert_bytes(shape: ModelShape, expert_ff: int) -> ModelShape:
    """Without the tensors (a hub header or config), the experts' share of the weight bytes is their
    share of the parameters: 3 x layers x experts x ff x hidden of the whole count."""
    if not shape.num_experts or not expert_ff:
        return shape
    s = shape
    experts = 3 * s.num_layers * s.num_experts * expert_ff * s.hidden_size
    attention = s.num_layers * s.hidden_size * (2 * s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    total = experts + attention + 2 * s.vocab_size * s.hidden_size
    return replace(shape, expert_bytes=int(s.weight_bytes * experts / total))


def _largest_per_layer(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """GGUF stores some per-layer values as arrays (head counts, FFN sizes): take the largest."""
    for field in _PER_LAYER_FIELDS:
        key = f"{arch}.{GGUF_KEYS[field]}"
        value = meta.get(key)
        if hasattr(value, "__len__") and not isinstance(value, str) and len(value):
            meta[key] = int(max(value))
    return meta


def _shared_gguf_config(meta: dict[str, Any], arch: str, vocab_size: int) -> ModelConfig:
    """An architecture without a family: the keys every decoder has, and its experts if any."""
    experts, used, expert_ff = (meta.get(f"{arch}.{k}") for k in ("expert_count", "expert_used_count",
                                                                 "expert_feed_forward_length"))  # fmt: skip
    if f"{arch}.feed_forward_length" not in meta and expert_ff and used:
        meta[f"{arch}.feed_forward_length"] = int(expert_ff) * int(used)
    moe = MoeSpec(int(experts), int(used or 1), int(expert_ff or 1)) if experts else None
    return ModelConfig(**common_from_gguf(meta, vocab_size), moe=moe)


def _shared_hf_config(config: dict[str, Any], name: str) -> ModelConfig:
    text = dict(config.get("text_config") or config)
    text.setdefault("intermediate_size", 4 * int(text.get("hidden_size") or 0) or None)
    experts = text.get("num_experts") or text.get("num_local_experts")
    used, expert_ff = text.get("num_experts_per_tok"), text.get("moe_intermediate_size") or text["intermediate_size"]
    moe = MoeSpec(int(experts), int(used or 1), int(expert_ff)) if experts else None
    return ModelConfig(**common_from_hf(text, name), moe=moe)


def _hf_folder_vision(folder: Path, config: Mapping[str, Any]) -> VisionShape | None:
    """The vision tensors of a Hugging Face folder, by their names in the safetensors headers."""
    if not config.get("vision_config"):  # absent, or null (a Gemma 4 without vision)
        return None
    weight_bytes = _tensor_bytes(folder, is_vision_tensor)
    from app.engine.loader.processor_config import read_processor_settings

    processor = read_processor_settings(folder, "image_processor").values  # either layout
    return vision_from_hf_config(config, weight_bytes, f"{folder.name}/*.safetensors", processor)


def _hf_folder_audio(folder: Path, config: Mapping[str, Any]) -> AudioShape | None:
    """The audio side (a speech model's, with its LoRA adapter; Gemma 4's tower), by the tensor names in the
    folder's safetensors headers."""
    from app.engine.loader.safetensors import is_unused_tensor, read_header, weight_files

    if audio_from_hf_config(config, (), "") is None:
        return None
    files = [*weight_files(folder), *([folder / ADAPTER_WEIGHTS] if (folder / ADAPTER_WEIGHTS).is_file() else [])]
    sizes = []
    for file in files:
        table, _ = read_header(file)
        table.pop("__metadata__", None)
        sizes += [(name, entry["data_offsets"][1] - entry["data_offsets"][0])
                  for name, entry in table.items() if not is_unused_tensor(name)]  # fmt: skip
    return audio_from_hf_config(config, sizes, f"{folder.name}/*.safetensors", folder)


def _tensor_bytes(folder: Path, wanted: Any) -> int:
    """The bytes of the folder's tensors whose Hugging Face names `wanted` picks (headers only)."""
    from app.engine.loader.safetensors import read_safetensors_file, weight_files

    return sum(
        tensor.data.nbytes
        for file in weight_files(folder)
        for name, tensor in read_safetensors_file(file).items()
        if wanted(name)
    )
