"""GGUFs of the hybrid fixtures, written at test time from their Hugging Face weights in llama.cpp's layout.

`write_gguf` is the generic part (metadata keys, a minimal tokenizer section, tensors in a chosen
float type); each architecture has a function mirroring what llama.cpp's convert_hf_to_gguf.py does
to its tensors (`qwen_gguf_tensors`: its Qwen3Next / Qwen3.5 model classes). Nothing here imports
torch: the HF weights are read with the engine's safetensors reader as float32.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GQ

from app.engine.loader.safetensors import read_safetensors_file

_GGUF_ARCH = {"qwen35": "QWEN35", "qwen35moe": "QWEN35MOE", "qwen3next": "QWEN3NEXT"}


def hf_weights(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """config.json and every tensor of an HF fixture folder, as float32 arrays."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    tensors = read_safetensors_file(folder / "model.safetensors")
    return config, {name: t.dequantize().astype(np.float32) for name, t in tensors.items()}


def write_gguf(
    path: Path,
    arch: str,
    metadata: dict[str, Any],
    tensors: Iterable[tuple[str, np.ndarray]],
    vocab_size: int,
    float_type: Callable[[str, np.ndarray], GQ] = lambda name, data: GQ.BF16 if data.ndim > 1 else GQ.F32,
) -> Path:
    """A GGUF of `arch` with `metadata` (`{arch}.*` keys named without the prefix; lists become arrays)
    and `tensors` (GGUF name, float32 values in numpy order) stored as `float_type(name, values)` says."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-random-{arch}")
    for key, value in metadata.items():
        full = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_array(full, list(value))
    writer.add_tokenizer_model("gpt2")  # a minimal vocabulary: the tests run on token ids
    writer.add_tokenizer_pre("default")
    writer.add_token_list([f"<t{i}>" for i in range(vocab_size)])
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab_size)
    writer.add_token_merges([])
    writer.add_eos_token_id(vocab_size - 1)
    for name, data in tensors:
        qtype = float_type(name, data)
        if qtype == GQ.F32:
            writer.add_tensor(name, data.astype(np.float32))
        elif qtype == GQ.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- Qwen3.5 / Qwen3.5-MoE / Qwen3-Next ---------------------------------------------------------


def qwen_metadata(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys convert_hf_to_gguf.py writes for these architectures (TextModel, Qwen2MoeModel,
    Qwen3NextModel; Qwen3.5's M-RoPE sections)."""
    head_dim = cfg["head_dim"]
    factor = cfg["rope_parameters"].get("partial_rotary_factor", 0.25)
    meta: dict[str, Any] = {
        "context_length": cfg["max_position_embeddings"],
        "embedding_length": cfg["hidden_size"],
        "block_count": cfg["num_hidden_layers"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        "rope.freq_base": float(cfg["rope_parameters"]["rope_theta"]),
        "ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
        "ssm.state_size": cfg["linear_key_head_dim"],
        "ssm.group_count": cfg["linear_num_key_heads"],
        "ssm.time_step_rank": cfg["linear_num_value_heads"],
        "ssm.inner_size": cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
        "full_attention_interval": _interval(cfg),
        "rope.dimension_count": int(head_dim * factor),
    }
    if "intermediate_size" in cfg:
        meta["feed_forward_length"] = cfg["intermediate_size"]
    if "num_experts" in cfg:
        meta.update(
            {
                "expert_count": cfg["num_experts"],
                "expert_used_count": cfg["num_experts_per_tok"],
                "expert_feed_forward_length": cfg["moe_intermediate_size"],
                "expert_shared_feed_forward_length": cfg["shared_expert_intermediate_size"],
            }
        )
    if arch in ("qwen35", "qwen35moe"):
        meta["rope.dimension_sections"] = [11, 11, 10, 0]
    return meta


def _interval(cfg: dict[str, Any]) -> int:
    """The converter writes `full_attention_interval`; the fixtures' configs list layer_types instead."""
    types = cfg["layer_types"]
    interval = types.index("full_attention") + 1
    expected = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(len(types))
    ]
    assert types == expected, f"layer_types {types} are no every-{interval}th pattern"
    return interval


