"""Experts beside the dense MLP (Gemma 4's 26B-A4B): every layer runs its MLP and a mixture of experts on
the same residual stream, each output normalised on its own before the two are added.

The router reads the stream's unscaled RMS norm (its learned input scale and 1/sqrt(hidden) are folded
into its projection by models/gemma4.py); the experts read the stream through a norm of their own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.layers.moe import MoE
from app.engine.layers.norm import RMSNorm
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES


class ExpertsBesideMlp:
    def __init__(self, backend: Any, cfg: Any, tensors: dict[str, QuantizedTensor], prefix: str) -> None:
        eps = cfg.rms_norm_eps
        self.backend, self.eps = backend, eps
        self.mlp_norm = RMSNorm(backend, tensors[f"{prefix}.post_ffw_norm_1.weight"], eps)
        self.experts_in_norm = RMSNorm(backend, tensors[f"{prefix}.pre_ffw_norm_2.weight"], eps)
        self.experts_out_norm = RMSNorm(backend, tensors[f"{prefix}.post_ffw_norm_2.weight"], eps)
        self.experts = MoE(backend, tensors, prefix, cfg.moe)
        ones = np.ones(cfg.hidden_size, np.float32)
        self.unscaled = backend.load_weight(
            QuantizedTensor.from_float(f"{prefix}.router_norm", ones, QUANT_TYPES["F32"])
        )

    @property
    def syncs_host(self) -> bool:
        return self.experts.syncs_host

    def __call__(self, mlp_out: Any, stream: Any) -> Any:
        """The MLP's output `[T, hidden]` plus the experts' over the residual `stream`, each normalised."""
        # the router's input and the experts': one norm of the stream under two weights
        router_input, experts_in = self.backend.rms_norm_pair(
            stream, self.unscaled, self.experts_in_norm.weight, self.eps
        )
        experts = self.experts(experts_in, router_input=router_input)
        return self.experts_out_norm.join(experts, self.mlp_norm(mlp_out))  # the second norm and the sum: one launch
