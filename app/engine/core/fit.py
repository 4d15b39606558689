"""Will-it-fit: predicted device memory for a model, against what the device has free.

    total = weights + vision tower + KV cache + activations + runtime overhead

- weights: the tensors' bytes as stored (they stay in their file's quantized layout).
- KV cache: attention layers x kv_heads x (key_dim + value_dim) x context x batch x bytes per
  element (float16 2, fp8 1, float32 4; "auto" is float16 on CUDA and float32 on CPU); fp8
  adds one float32 scale per layer, K or V, KV head and block of 16 tokens (so it holds just
  under twice float16's context in the same memory).
  With equal key and value dims this is the familiar 2 x layers x kv_heads x head_dim x ...
- recurrent state (hybrid models: Gated DeltaNet, Mamba-2 layers): a fixed float32 state per
  sequence (the model config's state_bytes_per_sequence), in rows of one array per layer: a null
  row, a slot per sequence (max_num_seqs) and, with prefix caching, the prefix cache's snapshots
  (`state_rows`: the engine sizes them by the same rule, core/memory_plan.py).
- activations: the engine's peak working set for one step of T = min(max_num_batched_tokens,
  context) tokens, in float32. Only one layer's intermediates are alive at a time:
      T x (2 x hidden                     residual stream and its normed copy
           + (2 x heads + 2 x kv_heads) x head_dim   q, k, v and the attention output
           + 3 x intermediate) x 4        MLP gate, up and their product
  plus the logits of the last position of each sequence: max_num_seqs x vocab x 4.
  Attention is tiled (flash-style), so no T x context score matrix is counted.
- vision tower (a model that takes images): its weights as stored (the mmproj GGUF beside a
  GGUF, found as the loader finds it, or a Hugging Face folder's vision tensors) and the working
  set to encode one image (vision_fit.py).
- runtime overhead: CUDA context, cuBLAS workspace and allocator slack, a constant
  (`CUDA_RUNTIME_OVERHEAD_BYTES`) to be calibrated against measured peaks on the GPU.

A mixture of experts may keep only a hot set of its experts on the GPU (`experts_on_gpu`, planned
by `expert_plan.py`): the rest is in pinned host RAM (reported, not counted against the device),
and the device holds staging slots for the cold experts a step copies in.

The budget is the device's free memory x gpu_memory_utilization (what the engine may
take). Verdicts: "fits" when the total is within the budget less the prediction margin,
"tight" when it is over that but still under the free memory, "won't fit" otherwise.
The shape comes from GGUF metadata or a config.json (`shape_from_gguf`,
`shape_from_hf_config`), so a prediction needs no weights: before a download it can be
made from a repo's config and file sizes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from app.engine.core.expert_plan import ExpertPlan, auto_plan, fixed_plan, parse_experts_on_gpu

# the Studio reaches the vision side of will-it-fit through this public module
from app.engine.core.vision_fit import VisionShape as VisionShape
from app.engine.core.vision_fit import is_mmproj_name as is_mmproj_name
from app.engine.core.vision_fit import is_vision_tensor as is_vision_tensor
from app.engine.core.vision_fit import takes_images as takes_images
from app.engine.core.vision_fit import vision_beside_gguf as vision_beside_gguf
from app.engine.core.vision_fit import vision_from_hf_config as vision_from_hf_config
from app.engine.core.vision_fit import vision_from_mmproj as vision_from_mmproj

MiB = 1024**2
GiB = 1024**3

# CUDA context (~500 MiB on Hopper), cuBLAS workspace and the caching allocator's slack.
# A first guess; calibrate against measured peaks on the H200 (issue 5 asks for <= 5% error).
CUDA_RUNTIME_OVERHEAD_BYTES = 768 * MiB
# The Python process around a CPU engine: interpreter, numpy, tokenizer tables.
CPU_RUNTIME_OVERHEAD_BYTES = 384 * MiB
DENSE_CACHE_FRACTION = 0.35  # the CUDA backend's "auto" share of free memory for float16 copies
PREDICTION_MARGIN = 0.05  # predictions are trusted to within 5%: closer than that is "tight"
ACTIVATION_BYTES = 4  # the engine keeps activations in float32
BLOCK_SIZE = 16  # contexts are reported in whole KV blocks

KV_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
_KV_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
                     "half": "float16", "bf16": "bfloat16", "f8": "fp8", "fp8_e4m3": "fp8"}

FITS, TIGHT, WONT_FIT, UNKNOWN = "fits", "tight", "won't fit", "unknown"

CPU_CACHE_BUDGET_BYTES = 2 * GiB  # the CPU engine's KV + recurrent state budget without kv_cache_bytes
# Hybrid models without --state-snapshot-gb: the prefix cache's state snapshots may take this share
# of the cache budget, and no more than SNAPSHOTS_PER_SEQ per sequence slot (beyond that, rows would
# only hold snapshots LRU eviction drops before anyone asks for them).
STATE_SNAPSHOT_SHARE = 0.2
SNAPSHOTS_PER_SEQ = 8


@dataclass(frozen=True)
class ModelShape:
    """What the memory prediction needs to know about a model."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # key dimension per head
    intermediate_size: int
    vocab_size: int
    context_length: int  # the model's own maximum
    weight_bytes: int
    value_head_dim: int | None = None  # None: same as head_dim
    num_experts: int = 0  # per layer; 0: a dense model
    experts_used: int = 0  # per token
    expert_bytes: int = 0  # all layers' expert tensors, part of weight_bytes
    vision: VisionShape | None = None  # the image tower the engine loads beside it (not in weight_bytes)
    # hybrid models: the layers that keep a KV cache (None: all), one sequence's recurrent state
    kv_layers: int | None = None
    state_bytes_per_sequence: int = 0

    @property
    def num_kv_layers(self) -> int:
        return self.num_layers if self.kv_layers is None else self.kv_layers

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        value_dim = self.value_head_dim or self.head_dim
        return self.num_kv_layers * self.num_kv_heads * (self.head_dim + value_dim) * bytes_per_element


