"""A parsed `ModelConfig` checked against the tensors it describes, before any weight is used.

A header that lies (a wrong `embedding_length`, a `block_count` of 1e6, a tensor count that
dropped the last blocks) would otherwise surface as a KeyError or a shape error deep in model
building, or as garbage output. Each check names the config key and the tensor that disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from app.engine.loader.names import CheckpointError
from app.engine.models.config import FFN_DENSE, FFN_MOE, MIXER_ATTENTION, UNGATED_ACTIVATIONS, ModelConfig
from app.engine.quant.dispatch import QuantizedTensor

_BLOCK = re.compile(r"blk\.(\d+)\.")
# Per block, the projections every family has, each dimension a product of ModelConfig fields.
_BLOCK_SHAPES: dict[str, tuple[tuple[str, ...], ...]] = {
    "attn_q": (("num_heads", "head_dim"), ("hidden_size",)),
    "attn_k": (("num_kv_heads", "head_dim"), ("hidden_size",)),
    "attn_v": (("num_kv_heads", "head_dim"), ("hidden_size",)),
    "attn_output": (("hidden_size",), ("num_heads", "head_dim")),
    "ffn_gate": (("intermediate_size",), ("hidden_size",)),
    "ffn_up": (("intermediate_size",), ("hidden_size",)),
    "ffn_down": (("hidden_size",), ("intermediate_size",)),
    "ffn_gate_up": (("intermediate_size",), ("hidden_size",)),  # gate rows, then up rows (doubled below)
}


def check_against_tensors(
    cfg: ModelConfig, tensors: dict[str, QuantizedTensor], key: Callable[[str], str]
) -> None:
    """Raise CheckpointError where the config and the tensors disagree; `key(field)` names a
    ModelConfig field in the checkpoint's own terms (`gemma3.embedding_length`, `config.json hidden_size`)."""
    embedding = tensors["token_embd.weight"]
    if embedding.shape != (cfg.vocab_size, cfg.hidden_size):
        raise CheckpointError(
            f"{key('hidden_size')} is {cfg.hidden_size} and {key('vocab_size')} is {cfg.vocab_size}, "
            f"but tensor 'token_embd.weight' has shape {embedding.shape}"
        )
    _check_blocks(cfg, tensors, key)
    for name in ("output.weight", "output_norm.weight"):
        tensor = tensors.get(name)
        wanted = (cfg.vocab_size, cfg.hidden_size) if name == "output.weight" else (cfg.hidden_size,)
        if tensor is not None and tensor.shape != wanted:
            raise CheckpointError(f"tensor {name!r} has shape {tensor.shape}; the config makes it {wanted}")
    if cfg.layer_sliding and len(cfg.layer_sliding) != cfg.num_layers:
        raise CheckpointError(
            f"{key('num_layers')} is {cfg.num_layers}, but the sliding-window pattern lists "
            f"{len(cfg.layer_sliding)} layers"
        )


