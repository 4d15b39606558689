"""`--experts-on-gpu`: a mixture of experts with only a hot set on the GPU, as the fit plans it.

Checked by hand arithmetic on a synthetic shape, and on the Qwen3-MoE fixture GGUF, whose expert
bytes are summed independently here from gguf-py's reader.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from app.cli import main as paddock
from app.engine.config import parse_experts_on_gpu
from app.engine.plan.device import GiB
from app.engine.plan.fit import (
    PREDICTION_MARGIN,
    DeviceMemory,
    FitOptions,
    ModelShape,
    check_fit,
    shape_from_checkpoint,
)
from app.engine.plan.memory import CUDA_RUNTIME_OVERHEAD_BYTES

QWEN3MOE = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3moe" / "qwen3moe-q8_0-q4_0.gguf"
# 48 layers x 128 experts of 1 MiB, 8 used per token, plus 2 GiB of everything else.
EXPERT = 1 << 20
MOE = ModelShape("qwen3moe", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
                 intermediate_size=8 * 768, vocab_size=151936, context_length=4096,
                 weight_bytes=2 * GiB + 48 * 128 * EXPERT, num_experts=128, experts_used=8,
                 expert_bytes=48 * 128 * EXPERT)  # fmt: skip


def gpu(free: int) -> DeviceMemory:
    return DeviceMemory("cuda", "Test GPU", free, free)


def test_a_fixed_hot_set_moves_the_cold_experts_to_host_ram():
    options = FitOptions(context_length=1024, experts_on_gpu=32)
    every = check_fit(MOE, FitOptions(context_length=1024), gpu(80 * GiB)).breakdown
    some = check_fit(MOE, options, gpu(80 * GiB)).breakdown
    assert every.experts_on_gpu is None and every.host_experts == 0
    assert some.experts_on_gpu == 32
    assert some.host_experts == 48 * 96 * EXPERT
    assert some.weights == every.weights - 48 * 96 * EXPERT
    assert some.expert_staging == 48 * 8 * EXPERT  # k staging slots per layer
    assert some.total == every.total - 48 * 96 * EXPERT + 48 * 8 * EXPERT
    # uniform routing: each of 48 x 8 picks is cold with probability 96/128
    assert some.pcie_bytes_per_token == pytest.approx(48 * 8 * 96 / 128 * EXPERT)
    assert check_fit(MOE, FitOptions(context_length=1024, experts_on_gpu=0), gpu(80 * GiB)).breakdown.weights == 2 * GiB


def test_auto_takes_the_largest_hot_set_that_fits():
    device = gpu(5 * GiB)
    report = check_fit(MOE, FitOptions(context_length=1024, experts_on_gpu="auto"), device)
    chosen = report.breakdown.experts_on_gpu
    assert chosen is not None and 0 < chosen < 128
    allowed = (1 - PREDICTION_MARGIN) * report.budget_bytes
    assert report.breakdown.total <= allowed
    bigger = check_fit(MOE, FitOptions(context_length=1024, experts_on_gpu=chosen + 1), device).breakdown
    assert bigger.total > allowed
    roomy = check_fit(MOE, FitOptions(context_length=1024, experts_on_gpu="auto"), gpu(80 * GiB))
    assert roomy.breakdown.experts_on_gpu is None  # everything fits: nothing offloaded
    assert roomy.breakdown.total - roomy.breakdown.weights >= CUDA_RUNTIME_OVERHEAD_BYTES


def test_offloading_lengthens_the_context_that_fits():
    device = gpu(9 * GiB)
    full = check_fit(MOE, FitOptions(), device).max_context
    half = check_fit(MOE, FitOptions(experts_on_gpu=64), device).max_context
    assert half > full


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="more than the model's 128 experts"):
        check_fit(MOE, FitOptions(experts_on_gpu=129), gpu(GiB))
    with pytest.raises(ValueError, match="at least 0"):
        FitOptions(experts_on_gpu=-1)
    with pytest.raises(ValueError, match="'auto' or 'all'"):
        parse_experts_on_gpu("half")
    dense = replace(MOE, num_experts=0, experts_used=0, expert_bytes=0)
    with pytest.raises(ValueError, match="has no experts"):
        check_fit(dense, FitOptions(experts_on_gpu=4), gpu(GiB))
    assert check_fit(dense, FitOptions(experts_on_gpu="auto"), gpu(GiB)).breakdown.experts_on_gpu is None


def test_expert_bytes_of_a_checkpoint_are_its_expert_tensors():
    shape = shape_from_checkpoint(QWEN3MOE)
    reader = gguf.GGUFReader(str(QWEN3MOE))
    expected = sum(int(t.n_bytes) for t in reader.tensors if "_exps" in t.name)
    assert (shape.num_experts, shape.experts_used, shape.expert_bytes) == (6, 2, expected)


def test_paddock_fit_reports_the_plan(capsys):
    assert paddock(["fit", str(QWEN3MOE), "--experts-on-gpu", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["breakdown"]["experts_on_gpu"] == 2
    assert report["breakdown"]["host_experts"] == 4 * report["shape"]["expert_bytes"] // 6
    assert paddock(["fit", str(QWEN3MOE), "--experts-on-gpu", "2"]) == 0
    assert "2 per layer on the GPU" in capsys.readouterr().out
    assert paddock(["fit", str(QWEN3MOE), "--experts-on-gpu", "7"]) == 2
    assert "more than the model's 6 experts" in capsys.readouterr().err
