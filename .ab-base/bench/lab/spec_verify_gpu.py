"""Speculative decoding's GPU rows (issue 35): what a verify step costs against a decode step, and the
projected and measured speed-up of drafting on a code-editing workload. Prints JSON lines.

Verify cost (`"row": "verify_cost"`): `c` sequences (1 and 8) decoding after a `--context`-token prompt
run one step of k = 2..8 drafted tokens each (k + 1 rows a sequence), and one plain decode step (k = 0),
each `--repeats` times back to back, then synchronised: the wall per step is the GPU's time where graph
replays keep it busy (`"path": "graph"`: the decode graphs for k = 0, the verify graphs for k > 0), the
eager step's wall with the synchronisation otherwise (`"eager"`, and always on the CPU). `decode_steps`:
the step in plain decode steps at the same c, `c_verify(k)`. Graph steps also give `replay_ms`, the graph
alone replayed back to back between two CUDA events (no input staging, no gather of the sampled rows),
and `replay_decode_steps`, its ratio to the decode graph's.

Speed-up (`"row": "measured"`): the code-editing workload of bench/lab/spec_ngram.py (`completion`:
a ~120-line file, then the start of its copy with one function renamed), greedy, `--tokens` tokens,
`--rounds` times each without drafts, with prompt lookup and, given `--draft`, with the draft model
(`--draft` the target's own file accepts every greedy draft: the upper bound); decode tokens/s from the
first token to the last, the same tokens checked for every method. Each verify step's (drafted, accepted)
gives the per-position acceptance `a_j` (of the steps that drafted a j-th token after accepting j - 1,
the share that accepted it; `"row": "acceptance"`). The projection (`"row": "projected"`), in decode
steps, for k drafts a step:

    speed-up(k) = E_k / (k * c_draft + c_verify(k)),   E_k = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

(tokens a verify step emits on average over its cost: k draft-model decode steps and one verify step;
`c_draft` = the draft model's decode step in the target's at c = 1, 0 for prompt lookup; c_verify from
the c = 1 rows). With one acceptance `a` for every position (the pooled a_j) it is
(1 + a + ... + a^k) / (k * c_draft + c_verify(k)): `geometric`. The projection leaves out the drafter's
host time (a draft model's proposal is a prefill of the tokens since its last full block and k synchronous
decode steps), which the measured figure includes.

    .venv/bin/python bench/lab/spec_verify_gpu.py MODEL.gguf [--draft DRAFT.gguf] [--device cuda]
        [--context 512] [--tokens 256] [--rounds 2] [--repeats 20] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spec_ngram: the workload
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spec_ngram import prompt_ids, timed

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.core.scheduler import ScheduledChunk
from app.engine.request import Request
from app.engine.sample.sampler import may_verify
from app.engine.sampling_params import SamplingParams
from app.engine.spec.speculator import Speculator, build_speculator
from bench.suite.gpu_engine import graph_replay_ms

DRAFTS = range(2, 9)  # k of the verify-cost rows and the projection
BATCHES = (1, 8)
MAX_DRAFTS = DRAFTS[-1]


def emit(row: dict[str, Any], out: str | None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a", encoding="utf-8") as file:
            file.write(line + "\n")


def synchronize(engine: LLMEngine) -> None:
    if engine.backend.name == "cuda":
        import cupy

        cupy.cuda.Device().synchronize()


def decoding(engine: LLMEngine, count: int, context: int, seed: int) -> list[Request]:
    """`count` requests past their `context`-token prompts (random ids), each with one sampled token
    pending; stepped without drafts and without look-ahead."""
    rng = np.random.default_rng(seed)
    vocab = min(engine.model_config.vocab_size, 30_000)
    params = SamplingParams(max_tokens=engine.max_model_len - context, temperature=0.0, ignore_eos=True)
    ids = [f"cost-{seed}-{i}" for i in range(count)]
    for rid in ids:
        engine.add_request(rid, rng.integers(3, vocab, context).tolist(), params)
    while not all((r := engine.scheduler.get(rid)) is not None and r.num_output_tokens for rid in ids):
        engine.step()
    return [engine.scheduler.get(rid) for rid in ids]  # type: ignore[misc]


def step_ms(engine: LLMEngine, chunks: list[ScheduledChunk], repeats: int) -> float:
    """Wall per step of `repeats` runs of the same step back to back, then synchronised (two warm-ups)."""
    for _ in range(2):
        engine.runner.run(chunks)
    synchronize(engine)
    start = time.perf_counter()
    for _ in range(repeats):
        engine.runner.run(chunks)
    synchronize(engine)
    return (time.perf_counter() - start) / repeats * 1e3


def step_costs(engine: LLMEngine, c: int, context: int, repeats: int, drafts: range = DRAFTS) -> dict[int, tuple]:
    """(ms, path, replay ms) of a plain decode step (k = 0) and of a verify step of k drafts per sequence,
    at `c` sequences: the step's wall (module docstring) and, where it replays a graph, the graph's own
    GPU time replayed back to back (bench/suite/gpu_engine.py: no staging, no gather of the sampled rows). The steps run on the runner alone: the requests' computed tokens never move, the drafts'
    KV is written past them (blocks allocated for k + 1 tokens), and the requests are aborted after."""
    runner = engine.runner
    requests = decoding(engine, c, context, seed=c)
    rng = np.random.default_rng(0)
    costs = {}
    for k in (0, *drafts):
        for request in requests:
            assert engine.kv.allocate(request, k + 1), "no KV blocks for the verify rows"
        chunks = [ScheduledChunk(r, r.num_computed_tokens, k + 1, True, tuple(rng.integers(3, 1000, k).tolist()))
                  for r in requests]  # fmt: skip
        replays = runner.verify_graphs.replays if runner.verify_graphs is not None else 0
        ms = step_ms(engine, chunks, repeats)
        graph = None  # the step's captured graph, its inputs still staged by the last run
        if k == 0 and runner.graphs is not None and runner.graphs.bucket_for(c) is not None:
            graph = runner.graphs._graphs[runner.graphs.bucket_for(c)][0]
        elif k and runner.verify_graphs is not None and runner.verify_graphs.replays > replays:
            graph = runner.verify_graphs._graphs[runner.verify_graphs.shape_for([k + 1] * c)][0]
        replay_ms = None if graph is None else graph_replay_ms(graph, repeats)
        costs[k] = (ms, "graph" if graph is not None else "eager", replay_ms)
    for request in requests:
        engine.abort(request.request_id)
    engine.kv.reset_prefix_cache()  # the aborted requests' blocks: written past their tokens, never to be hit
    return costs


def recording(speculator: Speculator) -> list[tuple[int, int]]:
    """(drafted, accepted) of every verify step `speculator` runs from now on."""
    steps: list[tuple[int, int]] = []
    verify = speculator.verify

    def record(request: Request, drafts: Any, sampled: Any) -> list[int]:
        emitted = verify(request, drafts, sampled)
        steps.append((len(drafts), len(emitted) - 1))
        return emitted

    speculator.verify = record  # type: ignore[method-assign]
    return steps


def per_position(steps: list[tuple[int, int]]) -> tuple[list[float | None], float | None]:
    """a_j for j = 1..MAX_DRAFTS (None where no step reached position j) and the pooled a."""
    reached = [sum(1 for d, a in steps if d >= j and a >= j - 1) for j in range(1, MAX_DRAFTS + 1)]
    kept = [sum(1 for _, a in steps if a >= j) for j in range(1, MAX_DRAFTS + 1)]
    rates = [k / r if r else None for k, r in zip(kept, reached, strict=True)]
    return rates, (sum(kept) / sum(reached) if sum(reached) else None)


def projected(rates: list[float | None], pooled: float | None, c_draft: float, c_verify: dict[int, float],
              k: int) -> dict[str, float | None]:  # fmt: skip
    """The projected speed-up for k drafts (module docstring), per-position and geometric."""
    cost = k * c_draft + c_verify[k]
    expected, run = 1.0, 1.0
    for rate in rates[:k]:
        if rate is None:
            expected = None
            break
        run *= rate
        expected += run
    geometric = None if pooled is None else sum(pooled**j for j in range(k + 1))
    return {"expected_tokens": expected, "speedup": None if expected is None else expected / cost,
            "geometric_speedup": None if geometric is None else geometric / cost, "cost_decode_steps": cost}  # fmt: skip


def measure(engine: LLMEngine, ids: list[int], args: argparse.Namespace, methods: dict[str, Any]) -> dict:
    """Each method's decode tokens/s (median over `args.rounds` rounds; "off": no drafts), its verify
    steps' (drafted, accepted), and where its last round's tokens split from "off"'s."""
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    rates: dict[str, list[float]] = {name: [] for name in methods}
    steps: dict[str, list[tuple[int, int]]] = {name: [] for name in methods}
    tokens: dict[str, list[int]] = {}
    for make in methods.values():  # warm-up: compiles, caches the prompt
        engine.speculator = make()
        timed(engine, ids, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    for _ in range(args.rounds):
        for name, make in methods.items():
            engine.speculator = speculator = make()
            recorded = recording(speculator) if speculator is not None else []
            tokens[name], seconds = timed(engine, ids, params)
            rates[name].append((len(tokens[name]) - 1) / seconds)
            steps[name] += recorded
    return {name: (statistics.median(rates[name]), steps[name], first_split(tokens[name], tokens["off"]))
            for name in methods}  # fmt: skip


def first_split(tokens: list[int], reference: list[int]) -> int | None:
    """Where greedy tokens first differ from decoding without drafts (None: nowhere; a split is a bug,
    or a near-tie that a different row count's float sums broke the other way)."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b),
                None if len(tokens) == len(reference) else min(len(tokens), len(reference)))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--draft", default=None, help="a draft model of the same tokenizer (the model itself: all accepted)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--context", type=int, default=512, help="prompt tokens before the timed steps")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    config = EngineConfig(model=args.model, device=args.device, max_model_len=args.max_model_len,
                          max_num_seqs=max(BATCHES), speculative="draft" if args.draft else "ngram",
                          draft_model=args.draft, num_draft_tokens=MAX_DRAFTS, speculative_max_batch=max(BATCHES))  # fmt: skip
    engine = LLMEngine(config)
    drafter = engine.speculator.drafter if args.draft else None  # type: ignore[union-attr]
    engine.speculator = None
    engine.async_decode = False  # the cost rows step the runner by hand
    head = {"row": "setup", "date": time.strftime("%Y-%m-%d %H:%M"), "model": Path(args.model).name,
            "draft": Path(args.draft).name if args.draft else None, "backend": engine.backend.name,
            "plan": engine.plan.describe(), "context": args.context, "repeats": args.repeats}  # fmt: skip
    if engine.backend.name == "cuda":
        import cupy

        head["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    emit(head, args.out)
    c_verify: dict[int, float] = {}
    decode_ms_c1 = 0.0
    for c in BATCHES:
        costs = step_costs(engine, c, args.context, args.repeats)
        decode_ms, decode_replay = costs[0][0], costs[0][2]
        for k, (ms, path, replay) in costs.items():
            emit({"row": "verify_cost", "c": c, "k": k, "rows": c * (k + 1), "ms": ms, "decode_steps": ms / decode_ms,
                  "path": path, "replay_ms": replay,
                  "replay_decode_steps": replay / decode_replay if replay and decode_replay else None}, args.out)  # fmt: skip
            if c == 1:
                c_verify[k], decode_ms_c1 = ms / decode_ms, decode_ms
    c_draft = 0.0
    if drafter is not None:  # the draft model's decode step at c = 1, in the target's
        drafter.engine.async_decode = False
        draft_ms, path, replay = step_costs(drafter.engine, 1, args.context, args.repeats, drafts=range(0))[0]
        c_draft = draft_ms / decode_ms_c1
        drafter.engine.async_decode = drafter.engine.plan.async_decode
        emit({"row": "draft_cost", "ms": draft_ms, "decode_steps": c_draft, "path": path, "replay_ms": replay},
             args.out)  # fmt: skip
    engine.async_decode = engine.plan.async_decode
    ids = prompt_ids(engine, "completion")
    methods: dict[str, Any] = {"off": lambda: None,
                               "ngram": lambda: build_speculator("ngram", MAX_DRAFTS, 1, may_verify)}  # fmt: skip
    if drafter is not None:
        methods["draft"] = lambda: build_speculator("draft", MAX_DRAFTS, 1, may_verify, drafter)
    results = measure(engine, ids, args, methods)
    base = results["off"][0]
    for name, (rate, steps, split) in results.items():
        drafted, accepted = sum(d for d, _ in steps), sum(a for _, a in steps)
        emit({"row": "measured", "method": name, "prompt_tokens": len(ids), "output_tokens": args.tokens,
              "tok_s": rate, "speedup": rate / base, "same_tokens": split is None, "first_split": split,
              "verify_steps": len(steps), "drafted": drafted,
              "accepted": accepted, "acceptance": accepted / drafted if drafted else None}, args.out)  # fmt: skip
        if name == "off":
            continue
        rates, pooled = per_position(steps)
        emit({"row": "acceptance", "method": name, "per_position": rates, "pooled": pooled}, args.out)
        cost_of_draft = c_draft if name == "draft" else 0.0
        for k in DRAFTS:
            emit({"row": "projected", "method": name, "k": k, "c_draft": cost_of_draft, "c_verify": c_verify[k],
                  **projected(rates, pooled, cost_of_draft, c_verify, k)}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
