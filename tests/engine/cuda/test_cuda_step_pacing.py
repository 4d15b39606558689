"""Step pacing on CUDA (core/step_pacing.py): with async decode and decode graphs, the engine times its own
steps where their ids are read back (look-ahead or not), and paces a long prompt beside decoding requests:
the warm-up chunks, then chunks that grow at most twice the largest measured, and every request finishes.
Timing values are not asserted (they are the benchmark's: bench/suite/agent_engine.py --cases interfere)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_a_long_prompt_is_paced_beside_decoders_and_everything_finishes(tiny_gguf: str) -> None:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.core.step_cost import MIN_MIXED_STEPS, StepShape
    from app.engine.core.step_pacing import TRUST, WARMUP_TOKENS
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=tiny_gguf, device="cuda", max_model_len=4096, max_num_seqs=8,
                                    decode_latency_factor=2.0))  # pacing is off by default  # fmt: skip
    assert engine.pacer is not None and engine.async_decode
    paced: list[int] = []  # prefill tokens of each step that carried decodes
    schedule = engine.scheduler.schedule

    def recording(limit=None):  # type: ignore[no-untyped-def]
        out = schedule(limit)
        if out.num_decodes:
            paced.append(StepShape.of(out).prefill_tokens)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    tokens: dict[str, list[int]] = {}

    def step() -> None:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)

    decode = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"d{i}", [(7 * i + j) % 200 + 1 for j in range(64)], decode, session_id=f"s{i}")
    for _ in range(30):  # the prompts, then decode-only steps (launched ahead)
        step()
    assert engine.pacer.model.decode_steps >= 3 and not any(paced)
    long = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request("long", [(3 * j) % 250 + 1 for j in range(3000)], long, session_id="long")
    while engine.has_unfinished():
        step()
    assert len(tokens["long"]) == 2 and all(len(tokens[f"d{i}"]) == 300 for i in range(4))
    prefills = [n for n in paced if n]
    assert sum(prefills) == 3000
    assert prefills[:MIN_MIXED_STEPS] == [64, WARMUP_TOKENS] * (MIN_MIXED_STEPS // 2)
    for i in range(1, len(prefills)):  # never far past what was measured
        assert prefills[i] <= max(TRUST * max(prefills[:i]), 64), prefills
    assert engine.pacer.model.mixed_steps >= MIN_MIXED_STEPS
    engine.scheduler.check_integrity()
    assert engine.kv.num_used_blocks == 0
