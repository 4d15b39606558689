"""`--gpu-memory-utilization` and `--kv-blocks`: parsed with errors that name the flag, carried into
EngineConfig by every command that builds an engine, and honoured by the plan and the engine (a fixed
pool sets the block count on both backends and caps the context at what it holds)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.cli import build_parser
from app.commands.common import engine_config
from app.engine.config import EngineConfig
from app.engine.plan.device import DeviceMemory, GiB
from app.engine.plan.engine_plan import resolve
from app.engine.plan.memory import activation_bytes, kv_block_bytes
from app.engine.plan.shape import ModelShape

QWEN3 = ModelShape("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 600 << 20)  # a 0.6B shape
GPU = DeviceMemory("cuda", "test GPU", 20 * GiB, 24 * GiB)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"


@pytest.mark.parametrize("command", [["serve"], ["generate", "hello"], ["mcp"]])
def test_the_flags_become_engine_config_fields(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--gpu-memory-utilization", "0.55", "--kv-blocks", "1025"])
    config = engine_config(args)
    assert (config.gpu_memory_utilization, config.num_kv_blocks) == (0.55, 1025)


def test_without_the_flags_the_config_keeps_its_defaults() -> None:
    config = engine_config(build_parser().parse_args(["serve"]))
    assert config.gpu_memory_utilization == EngineConfig.gpu_memory_utilization
    assert config.num_kv_blocks is None


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--gpu-memory-utilization", "90", "between 0.05 and 1.0"),  # a percentage
        ("--gpu-memory-utilization", "0.01", "between 0.05 and 1.0"),
        ("--gpu-memory-utilization", "1.5", "between 0.05 and 1.0"),
        ("--gpu-memory-utilization", "most", "a fraction"),
        ("--kv-blocks", "1", "at least 2"),
        ("--kv-blocks", "0", "at least 2"),
        ("--kv-blocks", "-4", "at least 2"),
        ("--kv-blocks", "1.5", "whole number"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(capsys, flag: str, value: str, says: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, value])
    err = capsys.readouterr().err
    assert flag in err and says in err


def test_engine_config_refuses_a_pool_without_a_usable_block() -> None:
    with pytest.raises(ValueError, match="num_kv_blocks must be at least 2"):
        EngineConfig(num_kv_blocks=1)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be between 0\.05 and 1\.0, not 1\.2"):
        EngineConfig(gpu_memory_utilization=1.2)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_fixed_pool_is_the_block_count_and_caps_the_context(backend: str, caplog) -> None:
    with caplog.at_level(logging.INFO):
        plan = resolve(EngineConfig(num_kv_blocks=1001), QWEN3, GPU, backend, 8 * GiB)
    assert plan.num_blocks == 1001
    assert plan.max_model_len == 1000 * 16  # the null block holds nothing; the model's own is 40,960
    assert "--kv-blocks 1001 holds 16000 tokens" in caplog.text
    roomy = resolve(EngineConfig(num_kv_blocks=1001, max_model_len=4096), QWEN3, GPU, backend, 8 * GiB)
    assert (roomy.num_blocks, roomy.max_model_len) == (1001, 4096)  # a shorter --max-ctx stands


def test_gpu_memory_utilization_sizes_the_cuda_pool() -> None:
    config = EngineConfig(max_model_len=40960, max_num_seqs=256)  # wants more than the room: the room decides
    block = kv_block_bytes(QWEN3, 16, "float16")
    for share in (0.9, 0.5):
        plan = resolve(EngineConfig(**{**config.__dict__, "gpu_memory_utilization": share}), QWEN3, GPU, "cuda",
                       4 * GiB)  # fmt: skip
        room = int(4 * GiB * share) - activation_bytes(QWEN3, 2048, 256)
        assert plan.num_blocks == room // block


def test_a_fixed_cuda_pool_the_gpu_cannot_hold_is_refused_naming_the_flag(caplog) -> None:
    block = kv_block_bytes(QWEN3, 16, "float16")
    free = 2 * GiB
    fits = free // block
    with pytest.raises(ValueError, match=f"--kv-blocks {fits + 1}: .*room for at most {fits} "):
        resolve(EngineConfig(num_kv_blocks=fits + 1), QWEN3, GPU, "cuda", free)
    share = (int(free * 0.9) - activation_bytes(QWEN3, 2048, 32)) // block
    with caplog.at_level(logging.WARNING):  # within the memory: allowed
        assert resolve(EngineConfig(num_kv_blocks=share), QWEN3, GPU, "cuda", free).num_blocks == share
    assert "--gpu-memory-utilization" not in caplog.text
    with caplog.at_level(logging.WARNING):  # past the 0.9 share less the step buffers: with a warning
        plan = resolve(EngineConfig(num_kv_blocks=share + 1), QWEN3, GPU, "cuda", free)
    assert plan.num_blocks == share + 1 and f"{share + 1} blocks (--kv-blocks) is more than the {share} blocks --gpu-memory-utilization 0.9" in caplog.text


def test_the_cpu_engine_allocates_the_fixed_pool_and_refuses_prompts_past_it() -> None:
    from app.engine import ContextOverflowError, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=str(FIXTURE), device="cpu", num_kv_blocks=9, max_num_seqs=2))
    assert engine.stats().kv_blocks_total == 8  # usable blocks: the null block aside
    assert engine.max_model_len == 8 * 16
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    [result] = engine.generate([list(range(5, 105))], params)
    assert len(result["token_ids"]) == 4 and "error" not in result
    with pytest.raises(ContextOverflowError):
        engine.add_request("long", list(range(5, 135)), params)
