"""Speculative verify steps replayed from CUDA graphs (worker/verify_graphs.py): n-gram drafts on a tiny
dense Qwen3-shaped Q4_K_M file and on the tiny Qwen3.5 hybrid fixture give the greedy tokens of the same
engine decoding without drafts (but at near-ties), with the verify steps replayed from graphs (a counter)
at batches of one to six sequences; eager verify steps agree with the replayed ones. With the MTP head
(the Qwen3.5 fixture with a random head) every step a graph holds replays one, handing the head its
hidden states, and the head's chained draft steps replay a graph of their own: tokens as without drafts,
and as when the same engine steps eagerly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: hybrid_gguf
from hybrid_gguf import write_hf_with_mtp, write_qwen_gguf

pytestmark = pytest.mark.gpu
HYBRID = Path(__file__).resolve().parents[2] / "fixtures" / "hybrid"


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory, cuda) -> str:
    folder = tmp_path_factory.mktemp("cuda-verify")
    return str(write_qwen_gguf(HYBRID / "qwen35" / "hf", "qwen35", folder / "qwen35.gguf"))


def loop_prompts(sizes: tuple[int, ...]) -> list[list[int]]:
    """Random halves repeated: the n-gram drafter finds continuations in them."""
    rng = np.random.default_rng(5)
    halves = [rng.integers(3, 150, size=n).tolist() for n in sizes]
    return [h + h for h in halves]


def generate(engine: Any, prompts: list[list[int]], speculator: Any) -> list[dict]:
    from app.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    engine.speculator = speculator
    return engine.generate(prompts, params)


@pytest.mark.parametrize("sizes", [(14,), (6, 11, 20, 9, 16, 13)], ids=["one", "six"])
@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_verify_graph_replays_keep_the_greedy_tokens(model: str, sizes: tuple[int, ...], tiny_gguf: str,
                                                     qwen35: str) -> None:  # fmt: skip
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=tiny_gguf if model == "dense" else qwen35, device="cuda", max_model_len=512,
                                    max_num_seqs=8, speculative="ngram", num_draft_tokens=8,
                                    speculative_max_batch=8))  # fmt: skip
    graphs, speculator = engine.runner.verify_graphs, engine.speculator
    assert graphs is not None and speculator is not None
    assert graphs.shapes[-1] == (8 * 9 + 1, 8)
    prompts = loop_prompts(sizes)
    reference = generate(engine, prompts, None)
    assert graphs.replays == 0
    ours = generate(engine, prompts, speculator)
    assert speculator.drafted > 0 and graphs.replays > 0
    for got, ref in zip(ours, reference, strict=True):
        assert_greedy_agrees(got, ref, f"{model} verify graphs")
    replays, engine.runner.verify_graphs = graphs.replays, None  # the same drafts verified eagerly
    eager = generate(engine, prompts, speculator)
    assert graphs.replays == replays
    for got, ref in zip(ours, eager, strict=True):
        assert_greedy_agrees(got, ref, f"{model} verify graphs against eager verify steps")
    engine.scheduler.check_integrity()
    if engine.kv.state is not None:
        assert engine.kv.state.slots.num_free == engine.kv.state.slots.num_slots


def test_mtp_steps_replay_verify_graphs_that_keep_the_hidden_states(tmp_path: Path, cuda) -> None:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    hf = write_hf_with_mtp(HYBRID / "qwen35" / "hf", tmp_path / "hf")
    path = str(write_qwen_gguf(hf, "qwen35", tmp_path / "qwen35-mtp.gguf"))
    engine = LLMEngine(EngineConfig(model=path, device="cuda", max_model_len=512, max_num_seqs=8, speculative="mtp",
                                    num_draft_tokens=4, speculative_max_batch=8))  # fmt: skip
    graphs, speculator = engine.runner.verify_graphs, engine.speculator
    assert graphs is not None and graphs.keep_hidden and speculator is not None
    prompts = loop_prompts((6, 11, 20))
    reference = generate(engine, prompts, None)
    ours = generate(engine, prompts, speculator)
    step = engine.mtp.step_graph
    assert speculator.drafted > 0 and graphs.replays > 0 and step is not None and step.replays > 0
    for got, ref in zip(ours, reference, strict=True):
        assert_greedy_agrees(got, ref, "mtp on verify graphs")
    drafted, engine.runner.verify_graphs, engine.mtp.step_graph = speculator.drafted, None, None
    eager = generate(engine, prompts, speculator)
    for got, ref in zip(eager, ours, strict=True):
        assert_greedy_agrees(got, ref, "mtp stepping eagerly")
    assert speculator.drafted > drafted
    engine.scheduler.check_integrity()
