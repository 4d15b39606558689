"""Muse Glimmer files beyond parity: will-it-fit counts the text model only (the engine skips the vision
side, so a folder's tower is not counted), and lying or truncated files are refused in one line naming the
file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from family_parity import (
    ParityFixtures,
    edited_copy,
    fit_predicts_the_engines_blocks,
    forged_refusal,
    q8_0_gguf_equals_its_floats,
    refusal,
    truncated_ggufs_are_refused,
)
from muse_glimmer_gguf import write_gguf

from app.engine.loader.weights import open_checkpoint
from app.engine.plan.fit import shape_from_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "muse_glimmer"


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("muse-files") / "muse-glimmer-base.gguf"
    write_gguf(FIXTURES / "base", out)
    return out


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_fit_counts_the_text_model_and_predicts_the_engines_blocks(source: str, base_gguf: Path) -> None:
    path = FIXTURES / "base" if source == "hf" else base_gguf
    shape = shape_from_checkpoint(path)
    # the folder's tower, adapter and projection count as its vision line; a GGUF's would be its mmproj's
    assert (shape.vision is not None) == (source == "hf")
    # the text model's tensors only: the tower, adapter and projection are not counted among them
    assert shape.weight_bytes == sum(t.nbytes for t in open_checkpoint(path).tensors.values())
    assert not any(n.startswith(("v.", "mm.")) for n in open_checkpoint(path).tensors)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (6, 2, 16)
    fit_predicts_the_engines_blocks(path)


CONFIG_CASES = {
    "layer_rope_theta of the wrong length": (
        {"layer_rope_theta": [0, 1]},
        "config.json layer_rope_theta must list",
    ),
    "an output multiplier of 0": ({"output_multiplier": 0}, "config.json output_multiplier is 0"),
    "a negative post-norm epsilon": ({"post_norm_eps": -1.0}, "config.json post_norm_eps is -1.0"),
    "no sliding window": ({"sliding_window": None}, "config.json sliding_window is None"),
    "a gelu MLP": ({"hidden_activation": "gelu"}, "config.json hidden_activation is 'gelu'"),
    "a hidden size the embedding does not have": ({"hidden_size": 96}, "config.json hidden_size is 96"),
}


@pytest.mark.parametrize("case", CONFIG_CASES, ids=list(CONFIG_CASES))
def test_a_lying_config_json_is_refused_naming_the_folder_and_the_key(
    case: str, tmp_path: Path, capsys
) -> None:
    changes, message = CONFIG_CASES[case]
    folder = edited_copy(FIXTURES / "base", tmp_path, "text_config", **changes)
    err = refusal(folder, capsys)
    assert message in err and str(folder) in err


def test_a_gate_projection_of_the_wrong_width_is_refused(tmp_path: Path, capsys) -> None:
    """The sigmoid gate is per element: a g_proj of one row per head is refused naming the tensor."""
    folder = edited_copy(FIXTURES / "base", tmp_path)
    path = folder / "model.safetensors"
    raw = bytearray(path.read_bytes())
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    name = "model.language_model.layers.3.self_attn.gate_proj.weight"
    start = header[name]["data_offsets"][0]
    header[name]["shape"] = [4, 64]  # a gate per head: 4 x 64 bf16 = 512 bytes of the 8192 stored
    header[name]["data_offsets"] = [start, start + 4 * 64 * 2]
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (length - len(encoded))
    assert len(encoded) == length
    path.write_bytes(raw[:8] + encoded + raw[8 + length :])
    err = refusal(folder, capsys)
    assert "tensor 'blk.3.attn_gate.weight' has shape (4, 64); a sigmoid gate of 4 heads of 16" in err
    assert str(folder) in err


def test_a_truncated_gguf_is_refused(base_gguf: Path, tmp_path: Path, capsys) -> None:
    truncated_ggufs_are_refused(base_gguf, tmp_path, capsys)


GGUF_CASES = {
    "no logit scale": (
        lambda f: f.metadata.pop("muse-glimmer.logit_scale"),
        "metadata has no muse-glimmer.logit_scale",
    ),
    "a sliding pattern of the wrong length": (
        lambda f: f.metadata.__setitem__("muse-glimmer.attention.sliding_window_pattern", [True, False]),
        "muse-glimmer.attention.sliding_window_pattern lists 2 layers, not 6",
    ),
    "a logit scale of 0": (
        lambda f: f.metadata.__setitem__("muse-glimmer.logit_scale", 0.0),
        "muse-glimmer.logit_scale is 0.0",
    ),
    "no sliding window": (
        lambda f: f.metadata.pop("muse-glimmer.attention.sliding_window"),
        "metadata has no muse-glimmer.attention.sliding_window",
    ),
}


@pytest.mark.parametrize("case", GGUF_CASES, ids=list(GGUF_CASES))
def test_a_lying_gguf_header_is_refused_naming_the_file_and_the_key(
    case: str, base_gguf: Path, tmp_path: Path, capsys
) -> None:
    edit, message = GGUF_CASES[case]
    path, err = forged_refusal(base_gguf, edit, tmp_path, capsys)
    assert message in err and str(path) in err


def test_a_q8_0_gguf_equals_its_float_values(tmp_path: Path) -> None:
    parity = ParityFixtures(FIXTURES, write_gguf)
    q8_0_gguf_equals_its_floats(parity, "base", tmp_path, agreement=0.7)  # greedy agreement measured: 0.78
