"""`paddock bench`: drive a running OpenAI-compatible server with a fixed streaming-chat workload.

The seed's aiperf workload: synthetic prompts of exactly `--input-tokens` tokens (counted
by the server's own tokenizer through /tokenize), `--output-tokens` generated per request
(ignore_eos and min_tokens, so every request produces exactly that many), streamed, at a
fixed concurrency. Reports output-token throughput, TTFT and inter-token latency, as aiperf
defines them: ITL = (request latency - TTFT) / (output tokens - 1).

The agent workload adds `--prefix-tokens N` (one shared system prompt of N tokens before every
request's own text, as IDE agents send) and `--turns K` (each session re-sends its whole
conversation plus `--input-tokens` new tokens per turn, like a tool result), and reports the
prompt tokens the server served from its prefix cache per turn (`usage.prompt_tokens_details`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time

HELP = "benchmark a running server with the aiperf-style streaming chat workload"
PROMPT_POOL = 64  # distinct prompts per run at most; later requests reuse them in order


def _count(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:11660", help="the server's base URL")
    parser.add_argument("--model", default=None, help="model id (default: the server's first)")
    parser.add_argument("--concurrency", type=_count(1), default=1, help="requests (sessions) in flight")
    parser.add_argument(
        "--requests",
        type=_count(1),
        default=None,
        help="timed requests in all, rounded up to whole sessions of --turns (default: 8 x concurrency; with --turns: concurrency x turns)",
    )
    parser.add_argument(
        "--input-tokens",
        "--isl",
        type=_count(1),
        default=128,
        help="new prompt tokens per request (per turn)",
    )
    parser.add_argument("--output-tokens", "--osl", type=_count(1), default=128)
    parser.add_argument(
        "--prefix-tokens",
        type=_count(0),
        default=0,
        help="a shared system prompt of N tokens before every request",
    )
    parser.add_argument(
        "--turns",
        type=_count(1),
        default=1,
        help="turns per session, each re-sending the conversation so far",
    )
    parser.add_argument(
        "--warmup",
        type=_count(0),
        default=None,
        help="one-turn requests before timing (default: concurrency)",
    )
    parser.add_argument(
        "--processes",
        type=_count(1),
        default=None,
        help="client processes carrying the streams (default: one per 32 streams from c=64, up to the CPUs; "
        "one Python process reads ~10k streamed chunks a second)",
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


async def measure(args: argparse.Namespace, client) -> tuple[dict, list]:
    """Warm up, run the timed sessions; the summary and every timed request's `TurnResult`."""
    from app.commands.bench_load import (
        Plan,
        exact_text,
        load_processes,
        run_sessions,
        run_sessions_in_processes,
    )

    if args.model is None:
        args.model = (await client.get("/v1/models")).json()["data"][0]["id"]
    rng = random.Random(args.seed)
    total = args.requests or (8 * args.concurrency if args.turns == 1 else args.concurrency * args.turns)
    sessions = math.ceil(total / args.turns)
    warmup = args.concurrency if args.warmup is None else args.warmup
    prefix = await exact_text(client, args.model, args.prefix_tokens, rng)
    pool = [
        await exact_text(client, args.model, args.input_tokens, rng)
        for _ in range(min(warmup + sessions * args.turns, PROMPT_POOL))
    ]
    texts = iter(pool[i % len(pool)] for i in range(warmup + sessions * args.turns))
    plan = Plan(model=args.model, output_tokens=args.output_tokens, prefix=prefix, turns=args.turns)
    if warmup:
        await run_sessions(client, plan, [[next(texts)] for _ in range(warmup)], args.concurrency)
    timed = [[next(texts) for _ in range(args.turns)] for _ in range(sessions)]
    processes = load_processes(args.processes, args.concurrency, os.cpu_count())
    if processes > 1:
        results, wall = await run_sessions_in_processes(
            str(client.base_url), dict(client.headers), plan, timed, args.concurrency, processes
        )
    else:
        results, wall = await run_sessions(client, plan, timed, args.concurrency)
    summary = summarize(args, results, wall)
    summary["load_processes"] = processes
    return summary, results


