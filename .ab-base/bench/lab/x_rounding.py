"""Does rounding a GEMV's input x to integer codes change the embedded Gemma 3 270M's greedy text?

The numpy backend runs the prompts of tests/fixtures/gemma/reference.json one at a time (as a
single-token GEMV sees them), once as it is and once with every decode-step input of `linear`
(the vocabulary projection excepted) rounded to `levels` codes per group of columns, as
gemv_int.cu rounds it (d = max|x| / levels per group, x -> d * rint(x / d)). Prints how many
prompts keep their 32 greedy tokens and, where they split, the reference's top logprobs there.

    python3 bench/lab/x_rounding.py [--group 16] [--levels 127|32767] [--model PATH]

Measured 2026-11-30 on this project's VM (bench/results/archive/NOTES-cuda-2026-11.md, runs 26-34): int8 codes
(levels 127) per 16 columns kept 5 of 9 prompts, int16 (32767) kept 9 of 9.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.engine.backend import cpu as cpu_backend  # noqa: E402
from app.engine.config import EngineConfig  # noqa: E402
from app.engine.core.engine import LLMEngine  # noqa: E402
from app.engine.sampling_params import SamplingParams  # noqa: E402

VOCAB_ROWS = 100_000  # wider weights are the vocabulary projection, which the rounding skips


def rounded(x: np.ndarray, group: int, levels: float) -> np.ndarray:
    groups = x.reshape(x.shape[0], -1, group)
    d = np.abs(groups).max(axis=-1, keepdims=True) / np.float32(levels)
    codes = np.rint(groups / np.where(d == 0, 1, d))
    return (codes * d).reshape(x.shape).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--levels", type=float, default=127.0)
    parser.add_argument("--model", default=None, help="GGUF path (default: the embedded model)")
    args = parser.parse_args()
    backend_cls = cpu_backend.CpuBackend
    plain_linear = backend_cls.linear
    state = {"round": False}

    def linear(self, x, weight, bias=None):
        wide = isinstance(weight, cpu_backend.CpuWeight) and weight.shape[0] >= VOCAB_ROWS
        if state["round"] and x.shape[0] == 1 and not wide:
            x = rounded(x, args.group, args.levels)
        return plain_linear(self, x, weight, bias)

    backend_cls.linear = linear
    cases = json.loads((ROOT / "tests" / "fixtures" / "gemma" / "reference.json").read_text())["cases"]
    config = EngineConfig(device="cpu", max_model_len=2048, **({"model": args.model} if args.model else {}))
    engine = LLMEngine(config)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=8)
    runs = {}
    for rounding in (False, True):
        state["round"] = rounding
        runs[rounding] = [engine.generate([c["prompt_token_ids"]], params)[0] for c in cases]
    same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(runs[False], runs[True], strict=True))
    print(f"group {args.group}, levels {args.levels:g}: {same}/{len(cases)} prompts keep their greedy tokens")
    for plain, changed in zip(runs[False], runs[True], strict=True):
        pairs = zip(plain["token_ids"], changed["token_ids"], strict=True)
        split = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if split is not None:
            top = plain["logprobs"][split].top[:3]
            print(f"  split at token {split}; top logprobs there: {[(t, round(v, 3)) for t, v in top]}")


if __name__ == "__main__":
    main()
