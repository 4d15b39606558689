"""Prompt-lookup speculative decoding on a code-editing workload: tokens/s with and without drafts.

The embedded Gemma 3 270M on the CPU is shown a ~120-line Python file and then the start of "the same
file with one function renamed", which it continues by copying the file: where coding agents spend
their decode time (`copied_lines`: the share of output lines that are lines of the file). The same greedy request runs alternately without and with `--speculative ngram`
(`ROUNDS` times each, prefix cache on so every timed run hits the prompt: decode is what is timed,
from the first token to the last), checks both produce the same tokens, and prints decode tokens/s,
the speed-up and the acceptance rate; `--out FILE` appends the figures as one JSON line.

    .venv/bin/python bench/lab/spec_ngram.py [--workload completion|resume|chat] [--tokens 256] [--rounds 2]
        [--num-draft-tokens 8] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.sample.sampler import may_verify
from app.engine.sampling_params import SamplingParams
from app.engine.spec.speculator import build_speculator

RESUME_LINES = 8  # the header, the import and the first function's first lines


def source_file() -> str:
    """A ~120-line Python module: a small inventory class and helpers, plain enough to copy."""
    parts = ['"""Inventory bookkeeping for a small shop."""', "", "from dataclasses import dataclass, field", ""]
    for name in ("apple", "pear", "plum", "fig", "kiwi", "lime", "date", "melon"):
        parts += [
            "",
            f"def price_of_{name}(quantity: int, discount: float = 0.0) -> float:",
            f'    """The price of `quantity` {name}s after `discount`."""',
            "    if quantity < 0:",
            f'        raise ValueError("a negative number of {name}s")',
            f"    unit = PRICES[{name!r}]",
            "    return round(quantity * unit * (1.0 - discount), 2)",
            "",
        ]
    parts += [
        "", "@dataclass", "class Inventory:", "    items: dict[str, int] = field(default_factory=dict)", "",
        "    def add(self, name: str, count: int) -> None:", "        self.items[name] = self.items.get(name, 0) + count",
        "", "    def remove(self, name: str, count: int) -> None:",
        "        if self.items.get(name, 0) < count:", '            raise ValueError(f"not enough {name}")',
        "        self.items[name] -= count", "",
        "    def total(self) -> int:", "        return sum(self.items.values())",
    ]  # fmt: skip
    return "\n".join(parts) + "\n"


def prompt_ids(engine: LLMEngine, workload: str) -> list[int]:
    """`completion` (no chat turn: the small model copies a file it is shown more readily than it
    follows an instruction to): the file, then the start of its edited copy. `resume`: the same with the copy's
    first lines already written (the 270M base model otherwise comments out what it copies). `chat`: one user turn
    asking for the file with the function renamed, the reply opened with a code fence."""
    if workload == "chat":
        task = ("Rename the function price_of_plum to cost_of_plum in this file. Reply with the whole "
                "updated file and nothing else.\n\n```python\n" + source_file() + "```")  # fmt: skip
        text = engine.chat_template.render([{"role": "user", "content": task}], add_generation_prompt=True)
        return engine.tokenizer.encode(text + "```python\n", add_special_tokens=False)
    text = ("# file: shop.py\n```python\n" + source_file() + "```\n\n# The same file with price_of_plum renamed to "
            "cost_of_plum:\n# file: shop.py\n```python\n")  # fmt: skip
    if workload == "resume":
        # the edited copy already begun with the file's first RESUME_LINES lines, as an editor resuming
        # an interrupted rewrite sends it: the model is in the copy when it starts
        text += "\n".join(source_file().splitlines()[:RESUME_LINES]) + "\n"
    return engine.tokenizer.encode(text)


def timed(engine: LLMEngine, ids: list[int], params: SamplingParams) -> tuple[list[int], float]:
    """The tokens and the decode seconds (first token to last)."""
    engine.add_request(f"bench-{time.monotonic_ns()}", ids, params)
    tokens: list[int] = []
    first = None
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
            if first is None and tokens:
                first = time.perf_counter()
    assert first is not None
    return tokens, time.perf_counter() - first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-draft-tokens", type=int, default=8)
    parser.add_argument("--workload", choices=("completion", "resume", "chat"), default="completion")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]  # other jobs share this machine: the 1-minute load at start and end
    engine = LLMEngine(EngineConfig(model="default", device="cpu", max_model_len=4096, max_num_seqs=1))
    ids = prompt_ids(engine, args.workload)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    speculator = build_speculator("ngram", args.num_draft_tokens, 4, may_verify)
    engine.speculator = speculator
    timed(engine, ids, SamplingParams(max_tokens=24, temperature=0.0))  # warm-up: compiles, caches the prompt
    engine.speculator = None
    timed(engine, ids, SamplingParams(max_tokens=4, temperature=0.0))
    base, spec, drafted, accepted = [], [], 0, 0
    for _ in range(args.rounds):
        engine.speculator = None
        plain, seconds = timed(engine, ids, params)
        base.append((len(plain) - 1) / seconds)
        engine.speculator = speculator = build_speculator("ngram", args.num_draft_tokens, 4, may_verify)
        drafts, seconds = timed(engine, ids, params)
        spec.append((len(drafts) - 1) / seconds)
        drafted, accepted = drafted + speculator.drafted, accepted + speculator.accepted
        assert drafts == plain, "greedy tokens differ with drafts"
    text = engine.tokenizer.decode(plain)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()} {platform.processor() or ''} "
        f"{os.cpu_count()} cores (shared)", "model": "embedded Gemma 3 270M", "backend": engine.backend.name,
        "workload": args.workload, "num_draft_tokens": args.num_draft_tokens, "load_1min": [load_start, os.getloadavg()[0]],
        "prompt_tokens": len(ids), "output_tokens": len(plain), "rounds": args.rounds,
        "tok_s_without": statistics.median(base), "tok_s_with_ngram": statistics.median(spec),
        "speedup": statistics.median(spec) / statistics.median(base), "drafted": drafted, "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "copied_lines": sum(line in source_file().splitlines() for line in text.splitlines()) / max(1, len(text.splitlines())),
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    print("output begins:", repr(text[:300]))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as file:
            file.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
