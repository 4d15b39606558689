"""Per-layer input embeddings (Gemma 4's PLE, the E-series): a second, narrow embedding of every token for
each layer, mixed with a projection of the token's main embedding, and folded into the residual stream
after each layer's feed-forward through a small gated bottleneck.

Computed once per step (`PerLayerInputs`: `[T, layers, size]`); each layer then runs `LayerInputGate`:
`stream + norm(proj(gelu(gate(stream)) * inputs[:, layer]))`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.layers.embedding import Embedding
from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.quant.dispatch import QuantizedTensor

INPUT_MIX = np.float32(2.0**-0.5)  # the token and projection parts are averaged in RMS


class PerLayerInputs:
    """`(token_ids [T], embeddings [T, hidden]) -> [T, num_layers, size]`: each token's per-layer inputs.
    `embeddings` are what the decoder starts from: the scaled main embeddings, with an image's (or audio's)
    soft tokens already in place at `soft_rows`, whose token part is the pad token's (`pad_id`), as
    transformers' Gemma4Model looks them up."""

    def __init__(
        self,
        backend: Any,
        tensors: dict[str, QuantizedTensor],
        num_layers: int,
        size: int,
        eps: float,
        pad_id: int = 0,
    ) -> None:
        self.backend, self.num_layers, self.size, self.pad_id = backend, num_layers, size, pad_id
        self.embed = Embedding(backend, tensors["per_layer_token_embd.weight"], math.sqrt(size))
        self.projection = Linear(backend, tensors["per_layer_model_proj.weight"])
        self.norm = RMSNorm(backend, tensors["per_layer_proj_norm.weight"], eps)
        self.projection_scale = np.float32(tensors["per_layer_model_proj.weight"].shape[1] ** -0.5)

    def __call__(self, token_ids: Any, embeddings: Any, soft_rows: Any = None) -> Any:
        n = embeddings.shape[0]
        if soft_rows is not None:
            token_ids = token_ids.copy()
            token_ids[soft_rows] = self.pad_id
        projected = self.projection(embeddings) * self.projection_scale
        projected = self.norm(projected.reshape(n, self.num_layers, self.size))
        tokens = self.embed(token_ids).reshape(n, self.num_layers, self.size)
        return (projected + tokens) * INPUT_MIX


class LayerInputGate:
    """One layer's use of its per-layer input: `stream + norm(proj(gelu(gate(stream)) * inputs))`."""

    def __init__(self, backend: Any, tensors: dict[str, QuantizedTensor], prefix: str, eps: float) -> None:
        self.backend = backend
        self.gate = Linear(backend, tensors[f"{prefix}.inp_gate.weight"])
        self.projection = Linear(backend, tensors[f"{prefix}.proj.weight"])
        self.norm = RMSNorm(backend, tensors[f"{prefix}.post_norm.weight"], eps)

    def __call__(self, stream: Any, inputs: Any) -> Any:
        gate = self.gate(stream)
        # gelu_tanh(gate) * inputs, as the backend's gated activation computes it
        gated = self.backend.gated_activation(gate, inputs.astype(gate.dtype, copy=False), "gelu_tanh")
        return stream + self.norm(self.projection(gated))
