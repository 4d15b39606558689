"""`paddock bench`: drive a running OpenAI-compatible server with a fixed streaming-chat workload.

The seed's aiperf workload: synthetic prompts of exactly `--input-tokens` tokens (counted
by the server's own tokenizer through /tokenize), `--output-tokens` generated per request
(ignore_eos and min_tokens, so every request produces exactly that many), streamed, at a
fixed concurrency. Reports output-token throughput, TTFT and inter-token latency (p50 and
p90), as aiperf defines them: ITL = (request latency - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

HELP = "benchmark a running server with the aiperf-style streaming chat workload"

WORDS = [
    "river",
    "mountain",
    "quiet",
    "engine",
    "paper",
    "window",
    "orange",
    "simple",
    "market",
    "travel",
    "garden",
    "silver",
    "thunder",
    "planet",
    "history",
    "music",
    "winter",
    "coffee",
    "bridge",
    "forest",
    "ocean",
    "letter",
    "yellow",
    "friend",
    "morning",
    "doctor",
    "island",
    "number",
    "summer",
    "dinner",
    "castle",
    "pocket",
    "rocket",
    "signal",
    "finger",
    "valley",
    "shadow",
    "candle",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:11660", help="the server's base URL")
    parser.add_argument("--model", default=None, help="model id (default: the server's first)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--requests", type=int, default=None, help="requests in all (default: 8 x concurrency)"
    )
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument(
        "--warmup", type=int, default=None, help="requests before timing (default: concurrency)"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


async def _prompt(client, args, rng: random.Random) -> str:
    """Random words trimmed to exactly `input_tokens` tokens of the server's tokenizer."""
    text = " ".join(rng.choice(WORDS) for _ in range(args.input_tokens * 2))
    tokens = await client.post(
        "/tokenize", json={"model": args.model, "prompt": text, "add_special_tokens": False}
    )
    ids = tokens.json()["tokens"][: args.input_tokens]
    detok = await client.post("/detokenize", json={"model": args.model, "tokens": ids})
    return detok.json()["prompt"]


async def _one(client, args, prompt: str) -> dict:
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.output_tokens,
        "min_tokens": args.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = None
    usage = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = first or time.perf_counter()
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else 0
    ttft = (first or end) - started
    itl = (end - started - ttft) / (tokens - 1) if tokens > 1 else 0.0
    return {"ttft": ttft, "itl": itl, "latency": end - started, "tokens": tokens,
            "prompt_tokens": usage["prompt_tokens"] if usage else 0}  # fmt: skip


async def _run(args: argparse.Namespace) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600, limits=limits) as client:
        if args.model is None:
            args.model = (await client.get("/v1/models")).json()["data"][0]["id"]
        rng = random.Random(args.seed)
        total = args.requests or 8 * args.concurrency
        warmup = args.concurrency if args.warmup is None else args.warmup
        prompts = [await _prompt(client, args, rng) for _ in range(min(total + warmup, 64))]
        queue: asyncio.Queue[str] = asyncio.Queue()

        async def worker(results: list[dict]) -> None:
            while True:
                try:
                    prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results.append(await _one(client, args, prompt))

        async def phase(count: int) -> tuple[list[dict], float]:
            for i in range(count):
                queue.put_nowait(prompts[i % len(prompts)])
            results: list[dict] = []
            started = time.perf_counter()
            await asyncio.gather(*(worker(results) for _ in range(args.concurrency)))
            return results, time.perf_counter() - started

        if warmup:
            await phase(warmup)
        results, wall = await phase(total)
    ttfts = sorted(r["ttft"] for r in results)
    itls = sorted(r["itl"] for r in results)
    out_tokens = sum(r["tokens"] for r in results)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "url": args.url,
        "model": args.model,
        "concurrency": args.concurrency,
        "requests": len(results),
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "mean_prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in results),
        "output_tokens_total": out_tokens,
        "output_throughput_tok_s": out_tokens / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * ttfts[int(0.9 * (len(ttfts) - 1))],
        "itl_p50_ms": 1000 * statistics.median(itls),
        "itl_p90_ms": 1000 * itls[int(0.9 * (len(itls) - 1))],
        "wall_s": wall,
    }


def run(args: argparse.Namespace) -> int:
    try:
        summary = asyncio.run(_run(args))
    except Exception as exc:  # unreachable server, HTTP error: one readable line
        print(f"paddock bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"concurrency {summary['concurrency']}, {summary['requests']} requests, ISL {args.input_tokens} / "
            f"OSL {args.output_tokens}: {summary['output_throughput_tok_s']:.1f} output tok/s, "
            f"TTFT p50 {summary['ttft_p50_ms']:.1f} ms, ITL p50 {summary['itl_p50_ms']:.2f} ms"
        )
    return 0
