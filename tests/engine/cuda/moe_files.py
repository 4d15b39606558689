"""The input files of the SIMT-emulator harness host/moe_main.cpp, written from a MoE layer's GGUF tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.engine.quant.dispatch import QuantizedTensor


def write_moe_inputs(folder: Path, tensors: dict[str, QuantizedTensor], prefix: str, x: np.ndarray,
                     logits: np.ndarray, score_bias: np.ndarray | None) -> None:  # fmt: skip
    """x.bin, logits.bin, score_bias.bin (where given), the stacked gate/up/down weights and biases present in
    `tensors` (`<prefix>.ffn_<part>_exps.weight|bias`), and expert_scale.bin from `ffn_down_exps.scale`."""
    (folder / "x.bin").write_bytes(x.astype(np.float32).tobytes())
    (folder / "logits.bin").write_bytes(logits.astype(np.float32).tobytes())
    if score_bias is not None:
        (folder / "score_bias.bin").write_bytes(np.asarray(score_bias, np.float32).tobytes())
    for part in ("gate", "up", "down"):
        weight = tensors.get(f"{prefix}.ffn_{part}_exps.weight")
        if weight is not None:
            (folder / f"{part}.bin").write_bytes(weight.data.tobytes())
        bias = tensors.get(f"{prefix}.ffn_{part}_exps.bias")
        if bias is not None:
            (folder / f"{part}_bias.bin").write_bytes(bias.dequantize().tobytes())
    scale = tensors.get(f"{prefix}.ffn_down_exps.scale")
    if scale is not None:
        (folder / "expert_scale.bin").write_bytes(scale.dequantize().astype(np.float32).tobytes())
