"""The load `paddock bench` puts on a server: prompts of exact token lengths and streamed chat sessions.

A session is one or more turns of OpenAI chat: turn k sends the shared prefix (a system message,
when there is one), every earlier user message and the model's answers to them, and one new user
message; each turn is a streaming request with ignore_eos and min_tokens, so it generates exactly
the asked number of tokens. The single-request workload is sessions of one turn.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

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


@dataclass(frozen=True)
class TurnResult:
    """One request's measurement: seconds, token counts as the server's usage reports them."""

    session: int
    turn: int  # 1-based
    ttft: float
    itl: float
    latency: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int | None  # None: the server's usage has no prompt_tokens_details
    answer: str
    # speculative decoding: drafted tokens accepted and rejected (usage's predicted-output fields)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


@dataclass(frozen=True)
class Plan:
    model: str
    output_tokens: int
    prefix: str  # "" for none
    turns: int


async def exact_text(client: httpx.AsyncClient, model: str, tokens: int, rng: random.Random) -> str:
    """Random words trimmed to exactly `tokens` tokens of the server's tokenizer (its /tokenize).

    Re-tokenized inside a chat template the text can come out a token or two longer or shorter,
    where the cut or the template's neighbours merge differently."""
    if tokens == 0:
        return ""
    text = " ".join(rng.choice(WORDS) for _ in range(tokens * 2))
    # vLLM's and our body names the text `prompt`, llama.cpp's server `content`: send both, read either.
    encoded = await client.post(
        "/tokenize", json={"model": model, "prompt": text, "content": text, "add_special_tokens": False}
    )
    encoded.raise_for_status()
    ids = encoded.json()["tokens"][:tokens]
    decoded = await client.post("/detokenize", json={"model": model, "tokens": ids})
    decoded.raise_for_status()
    body = decoded.json()
    return body["prompt"] if "prompt" in body else body["content"]


def turn_messages(prefix: str, history: list[dict], new_text: str) -> list[dict]:
    """The shared prefix as the system message, the conversation so far, then the new user message."""
    system = [{"role": "system", "content": prefix}] if prefix else []
    return [*system, *history, {"role": "user", "content": new_text}]


async def stream_turn(client: httpx.AsyncClient, plan: Plan, messages: list[dict]) -> dict:
    """One streaming chat request: TTFT (first content), latency, the usage chunk and the answer."""
    body = {
        "model": plan.model,
        "messages": messages,
        "max_tokens": plan.output_tokens,
        "min_tokens": plan.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, usage, pieces = None, None, []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                if content := choice.get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    pieces.append(content)
    end = time.perf_counter()
    return {
        "ttft": (first or end) - started,
        "latency": end - started,
        "usage": usage or {},
        "answer": "".join(pieces),
    }


async def run_session(
    client: httpx.AsyncClient, plan: Plan, session: int, texts: list[str]
) -> list[TurnResult]:
    """The session's turns in order, each re-sending the whole conversation before its new text."""
    history: list[dict] = []
    results = []
    for turn, text in enumerate(texts, start=1):
        messages = turn_messages(plan.prefix, history, text)
        reply = await stream_turn(client, plan, messages)
        usage = reply["usage"]
        tokens = usage.get("completion_tokens", 0)
        ttft = reply["ttft"]
        details = usage.get("prompt_tokens_details")
        predicted = usage.get("completion_tokens_details") or {}
        results.append(
            TurnResult(
                session=session,
                turn=turn,
                ttft=ttft,
                itl=(reply["latency"] - ttft) / (tokens - 1) if tokens > 1 else 0.0,
                latency=reply["latency"],
                output_tokens=tokens,
                prompt_tokens=usage.get("prompt_tokens", 0),
                cached_tokens=details.get("cached_tokens") if details else None,
                answer=reply["answer"],
                accepted_prediction_tokens=predicted.get("accepted_prediction_tokens") or 0,
                rejected_prediction_tokens=predicted.get("rejected_prediction_tokens") or 0,
            )
        )
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply["answer"]}]
    return results


async def run_sessions(
    client: httpx.AsyncClient, plan: Plan, sessions: list[list[str]], concurrency: int,
    ids: list[int] | None = None,
) -> tuple[list[TurnResult], float]:  # fmt: skip
    """All sessions through `concurrency` workers (each runs one session at a time); results, wall seconds.
    `ids`: the sessions' numbers in the results (default 0, 1, ...)."""
    queue: asyncio.Queue[tuple[int, list[str]]] = asyncio.Queue()
    for item in zip(ids or range(len(sessions)), sessions, strict=True):
        queue.put_nowait(item)
    results: list[TurnResult] = []

    async def worker() -> None:
        while not queue.empty():
            session, texts = queue.get_nowait()
            results.extend(await run_session(client, plan, session, texts))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - started


# A load process's Python reads about 10,000 streamed chunks a second (httpx lines + json): one process at
# c=128 against a fast server is the bottleneck (a simulated 7 ms step gave 3.9k tok/s where 14.7k was there to
# take, bench/lab/host_path.py), so larger loads are spread over processes of about this many streams each.
STREAMS_PER_PROCESS = 32
START_MARGIN_S = 2.0  # the processes start together this long after they are asked to (spawn and imports)


def load_processes(asked: int | None, concurrency: int, cpus: int | None) -> int:
    """How many client processes carry `concurrency` streams: `asked`, or by default one per
    STREAMS_PER_PROCESS streams up to the machine's CPUs (one below c=64)."""
    if asked is not None:
        return max(1, min(asked, concurrency))
    if concurrency < 2 * STREAMS_PER_PROCESS:
        return 1
    return max(1, min(cpus or 1, -(-concurrency // STREAMS_PER_PROCESS)))


def _share_sessions(
    url: str, headers: dict[str, str], plan: Plan, ids: list[int], sessions: list[list[str]], concurrency: int,
    start_at: float,
) -> tuple[list[TurnResult], float, float]:  # fmt: skip
    """One load process's share, from wall-clock `start_at` on: (results, started, ended) in time.time()."""

    async def go() -> tuple[list[TurnResult], float, float]:
        limits = httpx.Limits(max_connections=concurrency + 4)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            started = time.time()
            results, _ = await run_sessions(client, plan, sessions, concurrency, ids)
            return results, started, time.time()

    return asyncio.run(go())


async def run_sessions_in_processes(
    url: str, headers: dict[str, str], plan: Plan, sessions: list[list[str]], concurrency: int, processes: int
) -> tuple[list[TurnResult], float]:
    """run_sessions over `processes` client processes, each every processes-th session with its share of the
    concurrency; results, wall seconds from the first process's start to the last one's end."""
    import concurrent.futures
    import multiprocessing

    start_at = time.time() + START_MARGIN_S
    shares = []
    for i in range(processes):
        ids = list(range(i, len(sessions), processes))
        share = concurrency // processes + (i < concurrency % processes)
        shares.append((url, headers, plan, ids, [sessions[j] for j in ids], share, start_at))
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")  # no fork of a process with a running event loop
    with concurrent.futures.ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        done = await asyncio.gather(*(loop.run_in_executor(pool, _share_sessions, *share) for share in shares))
    results = [r for share_results, _, _ in done for r in share_results]
    return results, max(end for _, _, end in done) - min(start for _, start, _ in done)