@dataclass(frozen=True)
class FitOptions:
    context_length: int | None = None  # None: the model's own
    batch: int = 1  # sequences that each hold a full context at once
    kv_dtype: str = "auto"
    max_num_batched_tokens: int = 2048  # EngineConfig's default
    max_num_seqs: int = 32  # EngineConfig's default
    gpu_memory_utilization: float = 0.90
    experts_on_gpu: int | str | None = None  # experts per layer kept on the GPU: a number, "auto", "all"
    prefix_caching: bool = True  # hybrid models: the prefix cache keeps recurrent-state snapshots
    state_snapshot_gb: float | None = None  # their memory (None: the engine's default rule, `state_rows`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts_on_gpu", parse_experts_on_gpu(self.experts_on_gpu))
        if self.context_length is not None and self.context_length < 1:
            raise ValueError(f"context length must be at least 1, not {self.context_length}")
        if self.batch < 1 or self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("batch, max_num_batched_tokens and max_num_seqs must be at least 1")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in [0.05, 1], not {self.gpu_memory_utilization}")
        resolve_kv_dtype(self.kv_dtype, "cpu")  # fail early on an unknown name


@dataclass(frozen=True)
class DeviceMemory:
    kind: str  # "cuda" | "cpu"
    name: str
    free_bytes: int | None  # None: could not be read
    total_bytes: int | None

    def describe(self) -> str:
        if self.free_bytes is None:
            return f"{self.name}: free memory unknown"
        total = f" of {format_bytes(self.total_bytes)}" if self.total_bytes else ""
        return f"{self.name}: {format_bytes(self.free_bytes)} free{total}"


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: int
    kv_cache: int
    activations: int
    overhead: int
    weight_cache: int = 0  # CUDA: float16 copies of the projections (memory traded for speed)
    expert_staging: int = 0  # slots for cold experts copied in per step
    host_experts: int = 0  # experts kept in pinned host RAM (not device memory: not in the total)
    experts_on_gpu: int | None = None  # per layer, when only a hot set is resident
    pcie_bytes_per_token: float = 0.0  # cold experts copied in per decoded token (uniform routing)
    vision_weights: int = 0  # the image tower's weights
    vision_activations: int = 0  # its working set while it encodes one image
    state_cache: int = 0  # hybrid models: the recurrent state rows (slots and snapshots)
    state_slots: int = 0
    state_snapshots: int = 0

    @property
    def vision(self) -> int:
        return self.vision_weights + self.vision_activations

    @property
    def total(self) -> int:
        return (
            self.weights + self.weight_cache + self.expert_staging + self.kv_cache + self.activations + self.overhead
            + self.vision + self.state_cache
        )


