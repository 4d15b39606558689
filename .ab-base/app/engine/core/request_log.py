"""One log line per finished request: what the prompt cost, where its cached tokens came from, how fast
the answer came (the figures a user compares with --prefix-cache off or between tiers)."""

from __future__ import annotations

import logging
import time

from app.engine.request import Request

log = logging.getLogger("paddock.requests")


def finished_line(request: Request, now: float) -> str:
    tiers = ", ".join(f"{tier} {n}" for tier, n in request.cached_tokens_by_tier.items() if n)
    cached = f"{request.num_cached_tokens} cached" + (f" ({tiers})" if tiers else "")
    first = request.first_token_time
    ttft = f"TTFT {first - request.arrival_time:.3f} s" if first is not None else "no token"
    decode_s = now - first if first is not None else 0.0
    rate = f"{(request.num_output_tokens - 1) / decode_s:.1f} tok/s" if decode_s > 0 and request.num_output_tokens > 1 else "- tok/s"
    drafted = request.num_draft_tokens
    spec = (f", drafted {drafted}, accepted {request.num_accepted_tokens} ({request.num_accepted_tokens / drafted:.0%})"
            if drafted else "")  # fmt: skip
    return (
        f"request {request.request_id} {request.status.finish_reason or request.status.value}: "
        f"prompt {request.num_prompt_tokens} tokens, {cached}, {ttft}, "
        f"output {request.num_output_tokens} tokens, {rate}{spec}"
    )


def log_finished(request: Request) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(finished_line(request, time.monotonic()))