def qwen_gguf_tensors(
    arch: str, cfg: dict[str, Any], weights: dict[str, np.ndarray], legacy_ssm_in: bool = False
) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, values) as convert_hf_to_gguf.py writes them: `1 + w` for every norm but the gated
    one, -exp(A_log), the conv squeezed, Qwen3-Next's in_proj_qkvz as attn_qkv + attn_gate, experts
    stacked, and for qwen35 / qwen35moe the value heads reordered from grouped to tiled; an MTP head
    (`mtp.*`) as the block after the last layer (conversion/qwen.py's `_QwenMtpMixin` renames)."""
    layers = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, _GGUF_ARCH[arch]), layers + 1)
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    tiled = arch in ("qwen35", "qwen35moe") and hk != hv
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    out = []
    for hf_name, data in weights.items():
        name = hf_name.removeprefix("model.language_model.").removeprefix("model.")
        name = name if name.startswith("lm_head") else f"model.{name}"
        if name.startswith("model.mtp."):
            rest = name.removeprefix("model.mtp.")
            if rest.startswith("layers.0."):
                name = f"model.layers.{layers}.{rest.removeprefix('layers.0.')}"
            else:  # the nextn tensors: named directly (gguf-py's map may not list them for this arch)
                module, kind = rest.rsplit(".", 1)
                zero_centred = module != "fc"  # the norms: `1 + w`, as the model's own
                out.append((f"blk.{layers}.nextn.{_MTP_RENAMES[module]}.{kind}", data + 1 if zero_centred else data))
                continue
        if name.endswith(".A_log"):
            data = -np.exp(data)
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif "conv1d" in name:
            data = data.reshape(data.shape[0], data.shape[-1])
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            data = data + 1
        if tiled and "linear_attn." in name:
            data = _tiled_v_heads(name, data, hk, hv // hk, dk, dv)
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        if name.endswith("mlp.experts.gate_up_proj"):  # stacked [E, 2 ff, hidden]
            ff = data.shape[1] // 2
            out += [
                (f"blk.{layer}.ffn_gate_exps.weight", data[:, :ff]),
                (f"blk.{layer}.ffn_up_exps.weight", data[:, ff:]),
            ]
            continue
        if name.endswith("mlp.experts.down_proj"):
            out.append((f"blk.{layer}.ffn_down_exps.weight", data))
            continue
        if ".mlp.experts." in name:  # one expert's projection: stacked per layer below
            parts = name.split(".")
            experts.setdefault((layer, parts[-2]), {})[int(parts[-3])] = data
            continue
        if "in_proj_qkvz" in name:  # older converters kept it whole, as `ssm_in`
            out += (
                [(f"blk.{layer}.ssm_in.weight", data)]
                if legacy_ssm_in
                else _split_qkvz(layer, data, hk, hv // hk, dk, dv)
            )
            continue
        if name.endswith("shared_expert_gate.weight"):
            data = data.reshape(-1)  # llama.cpp's {n_embd}
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, f"no GGUF name for {hf_name}"
        out.append((gguf_name, data))
    return out + stacked_experts(experts)


_MTP_RENAMES = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
                "norm": "shared_head_norm"}


def stacked_experts(experts: dict[tuple[int, str], dict[int, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """Per-expert projections `{(layer, "up_proj"): {expert: values}}` stacked as GGUF's `ffn_*_exps`."""
    out = []
    for (layer, proj), per_expert in sorted(experts.items()):
        kind = proj.removesuffix("_proj")
        out.append(
            (f"blk.{layer}.ffn_{kind}_exps.weight", np.stack([per_expert[e] for e in sorted(per_expert)]))
        )
    return out


def _tiled_v_heads(name: str, data: np.ndarray, hk: int, r: int, dk: int, dv: int) -> np.ndarray:
    """_LinearAttentionVReorderBase: value heads from grouped (by key head) to tiled order."""

    def reorder(x: np.ndarray, axis: int, head_dim: int) -> np.ndarray:
        x = np.moveaxis(x, axis, 0)
        shape = x.shape
        x = x.reshape(hk, r, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
        return np.moveaxis(x, 0, axis)

    if ".in_proj_qkv." in name or ".conv1d." in name:
        qk = 2 * hk * dk
        return np.concatenate([data[:qk], reorder(data[qk:], 0, dv)])
    if ".in_proj_z." in name:
        return reorder(data, 0, dv)
    if ".in_proj_b." in name or ".in_proj_a." in name or name.endswith((".A_log", ".dt_proj.bias")):
        return reorder(data, 0, 1)
    if ".out_proj." in name:
        return reorder(data, 1, dv)
    return data


def _split_qkvz(
    layer: int, data: np.ndarray, hk: int, r: int, dk: int, dv: int
) -> list[tuple[str, np.ndarray]]:
    """Qwen3NextModel.modify_tensors: per key head [q, k, v, z] rows -> attn_qkv (all q, k, v) and attn_gate (z)."""
    grouped = data.reshape(hk, 2 * dk + 2 * r * dv, data.shape[1])
    bounds = np.cumsum([dk, dk, r * dv])
    q, k, v, z = (p.reshape(-1, data.shape[1]) for p in np.split(grouped, bounds, axis=1))
    return [(f"blk.{layer}.attn_qkv.weight", np.concatenate([q, k, v])), (f"blk.{layer}.attn_gate.weight", z)]


def write_qwen_gguf(
    folder: Path,
    arch: str,
    path: Path,
    float_type: Callable[[str, np.ndarray], GQ] | None = None,
    legacy_ssm_in: bool = False,
    mtp_block: bool = False,
) -> Path:
    """The HF fixture in `folder` as llama.cpp's converter would write it for `arch` (`legacy_ssm_in`:
    Qwen3-Next's fused `in_proj_qkvz` kept whole, as converters before the split wrote it)."""
    cfg, weights = hf_weights(folder)
    cfg = cfg.get("text_config", cfg)
    kwargs = {} if float_type is None else {"float_type": float_type}
    tensors = qwen_gguf_tensors(arch, cfg, weights, legacy_ssm_in)
    assert all(math.isfinite(float(np.abs(t).max())) for _, t in tensors)
    metadata = qwen_metadata(arch, cfg)
    has_mtp = any(name.startswith("mtp.") for name in weights)  # converted with the model (write_hf_with_mtp)
    if mtp_block or has_mtp:  # _QwenMtpMixin: one more block, counted in block_count, named by nextn_predict_layers
        tensors += [] if has_mtp else _mtp_block(cfg)
        metadata["block_count"] += 1
        metadata["nextn_predict_layers"] = 1
    return write_gguf(path, arch, metadata, tensors, cfg["vocab_size"], **kwargs)


def _mtp_block(cfg: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    """A dense-MLP MTP block of random values (as the Qwen3.5 converter writes one: a gated-attention
    decoder block plus the nextn projections and norms)."""
    rng = np.random.default_rng(0)
    hidden, heads, kv, d = (
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    ff = cfg.get("intermediate_size") or cfg["moe_intermediate_size"]
    shapes = {
        "attn_norm.weight": (hidden,), "post_attention_norm.weight": (hidden,), "attn_q.weight": (2 * heads * d, hidden),
        "attn_k.weight": (kv * d, hidden), "attn_v.weight": (kv * d, hidden), "attn_output.weight": (hidden, heads * d),
        "attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,), "ffn_gate.weight": (ff, hidden),
        "ffn_up.weight": (ff, hidden), "ffn_down.weight": (hidden, ff), "nextn.eh_proj.weight": (hidden, 2 * hidden),
        "nextn.enorm.weight": (hidden,), "nextn.hnorm.weight": (hidden,), "nextn.shared_head_norm.weight": (hidden,),
    }  # fmt: skip
    block = cfg["num_hidden_layers"]
    return [
        (f"blk.{block}.{name}", rng.normal(0, 1, shape).astype(np.float32)) for name, shape in shapes.items()
    ]


# -- Nemotron-H (dense and MoE) / Granite 4 hybrid ----------------------------------------------

_MAMBA_ARCH = {
    "nemotron_h": "NEMOTRON_H",
    "nemotron_h_moe": "NEMOTRON_H_MOE",
    "granitehybrid": "GRANITE_HYBRID",
}
_SPELLINGS = {
    "M": ("mamba", "linear_attention"),
    "*": ("attention", "full_attention"),
    "-": ("mlp",),
    "E": ("moe",),
}
_PATTERN = {name: letter for letter, names in _SPELLINGS.items() for name in (letter, *names)}


def mamba_layer_pattern(cfg: dict[str, Any]) -> str:
    """One letter per layer (M Mamba-2, * attention, - MLP, E experts) from either family's config."""
    if "hybrid_override_pattern" in cfg:
        return cfg["hybrid_override_pattern"]
    return "".join(_PATTERN[t] for t in cfg.get("layers_block_type") or cfg["layer_types"])


def mamba_metadata(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys convert_hf_to_gguf.py writes (TextModel, GraniteMoeModel, GraniteHybridModel,
    NemotronHModel): per-layer head_count_kv (and for Nemotron-H feed_forward_length) arrays that are 0
    where a layer lacks the part, ssm.* with time_step_rank = the number of heads."""
    pattern = mamba_layer_pattern(cfg)
    granite = arch == "granitehybrid"
    heads = cfg["num_attention_heads"]
    meta: dict[str, Any] = {
        "context_length": 2**20,  # the converter's value for models without RoPE
        "embedding_length": cfg["hidden_size"],
        "block_count": len(pattern),
        "attention.head_count": heads,
        "attention.head_count_kv": [cfg["num_key_value_heads"] if c == "*" else 0 for c in pattern],
        "attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps" if granite else "layer_norm_epsilon"]),
        "ssm.conv_kernel": cfg["mamba_d_conv" if granite else "conv_kernel"],
        "ssm.state_size": cfg["mamba_d_state" if granite else "ssm_state_size"],
        "ssm.group_count": cfg["mamba_n_groups" if granite else "n_groups"],
        "ssm.time_step_rank": cfg["mamba_n_heads" if granite else "mamba_num_heads"],
        "ssm.inner_size": cfg["mamba_n_heads"] * cfg["mamba_d_head"]
        if granite
        else cfg["mamba_num_heads"] * cfg["mamba_head_dim"],
        # llama.cpp's flag for RoPE in granitehybrid attention (its converter sets it only for Bamba;
        # a config asking for RoPE gets it here, so the file says what the model computes)
        "rope.scaling.finetuned": cfg.get("position_embedding_type") == "rope",
    }
    if meta["rope.scaling.finetuned"]:
        meta["context_length"] = cfg["max_position_embeddings"]
    if granite:
        meta["feed_forward_length"] = cfg["intermediate_size"]
        meta["rope.freq_base"] = float(cfg["rope_parameters"]["rope_theta"])
        meta["rope.dimension_count"] = cfg["hidden_size"] // heads
        meta["expert_count"] = cfg["num_local_experts"]
        meta["expert_used_count"] = cfg["num_experts_per_tok"]
        meta["expert_shared_feed_forward_length"] = cfg["shared_intermediate_size"]
        for key, hf in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                        ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):  # fmt: skip
            meta[key] = float(cfg[hf])
        return meta
    moe = arch == "nemotron_h_moe"
    ff = cfg["moe_intermediate_size"] if moe else cfg["intermediate_size"]
    meta["feed_forward_length"] = [ff if c in "-E" else 0 for c in pattern]
    meta["attention.key_length"] = meta["attention.value_length"] = cfg["head_dim"]
    if moe:
        meta.update(
            {
                "expert_count": cfg["n_routed_experts"],
                "expert_used_count": cfg["num_experts_per_tok"],
                "expert_feed_forward_length": cfg["moe_intermediate_size"],
                "expert_shared_feed_forward_length": cfg["moe_shared_expert_intermediate_size"],
                "expert_shared_count": cfg["n_shared_experts"],
                "expert_weights_norm": bool(cfg["norm_topk_prob"]),
                "expert_weights_scale": float(cfg["routed_scaling_factor"]),
                "expert_group_count": cfg["n_group"],
                "expert_group_used_count": cfg["topk_group"],
            }
        )
        if cfg.get("moe_latent_size") is not None:
            meta["moe_latent_size"] = cfg["moe_latent_size"]
    return meta


def mamba_gguf_tensors(
    arch: str, cfg: dict[str, Any], weights: dict[str, np.ndarray]
) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, values) as convert_hf_to_gguf.py writes them: -exp(A_log) as [H, 1], D as [H, 1], the
    conv squeezed, the gated norm as [G, d_inner / G], q/k rows permuted as for Llama (LlamaModel's
    undo_permute), Nemotron-H's experts stacked, Granite's fused gate/up rows split (gate first)."""
    pattern = mamba_layer_pattern(cfg)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, _MAMBA_ARCH[arch]), len(pattern))
    granite = arch == "granitehybrid"
    groups = cfg["mamba_n_groups" if granite else "n_groups"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    out = []
    for hf_name, data in weights.items():
        name = hf_name
        layer = int(name.split(".")[2]) if name.startswith(("model.layers.", "backbone.layers.")) else -1
        if name.endswith(".A_log"):
            data = -np.exp(data).reshape(-1, 1)
        elif name.endswith((".mixer.D", ".mamba.D")):
            data = data.reshape(-1, 1)
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif "conv1d.weight" in name:
            data = data.reshape(data.shape[0], data.shape[-1])
        elif name.endswith(("mixer.norm.weight", "mamba.norm.weight")) and pattern[layer] == "M":
            data = data.reshape(groups, -1)
        elif name.endswith("q_proj.weight"):
            data = _llama_permute(data, heads, heads)
        elif name.endswith("k_proj.weight"):
            data = _llama_permute(data, heads, kv)
        if name.endswith("e_score_correction_bias"):
            out.append((f"blk.{layer}.exp_probs_b.bias", data))
            continue
        if ".experts." in name and not granite:  # one expert's projection: stacked per layer below
            parts = name.split(".")
            experts.setdefault((layer, parts[-2]), {})[int(parts[-3])] = data
            continue
        if name.endswith(("input_linear.weight",)):  # [.., 2 ff, hidden]: gate rows, then up rows
            half = data.shape[-2] // 2
            kind = "exps" if "block_sparse_moe" in name else ("shexp" if cfg["num_local_experts"] else "")
            suffix = f"_{kind}" if kind else ""
            out += [
                (f"blk.{layer}.ffn_gate{suffix}.weight", data[..., :half, :]),
                (f"blk.{layer}.ffn_up{suffix}.weight", data[..., half:, :]),
            ]
            continue
        if name.endswith("shared_mlp.output_linear.weight") and not cfg["num_local_experts"]:
            out.append((f"blk.{layer}.ffn_down.weight", data))
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, f"no GGUF name for {hf_name}"
        out.append((gguf_name, data))
    return out + stacked_experts(experts)


def _llama_permute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """LlamaModel.permute: each head's rows from rotate-half to interleaved pair order."""
    heads = n_head_kv if n_head_kv != n_head else n_head
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def converter_float_type(kind: GQ) -> Callable[[str, np.ndarray], GQ]:
    """The converter's rule for an `--outtype` of `kind`: F32 for vectors, norms, tensors not named
    `.weight` (ssm_a, ssm_d, biases), routers and the conv; `kind` for the rest."""
    always_f32 = (".ffn_gate_inp.", ".ssm_conv1d.")

    def float_type(name: str, data: np.ndarray) -> GQ:
        if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
            return GQ.F32
        return GQ.F32 if any(part in name for part in always_f32) else kind

    return float_type


def write_mamba_gguf(
    folder: Path,
    arch: str,
    path: Path,
    kind: GQ = GQ.BF16,
    mtp_block: bool = False,
    attention_head_dim: int | None = None,
) -> Path:
    """The HF fixture in `folder` (Nemotron-H or Granite 4 hybrid) as llama.cpp's converter writes it
    for `arch` with `--outtype` `kind` (`mtp_block`: a Nemotron-H MoE's multi-token-prediction head
    appended as one more block, as NemotronHModel does unless --no-mtp). `attention_head_dim`: the
    attention layers' heads made that wide, with random q/k/v/output weights of the fixture's spread
    (the CUDA attention kernels take head sizes from 64; the fixtures' are 12 to 16)."""
    cfg, weights = hf_weights(folder)
    tensors = mamba_gguf_tensors(arch, cfg, weights)
    metadata = mamba_metadata(arch, cfg)
    if attention_head_dim is not None:
        tensors = _widened_attention(tensors, metadata, attention_head_dim)
    if mtp_block:
        block = metadata["block_count"]
        tensors += _nemotron_mtp_block(block, tensors)
        metadata["block_count"] += 1
        metadata["nextn_predict_layers"] = 1
        for key in ("attention.head_count_kv", "feed_forward_length"):  # both parts: attention and experts
            metadata[key] = [*metadata[key], max(metadata[key])]
    return write_gguf(path, arch, metadata, tensors, cfg["vocab_size"], converter_float_type(kind))


def _widened_attention(
    tensors: list[tuple[str, np.ndarray]], metadata: dict[str, Any], head_dim: int
) -> list[tuple[str, np.ndarray]]:
    """The attention projections redrawn for heads of `head_dim` (metadata updated to match: key and
    value length, and RoPE's width where the file has one)."""
    rng = np.random.default_rng(head_dim)
    heads, kv_per_layer = metadata["attention.head_count"], metadata["attention.head_count_kv"]
    metadata["attention.key_length"] = metadata["attention.value_length"] = head_dim
    if "rope.dimension_count" in metadata:
        metadata["rope.dimension_count"] = head_dim
    out = []
    for name, data in tensors:
        parts = name.split(".")
        if name.startswith("blk.") and parts[2] in ("attn_q", "attn_k", "attn_v", "attn_output"):
            assert parts[3] == "weight", f"{name}: only bias-free attention is widened"
            kv = kv_per_layer[int(parts[1])] if isinstance(kv_per_layer, list) else kv_per_layer
            rows = (heads if parts[2] in ("attn_q", "attn_output") else kv) * head_dim
            shape = (data.shape[0], rows) if parts[2] == "attn_output" else (rows, data.shape[1])
            data = rng.normal(0.0, float(data.std()), shape).astype(np.float32)
        out.append((name, data))
    return out


def _nemotron_mtp_block(block: int, tensors: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """An MTP block of random values shaped like the model's attention and expert tensors, plus the
    nextn projection and norms."""
    rng = np.random.default_rng(0)
    shapes = {name.split(".", 2)[2]: data.shape for name, data in tensors if name.startswith("blk.")}
    hidden = shapes["attn_norm.weight"][0]
    parts = [p for p in shapes if p.startswith(("attn_", "ffn_", "exp_probs_b"))]
    shapes = {
        **{p: shapes[p] for p in parts},
        "post_attention_norm.weight": (hidden,),
        "nextn.eh_proj.weight": (hidden, 2 * hidden),
        "nextn.enorm.weight": (hidden,),
        "nextn.hnorm.weight": (hidden,),
        "nextn.shared_head_norm.weight": (hidden,),
    }
    return [(f"blk.{block}.{p}", rng.normal(0, 1, shape).astype(np.float32)) for p, shape in shapes.items()]


# -- multi-token prediction heads (Hugging Face layout) ------------------------------------------


def write_hf_with_mtp(folder: Path, out: Path, seed: int = 0, scale: float = 0.1) -> Path:
    """The HF fixture in `folder` copied to `out` with a random MTP head added under `mtp.*`, as
    Qwen3.5 / Qwen3-Next folders hold it (`mtp.fc`, the three norms, one gated-attention decoder layer
    with the model's kind of FFN: a dense MLP, or experts and a gated shared expert); norms are stored
    zero-centred (values near 0, the model adds 1), config.json gets `mtp_num_hidden_layers`."""
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    config, weights = hf_weights(folder)
    cfg = config.get("text_config", config)
    rng = np.random.default_rng(seed)
    hidden, heads, kv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ff = cfg.get("intermediate_size") or cfg["moe_intermediate_size"]
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,), "mtp.norm.weight": (hidden,),
        "mtp.layers.0.input_layernorm.weight": (hidden,), "mtp.layers.0.post_attention_layernorm.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * heads * d, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": (kv * d, hidden), "mtp.layers.0.self_attn.v_proj.weight": (kv * d, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": (hidden, heads * d),
        "mtp.layers.0.self_attn.q_norm.weight": (d,), "mtp.layers.0.self_attn.k_norm.weight": (d,),
    }  # fmt: skip
    mlp = "mtp.layers.0.mlp."
    if cfg.get("num_experts"):
        ff, shared = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        shapes[mlp + "gate.weight"] = (cfg["num_experts"], hidden)
        shapes[mlp + "shared_expert_gate.weight"] = (1, hidden)
        for part, size in [*((f"experts.{e}.", ff) for e in range(cfg["num_experts"])), ("shared_expert.", shared)]:
            shapes.update({f"{mlp}{part}gate_proj.weight": (size, hidden), f"{mlp}{part}up_proj.weight": (size, hidden),
                           f"{mlp}{part}down_proj.weight": (hidden, size)})  # fmt: skip
    else:
        shapes.update({f"{mlp}gate_proj.weight": (ff, hidden), f"{mlp}up_proj.weight": (ff, hidden),
                       f"{mlp}down_proj.weight": (hidden, ff)})  # fmt: skip
    if any(name.endswith(".mlp.experts.gate_up_proj") for name in weights):  # Qwen3.5-MoE stacks its experts
        for part in ("gate", "up", "down"):
            per_expert = [shapes.pop(f"{mlp}experts.{e}.{part}_proj.weight") for e in range(cfg["num_experts"])]
            shapes[f"{mlp}experts.{part}"] = (len(per_expert), *per_expert[0])
    for name, shape in shapes.items():
        weights[name] = (rng.normal(0, scale, shape)).astype(np.float32)
    for prefix in {name.removesuffix("gate") for name in weights if name.endswith(".experts.gate")}:
        weights[f"{prefix}gate_up_proj"] = np.concatenate([weights.pop(f"{prefix}gate"), weights.pop(f"{prefix}up")], 1)
        weights[f"{prefix}down_proj"] = weights.pop(f"{prefix}down")
    out.mkdir(parents=True, exist_ok=True)
    for extra in folder.iterdir():
        if extra.name not in ("model.safetensors", "config.json") and extra.is_file():
            (out / extra.name).write_bytes(extra.read_bytes())
    cfg["mtp_num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    stored = {name: StoredTensor("F32", tuple(values.shape), values) for name, values in weights.items()}
    write_safetensors(out / "model.safetensors", stored)
    return out
