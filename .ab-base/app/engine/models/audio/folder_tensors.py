"""An audio tower's tensors out of a Hugging Face folder: those under given name prefixes (with or
without transformers 5's `model.`), renamed to ours, then checked against the shapes the config needs,
errors naming the folder and the tensor by its Hugging Face name (or, for an mmproj GGUF, by its name there)."""

from __future__ import annotations

from collections.abc import Callable
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

    def hf_name(name: str) -> str:
        return "model." + next(h + name[len(ours) :] for h, ours in prefixes.items() if name.startswith(ours))

    check_named_shapes(folder, tensors, shapes, hf_name, f"the {what} lacks", "the config needs")


def check_named_shapes(
    source: Path,
    tensors: Tensors,
    shapes: dict[str, tuple[int, ...]],
    stored_name: Callable[[str], str],
    lacks: str,
    needs: str,
) -> None:
    """`check_shapes` for tensors from any file (an mmproj GGUF too): errors name `source` and the tensor as
    it is stored there (`stored_name` of ours), e.g. `{source}: {lacks} a.blk.1.ffn_down.weight`."""
    for name, shape in shapes.items():
        found = tensors.get(name)
        if found is None:
            raise CheckpointError(f"{source}: {lacks} {stored_name(name)}")
        if tuple(found.shape) != shape:
            raise CheckpointError(f"{source}: {stored_name(name)} has shape {list(found.shape)}, {needs} {list(shape)}")
