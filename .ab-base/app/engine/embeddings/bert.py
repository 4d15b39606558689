"""The BERT encoder: token ids in, contextual hidden states out.

Written against an array module `xp` (numpy here, cupy on the GPU) and plain matmuls, so
a batch of padded texts runs as a handful of large GEMMs per layer. Weights come from a
Hugging Face `BertModel` safetensors file (keys with or without a `bert.` prefix, as
`BertFor*` heads save them); attention is bidirectional with padding masked out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.embeddings.ops import gelu, layer_norm, softmax_inplace

Array = Any

# Activations by config.json's `hidden_act`; "gelu" in BERT means the exact erf form.
_GELU_KINDS = {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read model config {path}: {error}") from error
        model_type = data.get("model_type")
        if model_type != "bert":
            raise ValueError(f"{path}: model_type {model_type!r} is not a BERT encoder (expected 'bert')")
        position_kind = data.get("position_embedding_type", "absolute")
        if position_kind != "absolute":
            raise ValueError(
                f"{path}: position_embedding_type {position_kind!r} is not supported (only 'absolute')"
            )
        if data.get("hidden_act", "gelu") not in _GELU_KINDS:
            raise ValueError(
                f"{path}: hidden_act {data['hidden_act']!r} unsupported; supported: {sorted(_GELU_KINDS)}"
            )
        config = cls(
            vocab_size=int(data["vocab_size"]),
            hidden_size=int(data["hidden_size"]),
            num_layers=int(data["num_hidden_layers"]),
            num_heads=int(data["num_attention_heads"]),
            intermediate_size=int(data["intermediate_size"]),
            max_positions=int(data["max_position_embeddings"]),
            type_vocab_size=int(data.get("type_vocab_size", 2)),
            layer_norm_eps=float(data.get("layer_norm_eps", 1e-12)),
            hidden_act=data.get("hidden_act", "gelu"),
        )
        if config.hidden_size % config.num_heads:
            raise ValueError(
                f"{path}: hidden_size {config.hidden_size} is not divisible by {config.num_heads} heads"
            )
        return config


@dataclass
class BertLayerWeights:
    # Dense weights are stored `[in, out]` so every projection is `x @ w + b`.
    qkv_w: Array  # query, key and value fused: [hidden, 3 * hidden]
    qkv_b: Array
    attn_out_w: Array
    attn_out_b: Array
    attn_norm_w: Array
    attn_norm_b: Array
    ffn_in_w: Array
    ffn_in_b: Array
    ffn_out_w: Array
    ffn_out_b: Array
    ffn_norm_w: Array
    ffn_norm_b: Array


class BertEncoder:
    """A `BertModel` forward pass (no pooler head): `[batch, seq]` ids -> `[batch, seq, hidden]`."""

    def __init__(self, config: BertConfig, tensors: dict[str, np.ndarray], xp: Any = np) -> None:
        self.config = config
        self.xp = xp
        self._gelu_kind = _GELU_KINDS[config.hidden_act]
        take = _TensorTaker(tensors, xp)
        self.word_embeddings = take(
            "embeddings.word_embeddings.weight", (config.vocab_size, config.hidden_size)
        )
        self.position_embeddings = take(
            "embeddings.position_embeddings.weight", (config.max_positions, config.hidden_size)
        )
        self.token_type_embeddings = take(
            "embeddings.token_type_embeddings.weight", (config.type_vocab_size, config.hidden_size)
        )
        self.embed_norm_w = take("embeddings.LayerNorm.weight", (config.hidden_size,))
        self.embed_norm_b = take("embeddings.LayerNorm.bias", (config.hidden_size,))
        self.layers = [self._layer(take, i) for i in range(config.num_layers)]

    def _layer(self, take: _TensorTaker, index: int) -> BertLayerWeights:
        h, f = self.config.hidden_size, self.config.intermediate_size
        p = f"encoder.layer.{index}."
        qkv_w = [
            take(f"{p}attention.self.{n}.weight", (h, h), transpose=True) for n in ("query", "key", "value")
        ]
        qkv_b = [take(f"{p}attention.self.{n}.bias", (h,)) for n in ("query", "key", "value")]
        return BertLayerWeights(
            qkv_w=self.xp.ascontiguousarray(self.xp.concatenate(qkv_w, axis=1)),
            qkv_b=self.xp.concatenate(qkv_b),
            attn_out_w=take(f"{p}attention.output.dense.weight", (h, h), transpose=True),
            attn_out_b=take(f"{p}attention.output.dense.bias", (h,)),
            attn_norm_w=take(f"{p}attention.output.LayerNorm.weight", (h,)),
            attn_norm_b=take(f"{p}attention.output.LayerNorm.bias", (h,)),
            ffn_in_w=take(f"{p}intermediate.dense.weight", (f, h), transpose=True),
            ffn_in_b=take(f"{p}intermediate.dense.bias", (f,)),
            ffn_out_w=take(f"{p}output.dense.weight", (h, f), transpose=True),
            ffn_out_b=take(f"{p}output.dense.bias", (h,)),
            ffn_norm_w=take(f"{p}output.LayerNorm.weight", (h,)),
            ffn_norm_b=take(f"{p}output.LayerNorm.bias", (h,)),
        )

    def forward(self, input_ids: Array, attention_mask: Array) -> Array:
        """Hidden states `[batch, seq, hidden]` float32 for right-padded ids and their 0/1 mask."""
        xp, cfg = self.xp, self.config
        batch, seq = input_ids.shape
        if seq > cfg.max_positions:
            raise ValueError(f"sequence of {seq} tokens exceeds the model's {cfg.max_positions} positions")
        x = (
            self.word_embeddings[input_ids]
            + self.position_embeddings[:seq][None]
            + self.token_type_embeddings[0]
        )
        x = layer_norm(xp, x, self.embed_norm_w, self.embed_norm_b, cfg.layer_norm_eps).reshape(
            batch * seq, -1
        )
        # Additive key mask: padded keys get a large negative score, so softmax gives them ~0.
        key_bias = ((1.0 - attention_mask.astype(xp.float32)) * -1e9)[:, None, None, :]
        for layer in self.layers:
            x = self._layer_forward(layer, x, key_bias, batch, seq)
        return x.reshape(batch, seq, cfg.hidden_size)

    def _layer_forward(self, w: BertLayerWeights, x: Array, key_bias: Array, batch: int, seq: int) -> Array:
        xp, cfg = self.xp, self.config
        heads, head_dim = cfg.num_heads, cfg.head_dim
        qkv = (x @ w.qkv_w + w.qkv_b).reshape(batch, seq, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each [batch, heads, seq, head_dim]
        scores = (q * (1.0 / math.sqrt(head_dim))) @ k.transpose(0, 1, 3, 2)
        scores += key_bias
        context = (
            (softmax_inplace(xp, scores) @ v).transpose(0, 2, 1, 3).reshape(batch * seq, cfg.hidden_size)
        )
        x = layer_norm(
            xp, x + context @ w.attn_out_w + w.attn_out_b, w.attn_norm_w, w.attn_norm_b, cfg.layer_norm_eps
        )
        inner = gelu(xp, x @ w.ffn_in_w + w.ffn_in_b, self._gelu_kind)
        return layer_norm(
            xp, x + inner @ w.ffn_out_w + w.ffn_out_b, w.ffn_norm_w, w.ffn_norm_b, cfg.layer_norm_eps
        )


class _TensorTaker:
    """Fetches checkpoint tensors by `BertModel` name, checks shapes, moves them to `xp` as float32."""

    def __init__(self, tensors: dict[str, np.ndarray], xp: Any) -> None:
        prefixed = any(name.startswith("bert.") for name in tensors)
        self._tensors = {name.removeprefix("bert.") if prefixed else name: t for name, t in tensors.items()}
        self._xp = xp

    def __call__(self, name: str, shape: tuple[int, ...], transpose: bool = False) -> Array:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ValueError(f"checkpoint has no tensor {name!r} (is it a BERT model?)")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, config implies {shape}")
        host = np.ascontiguousarray(tensor.T if transpose else tensor, dtype=np.float32)
        return self._xp.asarray(host)
