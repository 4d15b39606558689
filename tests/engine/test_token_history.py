"""The penalties' incremental token history: after every step of a growing request it gives what the
penalty definitions compute from the whole history (the HF repetition penalty, OpenAI's
frequency/presence formula, written out here token by token), including steps that end with a
device-sampled placeholder."""

from __future__ import annotations

import numpy as np

from app.engine.request import PLACEHOLDER, Request
from app.engine.sample.ops import apply_penalties
from app.engine.sampling_params import SamplingParams

VOCAB = 50


def hf_repetition_penalised(logits: np.ndarray, history: list[int], penalty: float) -> np.ndarray:
    expected = logits.astype(np.float64).copy()
    for token in set(history):
        expected[token] = expected[token] / penalty if expected[token] > 0 else expected[token] * penalty
    return expected


def openai_penalised(logits: np.ndarray, outputs: list[int], frequency: float, presence: float) -> np.ndarray:
    expected = logits.astype(np.float64).copy()
    for token in set(outputs):
        expected[token] -= frequency * outputs.count(token) + presence
    return expected


def test_each_step_matches_the_definitions_over_the_whole_history() -> None:
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, VOCAB, 40).tolist()
    request = Request("r", prompt, SamplingParams(repetition_penalty=1.7))
    counted = Request("c", prompt, SamplingParams(frequency_penalty=0.4, presence_penalty=0.3))
    for step in range(120):
        logits = rng.standard_normal(VOCAB).astype(np.float32)
        row = logits.copy()
        apply_penalties(row, request)
        expected = hf_repetition_penalised(logits, request.all_token_ids, 1.7)
        np.testing.assert_allclose(row, expected, rtol=1e-6, err_msg=f"step {step}")

        row = logits.copy()
        apply_penalties(row, counted)
        real_outputs = [t for t in counted.output_token_ids if t != PLACEHOLDER]
        np.testing.assert_allclose(row, openai_penalised(logits, real_outputs, 0.4, 0.3), rtol=1e-6, atol=1e-6)

        token = int(rng.integers(0, VOCAB))
        request.output_token_ids.append(token)
        # the device pipeline's placeholder stands last for one step, then becomes the real token
        if counted.output_token_ids and counted.output_token_ids[-1] == PLACEHOLDER:
            counted.output_token_ids[-1] = token
        else:
            counted.output_token_ids.append(PLACEHOLDER if step % 3 == 0 else token)


def test_a_history_that_shrinks_is_rebuilt() -> None:
    request = Request("r", [1, 2], SamplingParams(frequency_penalty=1.0))
    request.output_token_ids = [5, 5, 6]
    apply_penalties(np.zeros(VOCAB, dtype=np.float32), request)
    request.output_token_ids = [6]  # e.g. a request reset for a retry
    row = np.zeros(VOCAB, dtype=np.float32)
    apply_penalties(row, request)
    assert row[5] == 0.0 and row[6] == -1.0
