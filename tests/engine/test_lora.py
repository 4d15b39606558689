"""loader/lora.py: a PEFT LoRA adapter merged into a Hugging Face checkpoint's weights, `W + s * B @ A`
with PEFT's scaling (alpha / r; alpha / sqrt(r) with use_rslora; alpha_pattern's per-module alpha), on the
Granite Speech fixture's adapter (rank 4, alpha 8, q_proj and v_proj of two layers; tests/engine/audio/
test_granite_speech.py checks the merged model's tokens against transformers + PEFT)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.engine.loader.lora import merge_lora, read_lora_adapter
from app.engine.loader.names import CheckpointError
from app.engine.loader.safetensors import read_safetensors_file
from app.engine.loader.weights import open_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "granite_speech" / "hf"
PEFT = "base_model.model.model.language_model.layers.{}.self_attn.{}.lora_{}.weight"


def _matrices(layer: int, module: str) -> tuple[np.ndarray, np.ndarray]:
    stored = read_safetensors_file(HF / "adapter_model.safetensors")
    return tuple(stored[PEFT.format(layer, module, part)].dequantize() for part in "AB")  # type: ignore[return-value]


def _with_settings(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    shutil.copy(HF / "adapter_model.safetensors", folder)
    settings = json.loads((HF / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**settings, **changes}))
    return folder


@pytest.mark.parametrize(
    ("changes", "q_scale", "v_scale"),
    [({}, 2.0, 2.0), ({"use_rslora": True}, 4.0, 4.0), ({"alpha_pattern": {"v_proj": 16}}, 2.0, 4.0)],
)
def test_merged_weights_are_the_base_plus_the_scaled_product(changes, q_scale, v_scale, tmp_path):
    base = open_checkpoint(HF)
    merged = merge_lora(base, read_lora_adapter(_with_settings(tmp_path, **changes), base.architecture))
    for layer in (0, 1):
        for module, name, scale in (("q_proj", "attn_q", q_scale), ("v_proj", "attn_v", v_scale)):
            a, b = _matrices(layer, module)
            key = f"blk.{layer}.{name}.weight"
            expected = base.tensors[key].dequantize() + scale * (b @ a)
            np.testing.assert_allclose(merged.tensors[key].dequantize(), expected, rtol=0, atol=1e-6)
            assert merged.tensors[key].qtype == base.tensors[key].qtype
    untouched = [n for n in base.tensors if not n.endswith(("attn_q.weight", "attn_v.weight"))]
    assert untouched and all(merged.tensors[n] is base.tensors[n] for n in untouched)


def test_an_adapter_for_a_gguf_is_refused(tmp_path):
    gguf = open_checkpoint(Path(__file__).parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf")
    adapter = read_lora_adapter(HF, "granite")
    with pytest.raises(CheckpointError, match=r"merges into a Hugging Face folder's weights only"):
        merge_lora(gguf, adapter)


def test_adapter_settings_that_are_not_json_are_named(tmp_path):
    folder = _with_settings(tmp_path)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"adapter_config\.json: cannot read the adapter's settings"):
        read_lora_adapter(folder, "granite")
