"""Will-it-fit as the Studio shows it: at the context a chat will use, with the speed to expect here.

`check_fit` (the engine's) judges whatever context it is given; asked with a model's own maximum
it made Llama 3.2 3B (131k tokens: 28 GiB of float32 KV on a CPU) "WON'T FIT" on a 24 GB machine
while Qwen3 8B (41k tokens) "FITS". The Studio loads models at the `engine.context_length` setting
(default 8k), capped by the engine at the model's own maximum, so every verdict here is taken at
exactly that context; the maximum is shown beside it.

A verdict says nothing about speed, so each comes with an expected decode rate: generating one
token reads every active weight once, so tokens/s is at most memory bandwidth / weight bytes.
The bandwidth is measured once on this machine (a large array copy, about half a second); a
rate under SLOW_TOKENS_PER_S is called slow ("fits but slow").
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass

from app.engine.plan.fit import (
    BesideModel,
    DeviceMemory,
    FitOptions,
    FitReport,
    ModelShape,
    check_fit,
    format_bytes,
    is_task_job,
    task_fit_options,
)

SLOW_TOKENS_PER_S = 5.0  # below this a chat answer of a few hundred tokens takes over a minute
COPY_BYTES = 128 * 2**20  # per copy in the bandwidth probe: past every CPU cache, small beside any RAM
COPY_REPEATS = 3  # the fastest of these counts (a busy machine's slow copy is not its bandwidth)


def context_for(shape: ModelShape, options: FitOptions) -> int:
    """The context the engine will load `shape` with: the setting capped at the model's maximum."""
    return min(options.context_length or shape.context_length, shape.context_length)


def fit_at_context(
    shape: ModelShape,
    options: FitOptions,
    device: DeviceMemory | None = None,
    job: str | None = None,
    beside: tuple[BesideModel, ...] = (),
) -> FitReport:
    """`check_fit` at the context the engine will actually use (the report's `model_context_length` keeps
    the model's maximum, to show beside it), with the task models loaded `beside` a chat model. A task model
    (`job`: embeddings, reranking, transcription) is judged as the engine runs one beside the chat model
    (plan/task_fit.py), not with the chat's settings."""
    if is_task_job(job):
        return check_fit(shape, task_fit_options(shape, job), device)
    return check_fit(shape, dataclasses.replace(options, context_length=context_for(shape, options)), device, beside)


@dataclass(frozen=True)
class DecodeSpeed:
    tokens_per_s: float  # at most: the memory-bandwidth bound
    bandwidth: float  # bytes/s, measured here
    bytes_per_token: int  # the weights read to generate one token

    @property
    def slow(self) -> bool:
        return self.tokens_per_s < SLOW_TOKENS_PER_S

    def rate(self) -> str:
        """"~12 tokens/s", "~2.1 tokens/s"."""
        return (f"~{self.tokens_per_s:.0f}" if self.tokens_per_s >= 10 else f"~{self.tokens_per_s:.1f}") + " tokens/s"

    def short(self) -> str:
        """For a table cell: "~12 tok/s", "~2.1 tok/s, slow"."""
        return self.rate().replace("tokens/s", "tok/s") + (", slow" if self.slow else "")

    def describe(self) -> str:
        """The sentence behind the number."""
        return (f"Expected speed here: at most {self.rate()} ({format_bytes(self.bytes_per_token)} of weights "
                f"read per token at {self.bandwidth / 1e9:.1f} GB/s measured memory bandwidth)"
                + (". It fits, but answers will come slowly." if self.slow else "."))


def active_weight_bytes(shape: ModelShape) -> int:
    """Weight bytes read per generated token: all of a dense model; a mixture of experts reads only the
    experts each token is routed to."""
    if shape.num_experts and shape.experts_used and shape.expert_bytes:
        dense = shape.weight_bytes - shape.expert_bytes
        return dense + shape.expert_bytes * shape.experts_used // shape.num_experts
    return shape.weight_bytes


def decode_speed(shape: ModelShape, bandwidth: float | None) -> DecodeSpeed | None:
    """The bandwidth bound on decoding `shape`; None when the bandwidth is unknown."""
    per_token = active_weight_bytes(shape)
    if not bandwidth or per_token <= 0:
        return None
    return DecodeSpeed(bandwidth / per_token, bandwidth, per_token)


@functools.cache
def memory_bandwidth(kind: str) -> float | None:
    """Bytes/s one large copy moves (read + write) on the device `kind` ("cpu" or "cuda"); None when it
    cannot be measured. Measured once per process: call it on a worker."""
    try:
        if kind == "cuda":
            import cupy as xp  # type: ignore[import-not-found]
        else:
            import numpy as xp
        source = xp.ones(COPY_BYTES // 4, dtype=xp.float32)
        target = xp.empty_like(source)
        best = float("inf")
        for _ in range(COPY_REPEATS):
            started = time.perf_counter()
            xp.copyto(target, source)
            if kind == "cuda":
                xp.cuda.Device().synchronize()
            best = min(best, time.perf_counter() - started)
        return 2 * COPY_BYTES / best if best > 0 else None
    except Exception:  # no device, no memory for the probe: the speed is simply not shown
        return None


@dataclass(frozen=True)
class FitEstimate:
    """A verdict at the context the chat will use, and the speed to expect."""

    report: FitReport
    speed: DecodeSpeed | None


def estimate(shape: ModelShape, options: FitOptions, device: DeviceMemory | None = None,
             bandwidth: float | None = None, job: str | None = None,
             beside: tuple[BesideModel, ...] = ()) -> FitEstimate:
    """The fit at the engine's context and the decode speed (bandwidth measured here unless given); a task
    model (`job`) as its engine runs it, without a chat model's decode speed."""
    report = fit_at_context(shape, options, device, job, beside)
    if is_task_job(job):
        return FitEstimate(report, None)
    if bandwidth is None:
        bandwidth = memory_bandwidth(report.device.kind)
    return FitEstimate(report, decode_speed(shape, bandwidth))
