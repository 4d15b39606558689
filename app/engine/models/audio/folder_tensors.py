"""An audio tower's tensors out of a Hugging Face folder: those under given name prefixes (with or
without transformers 5's `model.`), renamed to ours, then checked against the shapes the config needs,
errors naming the folder and the tensor by its Hugging Face name."""

from __future__ import annotations

from pathlib import Path

from app.engine.loader.names import CheckpointError
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]


def tensors_by_prefix(folder: Path, prefixes: dict[str, str]) -> Tensors:
    """`prefixes`: Hugging Face prefix (after `model.`) -> ours, e.g. `{"audio_tower.": "tower."}`."""
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            bare = hf_name.removeprefix("model.")
            part = next((p for p in prefixes if bare.startswith(p)), None)
            if part is not None:
                name = prefixes[part] + bare[len(part) :]
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    return tensors


def check_shapes(
    folder: Path, tensors: Tensors, shapes: dict[str, tuple[int, ...]], prefixes: dict[str, str], what: str
) -> None:
    """CheckpointError naming the first tensor of `shapes` that `tensors` lacks or holds in another shape."""
    for name, shape in shapes.items():
        found = tensors.get(name)
        hf = "model." + next(h + name[len(ours) :] for h, ours in prefixes.items() if name.startswith(ours))
        if found is None:
            raise CheckpointError(f"{folder}: the {what} lacks {hf}")
        if tuple(found.shape) != shape:
            raise CheckpointError(
                f"{folder}: {hf} has shape {list(found.shape)}, the config needs {list(shape)}"
            )
