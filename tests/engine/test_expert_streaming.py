"""`--experts-on-gpu N` on the numpy backend: experts streamed into slots give exactly what every
expert resident gives.

The tiny random Qwen3-MoE fixtures (6 experts, 2 per token, 2 layers; GGUF with the experts
stacked, Hugging Face folder with them listed one by one) run once with every expert resident
(the layer's own per-expert loop) and once with N experts per layer in "device" slots and the rest
copied in per step (backend/cpu_experts.py, planned by moe/residency.py): for N = 0, a
partial hot set and all six, the logits in every run mode of the paged-KV harness and the engine's
greedy tokens and logprobs must be equal, not close. The bytes the engine reports copied are whole
experts, their size read independently with gguf-py.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from model_harness import MODES, run_logits

from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model
from app.engine.moe.residency import ExpertStreaming
from app.engine.sampling_params import SamplingParams

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
QWEN3MOE = {"gguf": FAMILIES / "qwen3moe" / "qwen3moe-q8_0-q4_0.gguf", "hf": FAMILIES / "qwen3moe" / "hf"}
TOKENS = np.random.default_rng(7).integers(0, 256, 29).tolist()
HOT_SETS = (0, 2, 6)  # none, a partial hot set, all six


def _model(source: str, on_gpu: int | None):
    backend = CpuBackend()
    if on_gpu is not None:
        backend.expert_streaming = ExpertStreaming(on_gpu=on_gpu, rebalance_every=5)
    return build_model(open_checkpoint(QWEN3MOE[source]), backend, 64), backend


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", sorted(QWEN3MOE))
def test_streamed_experts_give_the_resident_logits_exactly(source: str, mode: str) -> None:
    resident, backend = _model(source, None)
    assert all(layer.moe.grouped is None for layer in resident.layers)  # the per-expert loop
    reference = run_logits(resident, backend, TOKENS, mode)
    for on_gpu in HOT_SETS:
        model, backend = _model(source, on_gpu)
        assert model.syncs_host and all(layer.moe.grouped is not None for layer in model.layers)
        ours = run_logits(model, backend, TOKENS, mode)
        assert np.array_equal(ours, reference), f"{source} {mode} with {on_gpu} experts resident"
        copied = backend.expert_streaming.bytes_copied
        assert (copied > 0) == (on_gpu < 6), f"{on_gpu} resident: {copied} bytes copied"
        for layer in backend.expert_streaming.layers:
            layer.check_integrity()


def _expert_bytes(path: Path, layer: int) -> int:
    """One expert of one layer: its gate, up and down blocks, from gguf-py's reader."""
    reader = gguf.GGUFReader(path)
    prefix = f"blk.{layer}.ffn_"
    stacked = [t for t in reader.tensors if t.name.startswith(prefix) and t.name.endswith("_exps.weight")]
    assert len(stacked) == 3
    return sum(int(t.n_bytes) for t in stacked) // 6


def test_engine_tokens_are_the_same_with_experts_streamed() -> None:
    prompts = [np.random.default_rng(n).integers(0, 256, n).tolist() for n in (3, 17, 40, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3)

    def run(on_gpu: int | None) -> tuple[list[dict], LLMEngine]:
        config = EngineConfig(model=str(QWEN3MOE["gguf"]), device="cpu", cpu_kernels="numpy",
                              max_model_len=128, max_num_seqs=4, experts_on_gpu=on_gpu)  # fmt: skip
        engine = LLMEngine(config)
        return engine.generate(prompts, params), engine

    reference, resident = run(None)
    assert resident.stats().expert_bytes_copied_total == 0
    per_expert = [_expert_bytes(QWEN3MOE["gguf"], layer) for layer in (0, 1)]  # Q4_0, then Q5_1 down
    assert per_expert[0] != per_expert[1]
    for on_gpu in HOT_SETS:
        results, engine = run(on_gpu)
        for got, ref in zip(results, reference, strict=True):
            assert got["token_ids"] == ref["token_ids"]
            assert [lp.top for lp in got["logprobs"]] == [lp.top for lp in ref["logprobs"]]
        copied = engine.stats().expert_bytes_copied_total
        layers = engine.expert_streaming.layers
        assert copied == sum(layer.bytes_copied for layer in layers) and (copied > 0) == (on_gpu < 6)
        assert [layer.bytes_copied for layer in layers] == [
            layer.copies * size for layer, size in zip(layers, per_expert, strict=True)
        ]


def test_experts_on_gpu_is_checked_against_the_model() -> None:
    with pytest.raises(ValueError, match="more than the model's 6 experts"):
        LLMEngine(EngineConfig(model=str(QWEN3MOE["gguf"]), device="cpu", cpu_kernels="numpy", experts_on_gpu=7))
    with pytest.raises(ValueError, match="takes a number of experts per layer"):
        EngineConfig(experts_on_gpu="most")
