"""Gemma 4's audio tower from llama.cpp's mmproj GGUF (the audio half, projector type "gemma4a"), under
the names the Hugging Face folder gives it, so the same `Gemma4AudioTower` runs either.

llama.cpp's converter (convert_hf_to_gguf.py's `Gemma4VisionAudioModel`) renames `model.audio_tower.*` to
gguf-py's `a.*` names (the table below), drops clipped linears' `.linear`, stores each scalar bound as a
one-element vector, the depthwise kernel as `[hidden, K]` and `per_dim_scale` already through softplus;
`model.embed_audio.embedding_projection` becomes `mm.a.input_projection`. The file's `clip.audio.*` keys
give the sizes; what they leave out is read off the tensors' shapes (channels, kernel, output width), and
the attention's chunking is transformers' defaults, which llama.cpp's graph (gemma4a.cpp) hardcodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.models.audio.folder_tensors import Tensors, check_named_shapes
from app.engine.models.audio.gemma4_audio_config import Gemma4AudioConfig, Gemma4MelSettings, expected_shapes
from app.engine.quant.dispatch import QuantizedTensor

PROJECTOR = "gemma4a"
BOUNDS = ("input_min", "input_max", "output_min", "output_max")
# our name (after `tower.layers.{i}.` or at the top) -> llama.cpp's (after `a.blk.{i}.` or at the top)
LAYER_NAMES = {
    "feed_forward1.ffw_layer_1": "ffn_up", "feed_forward1.ffw_layer_2": "ffn_down",
    "feed_forward1.pre_layer_norm": "ffn_norm", "feed_forward1.post_layer_norm": "ffn_post_norm",
    "feed_forward2.ffw_layer_1": "ffn_up_1", "feed_forward2.ffw_layer_2": "ffn_down_1",
    "feed_forward2.pre_layer_norm": "ffn_norm_1", "feed_forward2.post_layer_norm": "ffn_post_norm_1",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.post": "attn_out", "self_attn.relative_k_proj": "attn_k_rel",
    "norm_pre_attn": "attn_pre_norm", "norm_post_attn": "attn_post_norm", "norm_out": "ln2",
    "lconv1d.linear_start": "conv_pw1", "lconv1d.linear_end": "conv_pw2", "lconv1d.depthwise_conv1d": "conv_dw",
    # crossed in the file, as gguf-py maps them (clip.cpp reads them crossed back: "swapped in GGUF")
    "lconv1d.pre_layer_norm": "conv_norm", "lconv1d.conv_norm": "norm_conv",
}  # fmt: skip
TOP_NAMES = {
    "tower.subsample_conv_projection.layer0.conv": "a.conv1d.0",
    "tower.subsample_conv_projection.layer0.norm": "a.conv1d.0.norm",
    "tower.subsample_conv_projection.layer1.conv": "a.conv1d.1",
    "tower.subsample_conv_projection.layer1.norm": "a.conv1d.1.norm",
    "tower.subsample_conv_projection.input_proj_linear": "a.input_projection",
    "tower.output_proj": "a.pre_encode.out",
    "embedder.embedding_projection": "mm.a.input_projection",
}


def is_gemma4_audio_mmproj(metadata: dict[str, Any]) -> bool:
    return bool(metadata.get("clip.has_audio_encoder")) and metadata.get("clip.audio.projector_type") == PROJECTOR


def gguf_name(ours: str) -> str:
    """llama.cpp's name for one of our tensor names (`tower.layers.3.self_attn.q_proj.linear.weight`...)."""
    if ours.endswith(".self_attn.per_dim_scale"):
        return f"a.blk.{ours.split('.')[2]}.per_dim_scale.weight"
    stem, suffix = ours.rsplit(".", 1)
    stem = stem.removesuffix(".linear")
    if stem.startswith("tower.layers."):
        index, rest = stem[len("tower.layers.") :].split(".", 1)
        return f"a.blk.{index}.{LAYER_NAMES[rest]}.{suffix}"
    return f"{TOP_NAMES[stem]}.{suffix}"


def load_gemma4_audio_mmproj(
    path: Path, audio_token_ids: dict[str, int | None]
) -> tuple[Gemma4AudioConfig, Tensors] | None:
    """The audio tower's config and tensors from an mmproj GGUF, None for one without Gemma 4 audio (a
    vision-only mmproj); CheckpointError naming the file and key or tensor. `audio_token_ids`: the text
    GGUF's tokenizer's ids of `<|audio|>`, `<|audio>`, `<audio|>`."""
    file = read_gguf(path)
    meta, stored = file.metadata, file.tensors
    if not is_gemma4_audio_mmproj(meta):
        return None

    def key(name: str, kind: type = int) -> Any:
        value = meta.get(f"clip.audio.{name}")
        if value is None:
            raise CheckpointError(f"{path}: lacks clip.audio.{name}: cannot size its audio tower")
        return kind(value)

    def shape(name: str) -> tuple[int, ...]:
        found = stored.get(name)
        if found is None:
            raise CheckpointError(f"{path}: the Gemma 4 audio tower lacks {name}")
        return tuple(found.shape)

    c0, c1 = shape("a.conv1d.0.weight")[0], shape("a.conv1d.1.weight")[0]
    cfg = Gemma4AudioConfig(
        hidden_size=key("embedding_length"), num_layers=key("block_count"), num_heads=key("attention.head_count"),
        conv_channels=(c0, c1), conv_kernel_size=shape("a.blk.0.conv_dw.weight")[1], chunk_size=12,
        context_left=13, context_right=0, logit_cap=50.0, invalid_logit=-1e9, residual_weight=0.5,
        gradient_clipping=1e10, clipped_linears="a.blk.0.attn_q.input_min" in stored,
        rms_norm_eps=float(meta.get("clip.audio.attention.layer_norm_epsilon", 1e-6)), activation="silu",
        output_dim=shape("a.pre_encode.out.weight")[0], text_hidden_size=shape("mm.a.input_projection.weight")[0],
        audio_token_id=audio_token_ids.get("<|audio|>") or -1, boa_token_id=audio_token_ids.get("<|audio>"),
        eoa_token_id=audio_token_ids.get("<audio|>"), mel=Gemma4MelSettings(feature_size=key("num_mel_bins")),
    )  # fmt: skip
    shapes = expected_shapes(cfg)
    found: Tensors = {}
    for ours in shapes:
        tensor = stored.get(gguf_name(ours))
        if tensor is not None and ours.endswith("depthwise_conv1d.weight") and len(tensor.shape) == 2:
            tensor = QuantizedTensor(tensor.name, tensor.qtype, (tensor.shape[0], 1, tensor.shape[1]), tensor.data)
        if tensor is not None:
            found[ours] = tensor
    check_named_shapes(path, found, shapes, gguf_name, "the Gemma 4 audio tower lacks", "the config needs")
    tensors: Tensors = {}
    for ours, tensor in found.items():
        if ours.endswith("per_dim_scale"):  # softplus already applied: the tower takes it as it is
            ours = ours.replace("per_dim_scale", "softplus_per_dim_scale")
        tensors[ours] = QuantizedTensor(ours, tensor.qtype, tensor.shape, tensor.data)
    return cfg, tensors