@dataclass(frozen=True)
class FitReport:
    verdict: str  # FITS | TIGHT | WONT_FIT | UNKNOWN
    breakdown: MemoryBreakdown
    device: DeviceMemory
    budget_bytes: int | None  # free x gpu_memory_utilization
    context_length: int
    batch: int
    kv_dtype: str
    max_context: int  # the largest context (whole blocks, <= the model's) that "fits"; 0: none
    model_context_length: int
    vision_source: str | None = None  # the file the vision tower comes from; None: a text-only model

    def summary(self) -> str:
        b = self.breakdown
        lines = [
            f"Verdict: {self.verdict} ({format_bytes(b.total)} needed; {self.device.describe()})",
            f"  weights      {format_bytes(b.weights):>10}",
            *([f"  vision       {format_bytes(b.vision):>10}  ({format_bytes(b.vision_weights)} of weights in "
               f"{self.vision_source}, {format_bytes(b.vision_activations)} to encode an image)"]
              if self.vision_source else []),
            f"  f16 copies   {format_bytes(b.weight_cache):>10}  (CUDA: faster batched products)",
            f"  KV cache     {format_bytes(b.kv_cache):>10}  ({self.context_length} tokens x {self.batch}, "
            f"{self.kv_dtype})",
            *([f"  state        {format_bytes(b.state_cache):>10}  (recurrent layers: {b.state_slots} "
               f"sequence slots + {b.state_snapshots} prefix-cache snapshots)"] if b.state_cache else []),
            f"  activations  {format_bytes(b.activations):>10}",
            f"  overhead     {format_bytes(b.overhead):>10}",
        ]
        if b.experts_on_gpu is not None:
            lines.insert(2, f"  experts      {b.experts_on_gpu} per layer on the GPU; "
                            f"{format_bytes(b.host_experts)} in pinned host RAM, "
                            f"{format_bytes(b.expert_staging)} staging, "
                            f"~{format_bytes(int(b.pcie_bytes_per_token))} over PCIe per token")  # fmt: skip
        if self.budget_bytes is not None:
            lines.append(f"Largest context that fits: {self.max_context} tokens "
                         f"(model maximum {self.model_context_length})")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["breakdown"]["total"] = self.breakdown.total
        data["breakdown"]["vision"] = self.breakdown.vision
        return data


def resolve_kv_dtype(name: str, device_kind: str) -> str:
    key = name.lower()
    if key == "auto":
        return "float16" if device_kind == "cuda" else "float32"
    key = _KV_DTYPE_ALIASES.get(key, key)
    if key not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {name!r}; choose auto, {', '.join(KV_DTYPE_BYTES)}")
    return key


def kv_cache_bytes(shape: ModelShape, context_length: int, batch: int, kv_dtype: str) -> int:
    """KV bytes for `batch` sequences of `context_length` tokens; FP8 adds its float32 scale per
    (layer, K or V, KV head, block of BLOCK_SIZE tokens), as backend/fp8_kv.py keeps them."""
    elements = shape.kv_bytes_per_token(KV_DTYPE_BYTES[kv_dtype]) * context_length
    return (elements + fp8_scale_bytes(shape, context_length, kv_dtype)) * batch


