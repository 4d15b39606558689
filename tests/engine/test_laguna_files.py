"""Laguna files beyond parity: what will-it-fit predicts for them (per-layer head counts, sparse layers'
experts), and corrupt, truncated or lying Laguna files refused in one line naming the file and what is
wrong. The HF folders are tests/fixtures/laguna's; the GGUFs are written from them (laguna_gguf.py) and
edited with tests/engine/gguf_forge.py."""

from __future__ import annotations

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
from laguna_gguf import write_gguf

from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import model_config
from app.engine.plan.fit import shape_from_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "laguna"


@pytest.fixture(scope="module")
def xs_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("laguna-files") / "laguna-xs.gguf"
    write_gguf(FIXTURES / "xs", out)
    return out


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_fit_counts_the_largest_layers_heads_and_predicts_the_engines_blocks(
    source: str, xs_gguf: Path
) -> None:
    path = FIXTURES / "xs" if source == "hf" else xs_gguf
    shape = shape_from_checkpoint(path)
    cfg = model_config(open_checkpoint(path))
    # the sliding layers' 8 query heads (not num_attention_heads' 4) size the activations; 2 KV heads of 16
    # in each of the 4 layers size the KV pool; the sparse layers' experts are counted as experts
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.num_layers) == (8, 2, 16, 4)
    assert shape.kv_bytes_per_token(2) == 4 * 2 * 2 * 16 * 2
    assert (shape.num_experts, shape.experts_used) == (4, 2) and shape.expert_bytes > 0
    assert cfg.layer_num_heads == (4, 8, 8, 8)
    fit_predicts_the_engines_blocks(path)


CONFIG_CASES = {
    "per-layer heads of the wrong length": (
        {"num_attention_heads_per_layer": [4, 8]},
        "config.json num_attention_heads_per_layer must list one entry per layer (4)",
    ),
    "per-layer heads not a multiple of the KV heads": (
        {"num_attention_heads_per_layer": [4, 8, 7, 8]},
        "layer 2's 7 heads do not divide into 2 KV heads",
    ),
    "an unknown MLP kind": (
        {"mlp_layer_types": ["dense", "sparse", "dense", "moe"]},
        "mlp_layer_types has ['moe']",
    ),
    "an unknown gate kind": ({"gating": "per-token"}, "config.json gating is 'per-token'"),
    "router weights on the input": (
        {"moe_apply_router_weight_on_input": True},
        "moe_apply_router_weight_on_input",
    ),
    "heads that do not match q_proj": (
        {"num_attention_heads_per_layer": [4, 4, 8, 8]},
        "tensor 'blk.1.attn_q.weight' has shape (128, 64)",
    ),
}


@pytest.mark.parametrize("case", CONFIG_CASES, ids=list(CONFIG_CASES))
def test_a_lying_config_json_is_refused_naming_the_folder_and_the_key(
    case: str, tmp_path: Path, capsys
) -> None:
    changes, message = CONFIG_CASES[case]
    folder = edited_copy(FIXTURES / "xs", tmp_path, **changes)
    err = refusal(folder, capsys)
    assert message in err and str(folder) in err


def test_a_truncated_safetensors_file_is_refused(tmp_path: Path, capsys) -> None:
    folder = edited_copy(FIXTURES / "xs", tmp_path)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    err = refusal(folder, capsys)
    assert "truncated or corrupt" in err and str(path) in err


def test_a_truncated_gguf_is_refused(xs_gguf: Path, tmp_path: Path, capsys) -> None:
    truncated_ggufs_are_refused(xs_gguf, tmp_path, capsys)


GGUF_CASES = {
    "head counts of the wrong length": (
        lambda f: f.metadata.__setitem__("laguna.attention.head_count", [4, 8, 8]),
        "laguna.attention.head_count must list one entry per layer (4)",
    ),
    "a leading dense count past the layers": (
        lambda f: f.metadata.__setitem__("laguna.leading_dense_block_count", 9),
        "laguna.leading_dense_block_count is 9 of 4 layers",
    ),
    "softmax expert gating": (
        lambda f: f.metadata.__setitem__("laguna.expert_gating_func", 1),
        "laguna.expert_gating_func is 1",
    ),
    "partial RoPE on sliding layers": (
        lambda f: f.metadata.__setitem__("laguna.rope.dimension_count_swa", 8),
        "laguna.rope.dimension_count_swa is 8",
    ),
    "no shared expert width": (
        lambda f: f.metadata.pop("laguna.expert_shared_feed_forward_length"),
        "metadata has no laguna.expert_shared_feed_forward_length",
    ),
}


@pytest.mark.parametrize("case", GGUF_CASES, ids=list(GGUF_CASES))
def test_a_lying_gguf_header_is_refused_naming_the_file_and_the_key(case: str, xs_gguf: Path, tmp_path: Path,
                                                                    capsys) -> None:  # fmt: skip
    edit, message = GGUF_CASES[case]
    path, err = forged_refusal(xs_gguf, edit, tmp_path, capsys)
    assert message in err and str(path) in err


def test_a_gate_of_neither_width_is_refused_naming_the_tensor(tmp_path: Path, capsys) -> None:
    """A config.json whose gate kind the g_proj tensors do not have."""
    folder = edited_copy(
        FIXTURES / "xs", tmp_path, gating="per-element"
    )  # the file's gates are per head: 4 rows, not 4 x 16
    err = refusal(folder, capsys)
    assert "tensor 'blk.0.attn_gate.weight' has shape (4, 64); a softplus gate of 4 heads of 16" in err
    assert str(folder) in err


def test_a_q8_0_gguf_equals_its_float_values(tmp_path: Path) -> None:
    parity = ParityFixtures(FIXTURES, write_gguf)
    q8_0_gguf_equals_its_floats(parity, "xs", tmp_path, agreement=0.7)  # greedy agreement measured: 0.93


def test_a_backend_without_partial_rope_refuses_laguna_at_load_naming_the_way_out() -> None:
    """A backend that rotates whole heads only: Laguna's full layers (8 of 16 dims here) are refused when
    the model is built, naming the layer and the CPU backend; the CPU backend takes them."""
    from app.engine.backend.cpu import CpuBackend
    from app.engine.models.registry import build_model

    class WholeHeadsOnly(CpuBackend):
        name = "cuda-like"
        supports_partial_rope = False

    with pytest.raises(NotImplementedError, match=r"blk\.0 rotates 8 of 16 dims.*--device cpu"):
        build_model(open_checkpoint(FIXTURES / "xs"), WholeHeadsOnly(), 64)
    assert build_model(open_checkpoint(FIXTURES / "xs"), CpuBackend(), 64).config.rotary_dim == 8
