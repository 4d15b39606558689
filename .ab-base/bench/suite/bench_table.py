"""`paddock bench --json` lines as one markdown table: a row per run, cached tokens per turn.

python3 bench/suite/bench_table.py bench.jsonl [more.jsonl ...]   # or the lines on stdin
"""

from __future__ import annotations

import fileinput
import json

HEADER = (
    "| model | c | ISL | prefix | turns | requests | TTFT p50 | TTFT p99 | ITL p50 | output tok/s | cached per turn |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _cached(run: dict) -> str:
    turns = run.get("per_turn") or []
    if not turns or turns[0]["cached_tokens_mean"] is None:
        return "not reported"
    return " / ".join(f"{row['cached_tokens_mean']:.0f}" for row in turns)


def row(run: dict) -> str:
    """One run's line; runs from before the agent fields existed show '-' for them."""
    cells = [
        run["model"],
        run["concurrency"],
        run["input_tokens"],
        run.get("prefix_tokens", 0),
        run.get("turns", 1),
        run["requests"],
        f"{run['ttft_p50_ms']:.1f} ms",
        f"{run['ttft_p99_ms']:.1f} ms" if "ttft_p99_ms" in run else "-",
        f"{run['itl_p50_ms']:.2f} ms",
        f"{run['output_throughput_tok_s']:,.0f}",
        _cached(run) if "per_turn" in run else "-",
    ]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table(lines: list[str]) -> str:
    runs = [json.loads(line) for line in lines if line.startswith("{")]
    return "\n".join([HEADER, *(row(run) for run in runs)])


def main() -> None:
    with fileinput.input() as lines:  # the files named, else stdin
        print(table(list(lines)))


if __name__ == "__main__":
    main()