def fp8_scale_bytes(shape: ModelShape, context_length: int, kv_dtype: str) -> int:
    if kv_dtype != "fp8":
        return 0
    return 2 * shape.num_kv_layers * shape.num_kv_heads * 4 * -(-context_length // BLOCK_SIZE)


def state_rows(
    per_sequence: int, max_num_seqs: int, prefix_caching: bool, snapshot_gb: float | None, budget: int
) -> tuple[int, int]:
    """(sequence slots, snapshot rows) of a hybrid model's recurrent state; (0, 0) without one.
    Snapshots only with prefix caching: `snapshot_gb` of them, else STATE_SNAPSHOT_SHARE of the
    cache `budget` (the memory the KV cache and the state share), at most SNAPSHOTS_PER_SEQ a slot."""
    if not per_sequence:
        return 0, 0
    snapshots = 0
    if prefix_caching:
        if snapshot_gb is not None:
            snapshots = int(snapshot_gb * GiB) // per_sequence
        else:
            share = int(max(budget, 0) * STATE_SNAPSHOT_SHARE) // per_sequence
            snapshots = min(share, SNAPSHOTS_PER_SEQ * max_num_seqs)
    return max_num_seqs, snapshots


def state_bytes(per_sequence: int, slots: int, snapshots: int) -> int:
    """The recurrent state arrays' bytes: the null row, the slots and the snapshots."""
    return (1 + slots + snapshots) * per_sequence if slots else 0


def activation_bytes(shape: ModelShape, step_tokens: int, max_num_seqs: int) -> int:
    per_token = (
        2 * shape.hidden_size
        + (2 * shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        + 3 * shape.intermediate_size
    )
    logits = max_num_seqs * shape.vocab_size
    return (step_tokens * per_token + logits) * ACTIVATION_BYTES


def weight_copy_bytes(shape: ModelShape) -> int:
    """float16 copies of every projection and the output head: what the CUDA backend's
    weight cache (app/engine/backend/cuda/dense.py) holds when it is on."""
    s = shape
    per_layer = 2 * s.num_heads * s.head_dim + 2 * s.num_kv_heads * s.head_dim + 3 * s.intermediate_size
    return 2 * (s.num_layers * per_layer * s.hidden_size + s.vocab_size * s.hidden_size)


def use_weight_cache(weight_bytes: int, copy_bytes: int, free_bytes: int | None) -> bool:
    """The engine's "auto" rule: keep float16 copies only on a GPU with room to spare (at least
    twice the weights plus their copies free), so they never take the KV cache's memory."""
    return free_bytes is not None and free_bytes >= 2 * (weight_bytes + copy_bytes)


def weight_cache_bytes(shape: ModelShape, free_bytes: int | None) -> int:
    """Predicted bytes of float16 copies under the "auto" rule, capped at the backend's share."""
    copies = weight_copy_bytes(shape)
    if not use_weight_cache(shape.weight_bytes, copies, free_bytes):
        return 0
    return min(copies, int(DENSE_CACHE_FRACTION * free_bytes))


def predict_memory(
    shape: ModelShape,
    options: FitOptions,
    device_kind: str,
    free_bytes: int | None = None,
    experts: ExpertPlan | None = None,
) -> MemoryBreakdown:
    """With `experts` (a hot set smaller than all experts), only the hot set counts as weights."""
    context = options.context_length or shape.context_length
    kv_dtype = resolve_kv_dtype(options.kv_dtype, device_kind)
    overhead = CUDA_RUNTIME_OVERHEAD_BYTES if device_kind == "cuda" else CPU_RUNTIME_OVERHEAD_BYTES
    offload: dict[str, Any] = {}
    if experts is not None and not experts.all_on_gpu:
        offload = dict(
            expert_staging=experts.staging_bytes,
            host_experts=experts.host_bytes,
            experts_on_gpu=experts.on_gpu,
            pcie_bytes_per_token=experts.pcie_bytes_per_token,
        )
    breakdown = MemoryBreakdown(
        weights=shape.weight_bytes - offload.get("host_experts", 0),
        **offload,
        kv_cache=kv_cache_bytes(shape, context, options.batch, kv_dtype),
        activations=activation_bytes(shape, min(options.max_num_batched_tokens, context), options.max_num_seqs),
        overhead=overhead,
        weight_cache=weight_cache_bytes(shape, free_bytes) if device_kind == "cuda" else 0,
        vision_weights=shape.vision.weight_bytes if shape.vision else 0,
        vision_activations=shape.vision.activation_bytes() if shape.vision else 0,
    )
    if not shape.state_bytes_per_sequence:
        return breakdown
    # the engine's cache budget: CPU, a constant; CUDA, what is left after the weights and a step
    if device_kind != "cuda":
        budget = CPU_CACHE_BUDGET_BYTES
    elif free_bytes is None:
        budget = 0
    else:
        budget = int((free_bytes - breakdown.weights - breakdown.weight_cache - breakdown.vision)
                     * options.gpu_memory_utilization) - breakdown.activations  # fmt: skip
    slots, snapshots = state_rows(shape.state_bytes_per_sequence, options.max_num_seqs, options.prefix_caching,
                                  options.state_snapshot_gb, budget)  # fmt: skip
    return replace(breakdown, state_cache=state_bytes(shape.state_bytes_per_sequence, slots, snapshots),
                   state_slots=slots, state_snapshots=snapshots)  # fmt: skip


def check_fit(shape: ModelShape, options: FitOptions | None = None, device: DeviceMemory | None = None) -> FitReport:
    """The verdict for `shape` under `options` on `device` (default: the GPU if usable, else CPU RAM)."""
    options = options or FitOptions()
    device = device or device_memory()
    context = options.context_length or shape.context_length
    budget = None if device.free_bytes is None else int(device.free_bytes * options.gpu_memory_utilization)
    experts = plan_experts(shape, options, device, budget)
    breakdown = predict_memory(shape, options, device.kind, device.free_bytes, experts)
    if budget is None or device.free_bytes is None:
        verdict = UNKNOWN
    elif breakdown.total <= (1 - PREDICTION_MARGIN) * budget:
        verdict = FITS
    elif breakdown.total <= device.free_bytes:
        verdict = TIGHT
    else:
        verdict = WONT_FIT
    return FitReport(
        verdict=verdict,
        breakdown=breakdown,
        device=device,
        budget_bytes=budget,
        context_length=context,
        batch=options.batch,
        kv_dtype=resolve_kv_dtype(options.kv_dtype, device.kind),
        max_context=0
        if budget is None
        else largest_context(shape, options, device.kind, budget, device.free_bytes, experts),
        model_context_length=shape.context_length,
        vision_source=shape.vision.source if shape.vision else None,
    )


def plan_experts(
    shape: ModelShape, options: FitOptions, device: DeviceMemory, budget: int | None
) -> ExpertPlan | None:
    """The expert placement `options.experts_on_gpu` asks for (None for a dense model left alone);
    "auto": the largest hot set that leaves the rest of the prediction within the margin."""
    requested = options.experts_on_gpu
    if not shape.num_experts:
        if requested not in (None, "all", "auto"):
            raise ValueError(f"--experts-on-gpu: {shape.architecture} has no experts")
        return None
    args = (shape.num_layers, shape.num_experts, shape.experts_used, shape.expert_bytes)
    if requested != "auto":
        return fixed_plan(*args, requested)
    full = fixed_plan(*args, "all")
    if budget is None:
        return full
    everything = predict_memory(shape, options, device.kind, device.free_bytes, full)
    room = int((1 - PREDICTION_MARGIN) * budget) - (everything.total - full.gpu_bytes)
    return auto_plan(full, room)


def largest_context(
    shape: ModelShape,
    options: FitOptions,
    device_kind: str,
    budget: int,
    free_bytes: int | None = None,
    experts: ExpertPlan | None = None,
) -> int:
    """The longest context (whole KV blocks, at most the model's) whose total still 'fits'."""
    allowed = int((1 - PREDICTION_MARGIN) * budget)
    fixed = predict_memory(shape, FitOptions(**{**asdict(options), "context_length": shape.context_length}),
                           device_kind, free_bytes, experts)
    kv_dtype = resolve_kv_dtype(options.kv_dtype, device_kind)
    # per token, FP8's per-block scales rounded up (conservative)
    per_token = (shape.kv_bytes_per_token(KV_DTYPE_BYTES[kv_dtype]) + -(-fp8_scale_bytes(shape, BLOCK_SIZE, kv_dtype)
                                                                     // BLOCK_SIZE)) * options.batch
    # Activations shrink with contexts shorter than a step; count a full step (conservative).
    room = allowed - (fixed.total - fixed.kv_cache)  # everything but the KV cache is fixed
    if room <= 0 or per_token <= 0:
        return 0
    tokens = min(room // per_token, shape.context_length)
    return tokens // BLOCK_SIZE * BLOCK_SIZE


def device_memory() -> DeviceMemory:
    """Free memory of GPU 0 through CuPy when a GPU is usable, else the CPU's available RAM."""
    return _cuda_memory() or cpu_memory()


def _cuda_memory() -> DeviceMemory | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        free, total = cupy.cuda.runtime.memGetInfo()
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    except Exception:  # no driver or no device: CuPy imports fine but every call fails
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceMemory("cuda", name, int(free), int(total))


def cpu_memory(meminfo: str | os.PathLike[str] = "/proc/meminfo") -> DeviceMemory:
    """Available RAM from /proc/meminfo (Linux), else from sysconf; 'unknown' when neither works."""
    name = "no GPU: CPU RAM"
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines() if ":" in line)
        kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731 - values are "12345 kB"
        return DeviceMemory("cpu", name, kib("MemAvailable"), kib("MemTotal"))
    except (OSError, KeyError, ValueError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return DeviceMemory("cpu", name, os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page)
    except (AttributeError, OSError, ValueError):
        return DeviceMemory("cpu", name, None, None)


def _first(value: Any) -> int:
    """GGUF stores some per-layer values as arrays (head counts, FFN sizes): take the largest."""
    if hasattr(value, "__len__") and not isinstance(value, str):
        return int(max(value))
    return int(value)


def shape_from_gguf(meta: Mapping[str, Any], weight_bytes: int, vocab_size: int | None = None) -> ModelShape:
    """The shape from GGUF key-values (`{arch}.block_count` ...); vocab from the token list's length."""
    arch = str(meta.get("general.architecture") or "")
    if not arch:
        raise ValueError("GGUF metadata has no general.architecture")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}: cannot predict memory for this model")
        return value

    hidden = _first(key("embedding_length"))
    heads = _first(key("attention.head_count"))
    head_dim = _first(key("attention.key_length", hidden // heads))
    ffn = meta.get(f"{arch}.feed_forward_length")
    if not ffn:  # mixture of experts: the experts used per token run side by side
        ffn = _first(key("expert_feed_forward_length")) * _first(key("expert_used_count", 1))
    if vocab_size is None:
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab_size = len(tokens) if tokens is not None else _first(key("vocab_size"))
    experts = _first(meta.get(f"{arch}.expert_count") or 0)
    used = _first(meta.get(f"{arch}.expert_used_count") or 0)
    expert_ff = _first(meta.get(f"{arch}.expert_feed_forward_length") or 0)
    shape = ModelShape(
        architecture=arch,
        num_layers=_first(key("block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=_first(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=_first(ffn),
        vocab_size=int(vocab_size),
        context_length=_first(key("context_length", 4096)),
        weight_bytes=int(weight_bytes),
        value_head_dim=_first(key("attention.value_length", head_dim)),
        num_experts=experts,
        experts_used=used,
        **_recurrent_gguf(meta, arch, int(vocab_size)),
    )
    return with_estimated_expert_bytes(shape, expert_ff)


def shape_from_hf_config(config: Mapping[str, Any], weight_bytes: int) -> ModelShape:
    """The shape from a Hugging Face config.json (multimodal wrappers: its text_config)."""
    architectures = config.get("architectures") or [config.get("model_type", "unknown")]
    cfg = config.get("text_config") or config

    def key(name: str, default: Any = None) -> Any:
        value = cfg.get(name, default)
        if value is None:
            raise ValueError(f"config.json lacks {name}: cannot predict memory for this model")
        return value

    hidden = int(key("hidden_size"))
    heads = int(key("num_attention_heads"))
    hybrid = _recurrent_hf(config, cfg)
    layers = hybrid.pop("num_layers", None) or int(key("num_hidden_layers"))  # Nemotron-H: its pattern's length
    intermediate = cfg.get("intermediate_size")
    expert_ff = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    if cfg.get("num_experts_per_tok") and cfg.get("moe_intermediate_size"):
        intermediate = int(cfg["moe_intermediate_size"]) * int(cfg["num_experts_per_tok"])
    shape = ModelShape(
        architecture=str(architectures[0]),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(intermediate or 4 * hidden),
        vocab_size=int(key("vocab_size")),
        context_length=int(cfg.get("max_position_embeddings") or 4096),
        weight_bytes=int(weight_bytes),
        num_experts=int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0),
        experts_used=int(cfg.get("num_experts_per_tok") or 0),
        **hybrid,
    )
    return with_estimated_expert_bytes(shape, expert_ff)


# keys that only hybrid (recurrent-layer) models' configs have: only those pay for the family's parser
_HYBRID_HF_KEYS = ("linear_conv_kernel_dim", "hybrid_override_pattern", "mamba_d_conv", "mamba_n_heads",
                   "mamba_num_heads", "layer_types")  # fmt: skip


def _recurrent_gguf(meta: Mapping[str, Any], arch: str, vocab_size: int) -> dict[str, int]:
    """A hybrid GGUF's KV layers and per-sequence state, by its family's own config parser."""
    if f"{arch}.ssm.conv_kernel" not in meta:
        return {}
    fields = _recurrent_fields(arch, lambda fam: fam.config_from_gguf(dict(meta), vocab_size))
    fields.pop("num_layers", None)  # block_count says it (with any trailing MTP blocks)
    return fields


def _recurrent_hf(config: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, int]:
    if not any(key in text for key in _HYBRID_HF_KEYS):
        return {}
    architectures = config.get("architectures") or [config.get("model_type", "")]
    return _recurrent_fields(str(architectures[0]), lambda fam: fam.config_from_hf(dict(config)))


def _recurrent_fields(architecture: str, parse: Any) -> dict[str, int]:
    """`kv_layers` and `state_bytes_per_sequence` of a hybrid model; {} for one the engine cannot
    parse (its load would fail anyway) or without recurrent layers."""
    from app.engine.models.registry import family

    try:
        cfg = parse(family(architecture))
    except (ValueError, KeyError, TypeError):
        return {}
    if not cfg.is_hybrid:
        return {}
    return {"kv_layers": len(cfg.attention_layers), "state_bytes_per_sequence": cfg.state_bytes_per_sequence,
            "num_layers": cfg.num_layers}  # fmt: skip


def with_estimated_expert_bytes(shape: ModelShape, expert_ff: int) -> ModelShape:
    """Without the tensors (a hub header or config), the experts' share of the weight bytes is their
    share of the parameters: 3 x layers x experts x ff x hidden of the whole count."""
    if not shape.num_experts or not expert_ff:
        return shape
    s = shape
    experts = 3 * s.num_layers * s.num_experts * expert_ff * s.hidden_size
    attention = s.num_layers * s.hidden_size * (2 * s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    total = experts + attention + 2 * s.vocab_size * s.hidden_size
    return replace(shape, expert_bytes=int(s.weight_bytes * experts / total))


def shape_from_checkpoint(path: str | os.PathLike[str]) -> ModelShape:
    """The shape of a local checkpoint (GGUF file or safetensors folder), through the loader."""
    from app.engine.loader.weights import open_checkpoint

    checkpoint = open_checkpoint(path)
    weight_bytes = sum(t.nbytes for t in checkpoint.tensors.values())  # the text model's (the loader's names)
    if checkpoint.format == "gguf":
        shape = shape_from_gguf(checkpoint.metadata, weight_bytes)
        shape = replace(shape, vision=vision_beside_gguf(checkpoint.path, checkpoint.architecture))
    else:
        shape = shape_from_hf_config(checkpoint.hf_config, weight_bytes)
        shape = replace(shape, vision=_hf_folder_vision(Path(checkpoint.path), checkpoint.hf_config or {}))
    if shape.num_experts:  # the tensors are here: their exact bytes, not an estimate
        expert_bytes = sum(t.nbytes for name, t in checkpoint.tensors.items() if "_exps" in name)
        shape = replace(shape, expert_bytes=expert_bytes)
    return shape


def _hf_folder_vision(folder: Path, config: Mapping[str, Any]) -> VisionShape | None:
    """The vision tensors of a Hugging Face folder, by their names in the safetensors headers."""
    from app.engine.loader.safetensors import read_safetensors_file, weight_files

    if "vision_config" not in config:
        return None
    weight_bytes = sum(
        tensor.data.nbytes
        for file in weight_files(folder)
        for name, tensor in read_safetensors_file(file).items()
        if is_vision_tensor(name)
    )
    processor_file = folder / "preprocessor_config.json"
    processor = json.loads(processor_file.read_text()) if processor_file.is_file() else None
    return vision_from_hf_config(config, weight_bytes, f"{folder.name}/*.safetensors", processor)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
