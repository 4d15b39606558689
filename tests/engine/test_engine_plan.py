"""`resolve -> EnginePlan`: each "auto" decided once, on the CPU and, from the figures a CUDA backend
would report, on the GPU (no GPU needed: the plan is integers)."""

from __future__ import annotations

import logging
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from app.engine.config import EngineConfig
from app.engine.plan.device import DeviceMemory, GiB
from app.engine.plan.engine_plan import experts_on_device, resolve, weight_cache_mode
from app.engine.plan.fit import FitOptions, ModelShape, check_fit
from app.engine.plan.memory import activation_bytes, kv_block_bytes

QWEN3 = ModelShape("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 600 << 20)  # a 0.6B shape
MOE = replace(QWEN3, architecture="qwen3moe", num_experts=128, experts_used=8, expert_bytes=400 << 20,
              intermediate_size=8 * 768)  # fmt: skip
GPU = DeviceMemory("cuda", "test GPU", 20 * GiB, 24 * GiB)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"


def test_cuda_blocks_come_from_the_free_memory_after_the_weights() -> None:
    config = EngineConfig(max_model_len=4096, max_num_seqs=4)
    free_after_load = 1 * GiB
    plan = resolve(config, QWEN3, GPU, "cuda", free_after_load)
    room = int(free_after_load * 0.90) - activation_bytes(QWEN3, 2048, 4)
    block = kv_block_bytes(QWEN3, 16, "float16")
    assert plan.num_blocks == min(4 * 4096 // 16 + 1, room // block)
    assert (plan.kv_dtype, plan.graphs, plan.prefill_graphs, plan.async_decode) == (
        "float16",
        True,
        True,
        True,
    )
    assert plan.max_model_len == min(4096, (plan.num_blocks - 1) * 16)


def test_cuda_blocks_are_the_ones_fit_predicts_when_the_weights_took_what_the_plan_counts(caplog) -> None:
    """The GPU count is `paddock fit`'s from the reading before the weights; the reading after them only caps
    it (with a warning) when loading took more than the plan counts."""
    big = EngineConfig(max_model_len=40960, max_num_seqs=256)  # more than the GPU holds: the room decides
    assert check_fit(QWEN3, FitOptions.from_engine(big), GPU).kv_blocks < 256 * 40960 // 16 + 1
    for config in (big, EngineConfig(max_model_len=8192)):
        report = check_fit(QWEN3, FitOptions.from_engine(config), GPU)
        as_planned = GPU.free_bytes - QWEN3.weight_bytes - (512 << 20)  # weights and a CUDA context
        with caplog.at_level(logging.WARNING):
            plan = resolve(config, QWEN3, GPU, "cuda", as_planned)
        assert (plan.num_blocks, plan.max_model_len) == (report.kv_blocks, report.engine_context)
        assert "more GPU memory than the plan" not in caplog.text
    with caplog.at_level(logging.WARNING):
        capped = resolve(big, QWEN3, GPU, "cuda", 4 * GiB)
    assert capped.num_blocks < check_fit(QWEN3, FitOptions.from_engine(big), GPU).kv_blocks
    assert "more GPU memory than the plan" in caplog.text


def test_a_model_that_reads_the_router_on_the_host_gets_no_graphs(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        plan = resolve(EngineConfig(), QWEN3, GPU, "cuda", GiB, syncs_host=True)
    assert not plan.graphs and not plan.prefill_graphs and not plan.async_decode
    assert "CUDA graphs off" in caplog.text
    assert resolve(EngineConfig(async_decode=True), QWEN3, GPU, "cuda", GiB, syncs_host=True).async_decode


def test_a_hybrid_model_gets_decode_graphs_where_its_recurrent_layers_run_on_the_device(caplog) -> None:
    """Decode graphs hold a hybrid model's step when no layer walks the batch on the host (the Mamba-2
    kernels); its prefill stays eager (the prefill graphs hold no state rows). A layer that walks the
    sequences on the host (syncs_host) keeps every graph off."""
    hybrid = replace(QWEN3, architecture="nemotron_h", state_bytes_per_sequence=4 << 20)
    plan = resolve(EngineConfig(), hybrid, GPU, "cuda", GiB)
    assert (plan.graphs, plan.prefill_graphs, plan.async_decode) == (True, False, True)
    assert plan.state_slots > 0
    with caplog.at_level(logging.WARNING):
        plan = resolve(EngineConfig(), hybrid, GPU, "cuda", GiB, syncs_host=True)
    assert not plan.graphs and not plan.prefill_graphs
    assert "CUDA graphs off" in caplog.text


def test_the_cpu_plan_and_the_prediction_are_one_count() -> None:
    config = EngineConfig(device="cpu", max_model_len=2048, kv_cache_bytes=64 << 20, kv_dtype="fp8")
    plan = resolve(config, QWEN3, DeviceMemory("cpu", "ram", 8 * GiB, 16 * GiB), "cpu")
    report = check_fit(QWEN3, FitOptions.from_engine(config), DeviceMemory("cpu", "ram", 8 * GiB, 16 * GiB))
    assert (plan.num_blocks, plan.max_model_len, plan.kv_dtype) == (
        report.kv_blocks,
        report.engine_context,
        "fp8",
    )
    assert plan.num_blocks == (64 << 20) // kv_block_bytes(QWEN3, 16, "fp8")  # the budget caps it
    with pytest.raises(FrozenInstanceError):
        plan.num_blocks = 3  # type: ignore[misc]


def test_weight_cache_auto_needs_room_to_spare() -> None:
    auto = EngineConfig()
    assert weight_cache_mode(auto, QWEN3, GPU) == "auto"
    assert weight_cache_mode(auto, QWEN3, replace(GPU, free_bytes=2 << 30)) == "off"
    assert (
        weight_cache_mode(EngineConfig(device="cpu"), QWEN3, GPU) == "auto"
    )  # the CPU has no copies to make
    assert weight_cache_mode(EngineConfig(weight_cache="on"), QWEN3, replace(GPU, free_bytes=0)) == "on"


def test_experts_on_the_device() -> None:
    assert experts_on_device(EngineConfig(experts_on_gpu="auto"), MOE, "cuda", GPU) is None  # all fit
    small = replace(GPU, free_bytes=1 * GiB)
    hot = experts_on_device(
        EngineConfig(experts_on_gpu="auto", max_model_len=1024, max_num_seqs=1), MOE, "cuda", small
    )
    assert hot is not None and 0 <= hot < 128
    assert experts_on_device(EngineConfig(experts_on_gpu=16), MOE, "cpu", GPU) == 16
    assert experts_on_device(EngineConfig(experts_on_gpu=128), MOE, "cuda", GPU) is None  # all resident
    with pytest.raises(ValueError, match="more than the model's 128"):
        experts_on_device(EngineConfig(experts_on_gpu=200), MOE, "cuda", GPU)
    with pytest.raises(ValueError, match="qwen3 has no experts"):
        experts_on_device(EngineConfig(experts_on_gpu=4), QWEN3, "cuda", GPU)


def test_the_engine_logs_its_plan_once(caplog) -> None:
    from app.engine.core.engine import LLMEngine

    with caplog.at_level(logging.INFO, logger="app.engine"):
        engine = LLMEngine(
            EngineConfig(model=str(FIXTURE), device="cpu", cpu_kernels="numpy", max_model_len=64)
        )
    plans = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan: ")]
    assert plans == [engine.plan.describe()]
    assert f"{engine.plan.num_blocks} KV blocks of 16 (float32)" in plans[0]