def _check_blocks(cfg: ModelConfig, tensors: dict[str, QuantizedTensor], key: Callable[[str], str]) -> None:
    blocks = {int(m.group(1)) for name in tensors if (m := _BLOCK.match(name))}
    if blocks != set(range(cfg.num_layers + cfg.trailing_blocks)):
        present = f"blocks 0..{max(blocks)}" if blocks else "no blocks"
        missing = sorted(set(range(cfg.num_layers)) - blocks)[:1]
        detail = f" (blk.{missing[0]} is missing)" if missing else ""
        raise CheckpointError(
            f"{key('num_layers')} is {cfg.num_layers}, but the file has tensors for {len(blocks)} "
            f"{present}{detail}: a corrupt block count or tensor count?"
        )
    for layer in range(cfg.num_layers):
        values = {
            "hidden_size": cfg.hidden_size,
            "num_heads": cfg.heads_of(layer),
            "num_kv_heads": cfg.kv_heads_of(layer),
            "head_dim": cfg.head_dim_of(layer),
            "intermediate_size": cfg.intermediate_of(layer),
        }
        for part in _layer_parts(cfg, layer, tensors):
            spec = _BLOCK_SHAPES[part]
            wanted = tuple(math.prod(values[f] for f in dim) for dim in spec)
            if part == "attn_q" and cfg.attn_output_gate:  # each head's query and its output gate
                wanted = (2 * wanted[0], wanted[1])
            if part == "ffn_gate_up":  # Granite 4 hybrid folders: one tensor, split where the model is built
                wanted = (2 * wanted[0], wanted[1])
            name = f"blk.{layer}.{part}.weight"
            tensor = tensors.get(name)
            if tensor is None:
                raise CheckpointError(f"tensor {name!r} is missing")
            if tensor.shape != wanted:
                fields = ", ".join(f"{key(f)} = {values[f]}" for f in dict.fromkeys(sum(spec, ())))
                raise CheckpointError(
                    f"tensor {name!r} has shape {tensor.shape}, but {fields} make it {wanted}"
                )
        if cfg.gate_proj is not None and cfg.mixer(layer) == MIXER_ATTENTION:
            _check_gate(cfg, tensors, layer)
    if cfg.moe is not None:
        _check_routers(cfg, tensors)


def _check_gate(cfg: ModelConfig, tensors: dict[str, QuantizedTensor], layer: int) -> None:
    """An output gate's projection: a row per head, or per head and dim (`ModelConfig.gate_rows_per_head`)."""
    name, heads = f"blk.{layer}.attn_gate.weight", cfg.heads_of(layer)
    rows = heads * cfg.gate_rows_per_head
    gate = tensors.get(name)
    if gate is None:
        raise CheckpointError(f"tensor {name!r} (the attention output gate) is missing")
    if gate.shape != (rows, cfg.hidden_size):
        raise CheckpointError(
            f"tensor {name!r} has shape {gate.shape}; a {cfg.gate_proj} gate of {heads} heads "
            f"of {cfg.head_dim_of(layer)} makes it {(rows, cfg.hidden_size)}"
        )


def _layer_parts(cfg: ModelConfig, layer: int, tensors: dict[str, QuantizedTensor]) -> list[str]:
    """The projections layer `layer` must have: attention's (a layer reading another's KV has no k/v;
    one whose values are its keys has no v), and the dense MLP's unless experts replace it (no gate for
    an ungated activation; gate and up as one tensor where the file fuses them)."""
    parts = []
    if cfg.mixer(layer) == MIXER_ATTENTION:
        parts += ["attn_q", "attn_output"]
        if cfg.kv_source(layer) == layer:
            parts.append("attn_k")
            if not (cfg.layer_values_from_keys and cfg.layer_values_from_keys[layer]):
                parts.append("attn_v")
    if cfg.ffn(layer) == FFN_DENSE:
        if f"blk.{layer}.ffn_gate_up.weight" in tensors:
            parts += ["ffn_gate_up", "ffn_down"]
        elif cfg.activation in UNGATED_ACTIVATIONS:  # down(act(up(x))): no gate
            parts += ["ffn_up", "ffn_down"]
        else:
            parts += ["ffn_gate", "ffn_up", "ffn_down"]
    return parts


def _check_routers(cfg: ModelConfig, tensors: dict[str, QuantizedTensor]) -> None:
    moe = cfg.moe
    assert moe is not None
    if not 1 <= moe.num_used <= moe.num_experts:
        raise CheckpointError(f"{moe.num_used} experts used per token of {moe.num_experts}: not a real model")
    for layer in range(cfg.num_layers):
        if cfg.ffn(layer) != FFN_MOE:
            continue
        name = f"blk.{layer}.ffn_gate_inp.weight"
        router = tensors.get(name)
        if router is None:
            raise CheckpointError(f"tensor {name!r} (the expert router) is missing")
        if router.shape != (moe.num_experts, cfg.hidden_size):
            raise CheckpointError(
                f"tensor {name!r} has shape {router.shape}, but {moe.num_experts} experts of hidden size "
                f"{cfg.hidden_size} make it {(moe.num_experts, cfg.hidden_size)}"
            )
