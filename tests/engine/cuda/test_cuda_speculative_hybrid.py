"""Speculative decoding of a hybrid model on CUDA: n-gram drafts (the recurrent state checkpointed and
rolled back on the device) and the MTP head's drafts, on the tiny Qwen3.5 fixture with a random MTP
head, give the greedy tokens of the same engine decoding without drafts (but at near-ties)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: hybrid_gguf
from hybrid_gguf import write_hf_with_mtp, write_qwen_gguf

pytestmark = pytest.mark.gpu
HYBRID = Path(__file__).resolve().parents[2] / "fixtures" / "hybrid"


@pytest.fixture(scope="module")
def qwen35_mtp(tmp_path_factory: pytest.TempPathFactory, cuda) -> str:
    folder = tmp_path_factory.mktemp("cuda-mtp")
    hf = write_hf_with_mtp(HYBRID / "qwen35" / "hf", folder / "hf")
    return str(write_qwen_gguf(hf, "qwen35", folder / "qwen35-mtp.gguf"))


@pytest.mark.parametrize("method", ["ngram", "mtp"])
def test_hybrid_drafts_on_cuda_keep_the_greedy_tokens(qwen35_mtp: str, method: str) -> None:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=qwen35_mtp, device="cuda", max_model_len=512, max_num_seqs=8,
                                    speculative=method, num_draft_tokens=4, speculative_max_batch=8))  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    rng = np.random.default_rng(5)
    halves = [rng.integers(3, 150, size=n).tolist() for n in (6, 11, 20)]
    prompts = [h + h for h in halves]  # repeated: the n-gram drafter finds continuations
    speculator, engine.speculator = engine.speculator, None
    reference = engine.generate(prompts, params)
    engine.speculator = speculator
    ours = engine.generate(prompts, params)
    assert speculator is not None and speculator.drafted > 0
    for got, ref in zip(ours, reference, strict=True):
        assert_greedy_agrees(got, ref, method)
    engine.scheduler.check_integrity()
    assert engine.kv.state is not None and engine.kv.state.slots.num_free == engine.kv.state.slots.num_slots
