"""Task models in the memory plan: the engine a task model runs in (`task_engine_config`, which
tasks/task_model.py loads it with) and what it takes beside the chat model.

An embedding, reranking or speech model (`--embedding-model`, `--rerank-model`, `--asr-model`) is a second
`LLMEngine` sized for one text at a time: one sequence, a KV cache of its context's blocks, no prefix cache,
no CUDA graphs and no float16 weight copies. Its memory is `memory()` under those options, less the runtime
overhead (the process's CUDA context and allocator are the chat model's, counted once); a speech model's
audio tower comes with its shape (audio_fit.py). `check_fit(..., beside=...)` adds them to the chat model's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from app.engine.config import EngineConfig
from app.engine.plan.audio_fit import ASR_CONTEXT
from app.engine.plan.job import TRANSCRIPTION
from app.engine.plan.memory import FitOptions, MemoryBreakdown, memory
from app.engine.plan.shape import ModelShape

TASK_CONTEXT = 8192  # tokens per text; Qwen3's model cards embed and rerank with max_length 8192
TASK_BLOCK_SIZE = 16


def task_context(job: str | None) -> int:
    """The context a task model of `job` is loaded with."""
    return ASR_CONTEXT if job == TRANSCRIPTION else TASK_CONTEXT


def task_engine_config(
    model: str, device: str = "auto", context: int = TASK_CONTEXT, lora_adapter: str | Path | None = None
) -> EngineConfig:
    """The engine of a task model: one sequence, a KV cache for one text of `context` tokens (the KV blocks
    bound it: the model's own context if shorter, without a warning), nothing kept for reuse or speed; a
    LoRA adapter folder merged into its weights if given (Granite Speech's: the same bytes, audio_fit.py)."""
    return EngineConfig(
        model=model, device=device, max_num_seqs=1, max_num_batched_tokens=min(context, 2048),
        block_size=TASK_BLOCK_SIZE, num_kv_blocks=-(-context // TASK_BLOCK_SIZE) + 1, enable_prefix_caching=False,
        cuda_graphs=False, prefill_graphs=False, async_decode=False, weight_cache="off",
        lora_adapter=str(lora_adapter) if lora_adapter is not None else None,
    )  # fmt: skip


def task_fit_options(shape: ModelShape, job: str | None) -> FitOptions:
    """Will-it-fit's options for `shape` run as a task model of `job`, at the context it is loaded with
    (capped at the model's own)."""
    context = min(task_context(job), shape.context_length)
    return FitOptions.from_engine(task_engine_config("", context=task_context(job)), context)


@dataclass(frozen=True)
class BesideModel:
    """A task model loaded beside the chat model."""

    name: str
    job: str
    shape: ModelShape


@dataclass(frozen=True)
class BesideFit:
    name: str
    job: str
    breakdown: MemoryBreakdown  # without the runtime overhead (the chat model's)

    @property
    def total(self) -> int:
        return self.breakdown.total


def beside_fit(model: BesideModel, device_kind: str, free_bytes: int | None) -> BesideFit:
    """What `model` takes on the device beside a chat model."""
    own = memory(model.shape, task_fit_options(model.shape, model.job), device_kind, free_bytes)
    return BesideFit(model.name, model.job, dataclasses.replace(own, overhead=0))
