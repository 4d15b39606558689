"""The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3-Next and Nemotron-H: a one-layer draft model
that rides on the target's hidden states (`--speculative mtp`, core/mtp_drafter.py).

As vLLM's qwen3_next_mtp.py and llama.cpp's qwen3next `graph_mtp` define it, the head's row at
position i reads the target's final hidden state h at i (after its output norm) and the token t at
i + 1: `x = eh_proj(concat(enorm(embed(t)), hnorm(h)))`, then one decoder block of the model's own
kind (gated full attention over its own K/V at positions <= i, rotated by i as vLLM's proposer does,
then the MLP or experts), then `shared_head_norm`; the model's LM head turns that into the logits of
the token at i + 2. Chained for more drafts: the head's own normed output stands in for h at the next
position. Every norm is zero-centred like the model's (`1 + w`).

Tensors, as llama.cpp's converter writes them (conversion/qwen.py `_QwenMtpMixin`): the block after the
model's last layer, `blk.{N}`: `nextn.eh_proj` `[hidden, 2 hidden]`, `nextn.enorm`, `nextn.hnorm`,
`nextn.shared_head_norm` (optional: else the model's output norm), optionally `nextn.embed_tokens` and
`nextn.shared_head_head` (else the model's), and the block's attention and FFN tensors under their
usual names. Hugging Face folders hold them as `mtp.fc`, `mtp.pre_fc_norm_embedding`,
`mtp.pre_fc_norm_hidden`, `mtp.norm` and `mtp.layers.0.*` (renamed here the converter's way; the
folder loader skips `mtp.*` for the model itself: names.py).

Nemotron-H (the MoE models, as llama.cpp's `nemotron_h_moe` `graph_mtp` runs it): the same fusion, then
a NoPE attention sub-layer and the model's experts behind `post_attention_norm` in one block, and a
LayerNorm (not RMS, no bias) as `shared_head_norm`; its norms are plain (`w`). Read from GGUFs only: its
folders split the block into `mtp.layers.0` / `mtp.layers.1`, which llama.cpp's converter folds.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata
from app.engine.layers.embedding import Embedding
from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.loader.names import CheckpointError, gguf_name
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.models.config import FFN_DENSE, FFN_MOE, MIXER_ATTENTION, ModelConfig
from app.engine.models.decoder import DecoderLayer, DecoderModel
from app.engine.models.family import Family
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

MTP_ARCHITECTURES = ("qwen35", "qwen35moe", "qwen3next", "nemotron_h", "nemotron_h_moe")
_LAYER_NORM_HEAD = ("nemotron_h", "nemotron_h_moe")  # shared_head_norm is a LayerNorm there
_HF_NEXTN = {
    "fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head_norm",
}  # fmt: skip
_HF_LAYER = re.compile(r"^(?:model\.)?mtp\.layers\.0\.(.+)$")
_HF_NEXTN_NAME = re.compile(r"^(?:model\.)?mtp\.(\w+)\.weight$")
_NEXTN_NORMS = ("nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight")


def mtp_tensors(checkpoint: Any, cfg: ModelConfig, family: Family) -> dict[str, QuantizedTensor] | None:
    """The MTP block's tensors under GGUF names `blk.{num_layers}.*`, with values as the decoder reads
    them (norms `1 + w`); None when the checkpoint has no MTP head."""
    block = cfg.num_layers
    if checkpoint.format == "gguf":
        prefix = f"blk.{block}."
        tensors = {name: t for name, t in checkpoint.tensors.items() if name.startswith(prefix)}
        if not cfg.trailing_blocks or f"{prefix}nextn.eh_proj.weight" not in tensors:
            return None
        adapted = family.adapt_gguf_tensors(tensors, cfg)
        post = adapted.pop(f"{prefix}post_attention_norm.weight", None)  # Nemotron-H's FFN norm (no rename there)
        if post is not None:
            adapted.setdefault(f"{prefix}ffn_norm.weight", post)
        return adapted
    if checkpoint.architecture in _LAYER_NORM_HEAD:
        if any(name.startswith(("mtp.", "model.mtp.")) for f in weight_files(checkpoint.path)
               for name in read_safetensors_file(f)):  # fmt: skip
            raise CheckpointError(f"{checkpoint.path}: Nemotron-H's MTP head is read from a llama.cpp GGUF only "
                                  "(convert_hf_to_gguf.py folds its two mtp.layers into one block)")  # fmt: skip
        return None
    tensors = {}
    for file in weight_files(checkpoint.path):
        for hf_name, tensor in read_safetensors_file(file).items():
            name = _hf_mtp_name(hf_name, block, checkpoint.architecture)
            if name is not None:
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data, tensor.scales)
    if not tensors:
        return None
    adapted = family.adapt_hf_tensors(tensors, cfg)
    for suffix in _NEXTN_NORMS:  # zero-centred like the model's other norms; the converter adds the 1 too
        name = f"blk.{block}.{suffix}"
        if name in adapted:
            values = np.ascontiguousarray(adapted[name].dequantize() + 1.0, np.float32)
            adapted[name] = QuantizedTensor.from_float(name, values, QUANT_TYPES["F32"])
    return adapted


def _hf_mtp_name(hf_name: str, block: int, architecture: str) -> str | None:
    """The GGUF name of one `mtp.*` tensor (as block `block`), None for any other tensor."""
    if match := _HF_LAYER.match(hf_name):
        return gguf_name(f"model.layers.{block}.{match.group(1)}", architecture)
    if (match := _HF_NEXTN_NAME.match(hf_name)) and match.group(1) in _HF_NEXTN:
        return f"blk.{block}.nextn.{_HF_NEXTN[match.group(1)]}.weight"
    if hf_name.startswith(("mtp.", "model.mtp.")):
        raise CheckpointError(f"MTP tensor {hf_name!r} has no place in the MTP head")
    return None


class MtpHead:
    """The MTP block over `model`'s embedding and LM head; its attention's KV cache is the caller's."""

    def __init__(self, backend: Any, model: DecoderModel, tensors: dict[str, QuantizedTensor]) -> None:
        cfg, block = model.config, model.config.num_layers
        prefix = f"blk.{block}"

        def need(name: str) -> QuantizedTensor:
            tensor = tensors.get(f"{prefix}.{name}")
            if tensor is None:
                raise CheckpointError(f"tensor {prefix}.{name} (the MTP head) is missing")
            return tensor

        self.backend, self.model = backend, model
        eps = cfg.rms_norm_eps
        self.eh_proj = Linear(backend, need("nextn.eh_proj.weight"))
        if self.eh_proj.out_features != cfg.hidden_size:
            raise CheckpointError(f"tensor {prefix}.nextn.eh_proj.weight has {self.eh_proj.out_features} rows; "
                                  f"the MTP head needs the hidden size {cfg.hidden_size}")  # fmt: skip
        self.enorm = RMSNorm(backend, need("nextn.enorm.weight"), eps)
        self.hnorm = RMSNorm(backend, need("nextn.hnorm.weight"), eps)
        head_norm = tensors.get(f"{prefix}.nextn.shared_head_norm.weight")
        self.head_norm = model.norm if head_norm is None else RMSNorm(backend, head_norm, eps)
        embed = tensors.get(f"{prefix}.nextn.embed_tokens.weight")
        self.embed = model.embed if embed is None else Embedding(backend, embed)
        head = tensors.get(f"{prefix}.nextn.shared_head_head.weight")
        self.lm_head = None if head is None else Linear(backend, head)
        ffn = FFN_MOE if f"{prefix}.ffn_gate_inp.weight" in tensors else FFN_DENSE
        layers = block + 1
        block_cfg = replace(cfg, num_layers=layers, layer_mixers=(MIXER_ATTENTION,) * layers,
                            layer_ffns=(ffn,) * layers)  # fmt: skip
        attention = next((layer.attn for layer in model.layers if layer.attn is not None), None)
        if attention is None:
            raise CheckpointError("the model has no attention layer whose shape the MTP block could take")
        self.layer = DecoderLayer(backend, block_cfg, tensors, block, attention.spec)
        self.layer_norm_head = cfg.architecture in _LAYER_NORM_HEAD
        if self.layer_norm_head and head_norm is None:
            raise CheckpointError(
                f"tensor {prefix}.nextn.shared_head_norm.weight (the MTP head's LayerNorm) is missing"
            )
        self.eps = eps

    def __call__(self, token_ids: Any, hidden: Any, meta: AttentionMetadata, cache: tuple[Any, Any]) -> Any:
        """The head's normed output `[T, hidden]` for tokens `token_ids` `[T]` at `meta`'s positions, each
        with the hidden state of the position before it (`hidden` `[T, hidden]`: the target's, or the
        head's own output when chaining). Writes its K and V at those positions into `cache`."""
        xp = self.backend.xp
        embedded = self.enorm(self.embed(token_ids))
        x = self.eh_proj(xp.concatenate([embedded, self.hnorm(hidden).astype(embedded.dtype)], axis=-1))
        h, residual = self.layer(x, None, meta, cache)
        if self.layer_norm_head:
            return layer_norm(xp, h + residual, self.head_norm.weight, self.eps)
        normed, _ = self.head_norm.add_and_norm(h, residual)
        return normed

    def logits(self, hidden: Any) -> Any:
        return self.model.logits(hidden) if self.lm_head is None else self.lm_head(hidden)


def layer_norm(xp: Any, x: Any, weight: Any, eps: float) -> Any:
    """LayerNorm without a bias over the last axis (computed in float32), in `x`'s dtype."""
    values = x.astype(xp.float32)
    centred = values - values.mean(axis=-1, keepdims=True)
    scale = xp.float32(1.0) / xp.sqrt((centred * centred).mean(axis=-1, keepdims=True) + xp.float32(eps))
    return (centred * scale * weight.astype(xp.float32)).astype(x.dtype)
