"""How the API server and the Studio talk to an engine: the `EngineClient` protocol, the
request it takes, what it reports (`ModelInfo`, `EngineStats`) and the errors it raises.

A leaf module (it imports only the request types), so the engine, its in-process client
(`core/async_engine.py`) and the server all depend on it and not on each other. `AsyncEngine`
implements the protocol; tests may implement it with fakes. Callers submit a `GenerationRequest` and iterate the
`RequestOutput` deltas; breaking out of the iteration (or cancelling the task) aborts
the request and frees its KV blocks.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from app.engine.images import ImageInput
from app.engine.request import RequestOutput
from app.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from app.engine.loader.tokenizer import Tokenizer
    from app.engine.text.chat_template import ChatTemplate


@dataclass
class GenerationRequest:
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str = "default"  # fairness key: one per API key / client / Studio tab
    images: list[ImageInput] = field(default_factory=list)  # one per run of image tokens, in order


@dataclass(frozen=True)
class ModelInfo:
    """What is loaded, for /v1/models, the status bar and will-it-fit."""

    name: str  # the id clients use in "model"
    path: str
    architecture: str
    quantization: str  # e.g. "Q4_K_M" or "mixed: Q5_0, Q4_K, Q6_K, Q8_0, F32"
    parameters: int
    context_length: int  # the engine's max_model_len (may be below the model's own)
    device: str  # "cpu" or "cuda:0 (NVIDIA H200)"
    supports_vision: bool = False  # a vision tower is loaded: the prompt may hold images
    supports_audio: bool = False  # an audio tower is loaded: the prompt may hold audio clips
    quant_mix: tuple[tuple[str, int], ...] = ()  # (format, tensor count), most tensors first


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and the Studio status bar."""

    requests_running: int
    requests_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    last_batch_size: int
    max_batch_size_seen: int
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    prefix_cache_hit_tokens_total: int = 0
    device_memory_used_bytes: int = 0
    # prompt tokens served from each KV tier: "device" (the radix tree), "host", "disk"
    prefix_cache_hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    # KV bytes copied between tiers: "device_to_host", "host_to_device", "to_disk", "from_disk"
    kv_bytes_moved: dict[str, int] = field(default_factory=dict)
    kv_evicted_blocks_total: int = 0  # cached blocks evicted from the device pool
    preemptions_total: int = 0  # running requests sent back to wait (recomputed later)
    # bytes of MoE experts copied from host RAM to the device over PCIe (--experts-on-gpu)
    expert_bytes_copied_total: int = 0
    # speculative decoding: tokens drafted and verified, and of those accepted (app/engine/spec/)
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0


class ContextOverflowError(ValueError):
    """The prompt plus the requested output does not fit the context: never trimmed."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length
        super().__init__(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the prompt or max_tokens."
        )


class EngineClient(Protocol):
    model: ModelInfo
    tokenizer: Tokenizer
    chat_template: ChatTemplate

    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs; raises ContextOverflowError before any work."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def shutdown(self) -> None: ...


class EngineDeadError(RuntimeError):
    """The engine loop failed while running this request; the engine keeps serving others."""


class RequestFailedError(EngineDeadError):
    """This request alone failed inside the engine (its sampling or its output); the others go on."""
