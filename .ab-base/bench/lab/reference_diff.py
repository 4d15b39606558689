"""How far our CPU engine's log-probabilities are from transformers' and llama.cpp's.

For every prompt of tests/fixtures/gemma/reference.json (transformers, float32) we run
the embedded Gemma 3 270M greedily for 32 tokens and compare, at every generated
position, the log-probabilities of the reference's top-8 tokens. llama.cpp (through
llama-cpp-python, if installed) is teacher-forced along the same tokens and compared the
same way. Prints the worst absolute differences.

    PYTHONPATH=. .venv-ref/bin/python bench/lab/reference_diff.py     # needs llama-cpp-python there
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def main() -> None:
    reference = json.loads((ROOT / "tests" / "fixtures" / "gemma" / "reference.json").read_text())
    engine = LLMEngine(EngineConfig(device="cpu", max_model_len=4096))
    cases = reference["cases"]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=20)
    ours = engine.generate([c["prompt_token_ids"] for c in cases], params)
    try:
        import llama_cpp

        llm = llama_cpp.Llama(str(engine.path), n_ctx=2048, logits_all=True, verbose=False, n_threads=2)
    except ImportError:
        llm = None
    worst_tf = worst_llama = worst_llama_vs_tf = 0.0
    same_greedy_llama = 0
    for case, result in zip(cases, ours, strict=True):
        assert result["token_ids"] == case["greedy_token_ids"], case["name"]
        for lp, theirs in zip(result["logprobs"], case["top_logprobs"], strict=True):
            top = dict(lp.top)
            worst_tf = max(worst_tf, max(abs(top[t] - v) for t, v in theirs if t in top))
        if llm is None:
            continue
        llm.reset()
        tokens = case["prompt_token_ids"] + case["greedy_token_ids"]
        llm.eval(tokens)
        n_prompt = len(case["prompt_token_ids"])
        greedy = []
        for step, (lp, theirs) in enumerate(zip(result["logprobs"], case["top_logprobs"], strict=True)):
            llama_lp = log_softmax(np.asarray(llm.scores[n_prompt - 1 + step]))
            greedy.append(int(np.argmax(llama_lp)))
            top = dict(lp.top)
            worst_llama = max(worst_llama, max(abs(top[t] - llama_lp[t]) for t, _ in theirs if t in top))
            worst_llama_vs_tf = max(worst_llama_vs_tf, max(abs(v - llama_lp[t]) for t, v in theirs))
        same_greedy_llama += greedy == case["greedy_token_ids"]
    print(f"prompts: {len(cases)}; greedy tokens identical to transformers: all")
    print(f"worst |logprob| difference, ours vs transformers (top-8 per step): {worst_tf:.4f}")
    if llm is not None:
        print(f"worst |logprob| difference, ours vs llama.cpp {llama_cpp.__version__}: {worst_llama:.4f}")
        print(f"worst |logprob| difference, llama.cpp vs transformers: {worst_llama_vs_tf:.4f}")
        print(f"prompts where llama.cpp's argmax matches transformers at all 32 steps: {same_greedy_llama}/{len(cases)}")


if __name__ == "__main__":
    main()
