"""Granite Speech's audio tensors from a Hugging Face folder: the conformer (`encoder.*`) and the Q-Former
projector (`projector.*`), as the hub's folders and transformers 5's save_pretrained name them (or with
transformers 5's in-memory `model.` prefix), checked against the config's sizes."""

from __future__ import annotations

from pathlib import Path

from app.engine.loader.names import CheckpointError
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.models.audio.granite_speech_config import GraniteSpeechAudioConfig
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
_PARTS = ("encoder.", "projector.")
_BATCH_NORM = ("weight", "bias", "running_mean", "running_var")


def load_granite_speech_audio(folder: Path, cfg: GraniteSpeechAudioConfig) -> Tensors:
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            name = hf_name.removeprefix("model.")
            if name.startswith(_PARTS):
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    check_shapes(folder, tensors, cfg)
    return tensors


def check_shapes(source: Path, tensors: Tensors, cfg: GraniteSpeechAudioConfig, folded: bool = False) -> None:
    """Every tensor the encoder reads is there at its shape; CheckpointError naming `source` and it."""
    for name, shape in expected_shapes(cfg, folded).items():
        found = tensors.get(name)
        if found is None:
            raise CheckpointError(f"{source}: the Granite Speech checkpoint lacks {name}")
        if tuple(found.shape) != shape:
            raise CheckpointError(f"{source}: {name} has shape {list(found.shape)}, the config needs {list(shape)}")


def expected_shapes(c: GraniteSpeechAudioConfig, folded: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor the encoder and projector read, with its shape (biases and norms included); `folded`:
    BatchNorm as an mmproj keeps it, a scale and a shift."""
    d, inner, ff, conv = c.hidden_size, c.num_heads * c.head_dim, c.ff_size, c.conv_size
    shapes: dict[str, tuple[int, ...]] = {
        **_linear("encoder.input_linear", d, c.input_dim),
        **_linear("encoder.out", c.ctc_size, d),
        **_linear("encoder.out_mid", d, c.ctc_size),
        "projector.query": (1, c.queries, c.q_hidden),
        **_norm("projector.qformer.layernorm", c.q_hidden),
        **_linear("projector.linear", c.output_dim, c.q_hidden),
    }
    for i in range(c.num_layers):
        p = f"encoder.layers.{i}"
        for ffn in ("ff1", "ff2"):
            shapes.update({**_norm(f"{p}.{ffn}.pre_norm", d), **_linear(f"{p}.{ffn}.up_proj", ff, d),
                           **_linear(f"{p}.{ffn}.down_proj", d, ff)})  # fmt: skip
        shapes.update({
            **_norm(f"{p}.attn.pre_norm", d), f"{p}.attn.to_q.weight": (inner, d),
            f"{p}.attn.to_kv.weight": (2 * inner, d), **_linear(f"{p}.attn.to_out", d, inner),
            f"{p}.attn.rel_pos_emb.weight": (2 * c.max_pos_emb + 1, c.head_dim),
            **_norm(f"{p}.conv.norm", d), f"{p}.conv.up_conv.weight": (2 * conv, d, 1), f"{p}.conv.up_conv.bias": (2 * conv,),
            f"{p}.conv.depth_conv.conv.weight": (conv, 1, c.conv_kernel_size),
            **{f"{p}.conv.batch_norm.{k}": (conv,) for k in (("scale", "shift") if folded else _BATCH_NORM)},
            f"{p}.conv.down_conv.weight": (d, conv, 1), f"{p}.conv.down_conv.bias": (d,),
            **_norm(f"{p}.post_norm", d),
        })  # fmt: skip
    for i in range(c.q_layers):
        p = f"projector.qformer.encoder.layer.{i}"
        parts = ["attention"] + (["crossattention"] if i % c.q_cross_every == 0 else [])
        for part in parts:
            width = c.hidden_size if part == "crossattention" else c.q_hidden
            shapes.update({
                **_linear(f"{p}.{part}.attention.query", c.q_hidden, c.q_hidden),
                **_linear(f"{p}.{part}.attention.key", c.q_hidden, width),
                **_linear(f"{p}.{part}.attention.value", c.q_hidden, width),
                **_linear(f"{p}.{part}.output.dense", c.q_hidden, c.q_hidden),
                **_norm(f"{p}.{part}.output.LayerNorm", c.q_hidden),
            })  # fmt: skip
        shapes.update({**_linear(f"{p}.intermediate_query.dense", c.q_ff, c.q_hidden),
                       **_linear(f"{p}.output_query.dense", c.q_hidden, c.q_ff),
                       **_norm(f"{p}.output_query.LayerNorm", c.q_hidden)})  # fmt: skip
    return shapes


def _linear(name: str, out: int, width: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (out, width), f"{name}.bias": (out,)}


def _norm(name: str, width: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (width,), f"{name}.bias": (width,)}
