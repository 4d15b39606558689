"""The embedded Gemma 3 270M: greedy tokens on CUDA against the CPU backend and transformers.

Runs the prompts of tests/fixtures/gemma/reference.json (transformers' float32 greedy
tokens) through our engine on the numpy backend and on CUDA (graphs on, and eager), 32
tokens each, all prompts in one batch and (graphs, "-b1") one prompt at a time, which is
where the single-token GEMVs with int16 x (gemv_int.py) and the prefill graphs run; without
logprobs ("async"), where decode steps are launched one ahead (core/pipeline.py); and reports how many prompts give identical tokens, plus the worst
logprob difference of the reference's top tokens at the first generated position.

    python3 bench/suite/gemma_cuda_parity.py /path/to/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.engine.config import EngineConfig  # noqa: E402
from app.engine.core.engine import LLMEngine  # noqa: E402
from app.engine.sampling_params import SamplingParams  # noqa: E402


def main() -> None:
    model = sys.argv[1]
    cases = json.loads((ROOT / "tests" / "fixtures" / "gemma" / "reference.json").read_text())["cases"]
    prompts = [c["prompt_token_ids"] for c in cases]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=8)
    results = {
        "cpu": LLMEngine(EngineConfig(model=model, device="cpu", max_model_len=2048)).generate(
            prompts, params
        )
    }
    for graphs in (True, False):
        engine = LLMEngine(EngineConfig(model=model, device="cuda", max_model_len=2048, cuda_graphs=graphs))
        results["cuda-graphs" if graphs else "cuda-eager"] = engine.generate(prompts, params)
        if graphs:
            results["cuda-graphs-b1"] = [engine.generate([p], params)[0] for p in prompts]
            # no logprobs: decode steps go in flight (async decode), one prompt at a time and all together
            plain = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
            results["cuda-async-b1"] = [engine.generate([p], plain)[0] for p in prompts]
            results["cuda-async"] = engine.generate(prompts, plain)
        del engine
    for name, outs in results.items():
        same_tf = sum(o["token_ids"] == c["greedy_token_ids"] for o, c in zip(outs, cases, strict=True))
        same_cpu = sum(o["token_ids"] == r["token_ids"] for o, r in zip(outs, results["cpu"], strict=True))
        worst = 0.0
        for o, c in zip(outs if outs[0]["logprobs"] else [], cases, strict=False):
            for lp, ref in zip(o["logprobs"], c["top_logprobs"], strict=True):
                if lp.token_id != ref[0][0]:
                    break  # compare only while the texts agree
                top = dict(lp.top)
                worst = max(worst, max(abs(top.get(t, -99.0) - v) for t, v in ref[:5]))
        diff = f"{worst:.4f}" if outs[0]["logprobs"] else "n/a (no logprobs asked)"
        print(f"{name:<12} identical to transformers: {same_tf}/{len(cases)}  identical to CPU: {same_cpu}/{len(cases)}"
              f"  worst top-5 |logprob diff| vs transformers while aligned: {diff}")  # fmt: skip


if __name__ == "__main__":
    main()