def summarize(args: argparse.Namespace, results: list, wall: float) -> dict:
    ttfts = [r.ttft for r in results]
    itls = [r.itl for r in results]
    out_tokens = sum(r.output_tokens for r in results)
    reported = all(r.cached_tokens is not None for r in results)
    per_turn = []
    for turn in range(1, args.turns + 1):
        rows = [r for r in results if r.turn == turn]
        resent = sum(resent_tokens(results, r) for r in rows)
        cached = sum(r.cached_tokens for r in rows) if reported else None
        per_turn.append({
            "turn": turn,
            "requests": len(rows),
            "prompt_tokens_mean": statistics.fmean(r.prompt_tokens for r in rows),
            "cached_tokens_mean": cached / len(rows) if cached is not None else None,
            "cached_share": cached / sum(r.prompt_tokens for r in rows) if cached is not None else None,
            "resent_tokens_mean": resent / len(rows),
            "cached_share_of_resent": cached / resent if cached is not None and resent else None,
            "ttft_p50_ms": 1000 * statistics.median(r.ttft for r in rows),
        })  # fmt: skip
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "url": args.url,
        "model": args.model,
        "concurrency": args.concurrency,
        "requests": len(results),
        "sessions": len({r.session for r in results}),
        "turns": args.turns,
        "prefix_tokens": args.prefix_tokens,
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "mean_prompt_tokens": statistics.fmean(r.prompt_tokens for r in results),
        "output_tokens_total": out_tokens,
        "output_throughput_tok_s": out_tokens / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * _percentile(ttfts, 0.9),
        "ttft_p99_ms": 1000 * _percentile(ttfts, 0.99),
        "itl_p50_ms": 1000 * statistics.median(itls),
        "itl_p90_ms": 1000 * _percentile(itls, 0.9),
        "cached_tokens_mean": statistics.fmean(r.cached_tokens for r in results) if reported else None,
        "per_turn": per_turn,
        "wall_s": wall,
        **speculation(results),
    }


def resent_tokens(results: list, result) -> int:
    """Tokens of `result`'s prompt the server has seen before in its session: the previous turn's prompt
    and its reply, which this turn re-sends (a few template tokens around the reply aside). The share of
    them reported as cached says how well the prefix cache keeps a conversation; the share of the whole
    prompt can't reach 100 % while every turn adds new text."""
    previous = next((r for r in results if r.session == result.session and r.turn == result.turn - 1), None)
    return previous.prompt_tokens + previous.output_tokens if previous else 0


def speculation(results: list) -> dict:
    """Speculative decoding's totals over the timed requests: drafted, accepted, acceptance rate."""
    accepted = sum(r.accepted_prediction_tokens for r in results)
    drafted = accepted + sum(r.rejected_prediction_tokens for r in results)
    return {"draft_tokens": drafted, "accepted_draft_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None}  # fmt: skip


async def _run(args: argparse.Namespace) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600, limits=limits) as client:
        summary, _ = await measure(args, client)
    return summary


def _cached(tokens: float | None) -> str:
    return "not reported" if tokens is None else f"{tokens:.0f}"


def _share(row: dict) -> str:
    if row["cached_share"] is None:
        return ""
    resent = row["cached_share_of_resent"]
    return f" ({row['cached_share']:.0%} of the prompt" + (
        f", {resent:.0%} of what it re-sends)" if resent else ")"
    )


def run(args: argparse.Namespace) -> int:
    try:
        summary = asyncio.run(_run(args))
    except Exception as exc:  # unreachable server, HTTP error: one readable line
        print(f"paddock bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"concurrency {summary['concurrency']}, {summary['requests']} requests, ISL {args.input_tokens} / "
        f"OSL {args.output_tokens}: {summary['output_throughput_tok_s']:.1f} output tok/s, "
        f"TTFT p50 {summary['ttft_p50_ms']:.1f} ms, ITL p50 {summary['itl_p50_ms']:.2f} ms"
    )
    if summary["draft_tokens"]:
        print(f"speculative: {summary['draft_tokens']} drafted, {summary['accepted_draft_tokens']} accepted "
              f"({summary['acceptance_rate']:.0%})")  # fmt: skip
    if args.prefix_tokens or args.turns > 1:
        print(f"prefix {args.prefix_tokens} tokens, TTFT p99 {summary['ttft_p99_ms']:.1f} ms")
        for row in summary["per_turn"]:
            print(
                f"  turn {row['turn']}: {row['requests']} requests, prompt {row['prompt_tokens_mean']:.0f} tokens, "
                f"cached {_cached(row['cached_tokens_mean'])}{_share(row)}, TTFT p50 {row['ttft_p50_ms']:.1f} ms"
            )
    return 0
