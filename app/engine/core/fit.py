"""Will-it-fit: predicted device memory for a model, against what the device has free.

    total = weights + KV cache + activations + runtime overhead

- weights: the tensors' bytes as stored (they stay in their file's quantized layout).
- KV cache: layers x kv_heads x (key_dim + value_dim) x context x batch x bytes per
  element (float16 2, fp8 1, float32 4; "auto" is float16 on CUDA and float32 on CPU).
  With equal key and value dims this is the familiar 2 x layers x kv_heads x head_dim x ...
- activations: the engine's peak working set for one step of T = min(max_num_batched_tokens,
  context) tokens, in float32. Only one layer's intermediates are alive at a time:
      T x (2 x hidden                     residual stream and its normed copy
           + (2 x heads + 2 x kv_heads) x head_dim   q, k, v and the attention output
           + 3 x intermediate) x 4        MLP gate, up and their product
  plus the logits of the last position of each sequence: max_num_seqs x vocab x 4.
  Attention is tiled (flash-style), so no T x context score matrix is counted.
- runtime overhead: CUDA context, cuBLAS workspace and allocator slack, a constant
  (`CUDA_RUNTIME_OVERHEAD_BYTES`) to be calibrated against measured peaks on the GPU.

The budget is the device's free memory x gpu_memory_utilization (what the engine may
take). Verdicts: "fits" when the total is within the budget less the prediction margin,
"tight" when it is over that but still under the free memory, "won't fit" otherwise.
The shape comes from GGUF metadata or a config.json (`shape_from_gguf`,
`shape_from_hf_config`), so a prediction needs no weights: before a download it can be
made from a repo's config and file sizes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        value_dim = self.value_head_dim or self.head_dim
        return self.num_layers * self.num_kv_heads * (self.head_dim + value_dim) * bytes_per_element


@dataclass(frozen=True)
class FitOptions:
    context_length: int | None = None  # None: the model's own
    batch: int = 1  # sequences that each hold a full context at once
    kv_dtype: str = "auto"
    max_num_batched_tokens: int = 2048  # EngineConfig's default
    max_num_seqs: int = 32  # EngineConfig's default
    gpu_memory_utilization: float = 0.90

    def __post_init__(self) -> None:
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

    @property
    def total(self) -> int:
        return self.weights + self.weight_cache + self.kv_cache + self.activations + self.overhead


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

    def summary(self) -> str:
        b = self.breakdown
        lines = [
            f"Verdict: {self.verdict} ({format_bytes(b.total)} needed; {self.device.describe()})",
            f"  weights      {format_bytes(b.weights):>10}",
            f"  f16 copies   {format_bytes(b.weight_cache):>10}  (CUDA: faster batched products)",
            f"  KV cache     {format_bytes(b.kv_cache):>10}  ({self.context_length} tokens x {self.batch}, "
            f"{self.kv_dtype})",
            f"  activations  {format_bytes(b.activations):>10}",
            f"  overhead     {format_bytes(b.overhead):>10}",
        ]
        if self.budget_bytes is not None:
            lines.append(f"Largest context that fits: {self.max_context} tokens "
                         f"(model maximum {self.model_context_length})")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["breakdown"]["total"] = self.breakdown.total
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
    return shape.kv_bytes_per_token(KV_DTYPE_BYTES[kv_dtype]) * context_length * batch


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
    shape: ModelShape, options: FitOptions, device_kind: str, free_bytes: int | None = None
) -> MemoryBreakdown:
    context = options.context_length or shape.context_length
    kv_dtype = resolve_kv_dtype(options.kv_dtype, device_kind)
    overhead = CUDA_RUNTIME_OVERHEAD_BYTES if device_kind == "cuda" else CPU_RUNTIME_OVERHEAD_BYTES
    return MemoryBreakdown(
        weights=shape.weight_bytes,
        kv_cache=kv_cache_bytes(shape, context, options.batch, kv_dtype),
        activations=activation_bytes(shape, min(options.max_num_batched_tokens, context), options.max_num_seqs),
        overhead=overhead,
        weight_cache=weight_cache_bytes(shape, free_bytes) if device_kind == "cuda" else 0,
    )


def check_fit(shape: ModelShape, options: FitOptions | None = None, device: DeviceMemory | None = None) -> FitReport:
    """The verdict for `shape` under `options` on `device` (default: the GPU if usable, else CPU RAM)."""
    options = options or FitOptions()
    device = device or device_memory()
    context = options.context_length or shape.context_length
    breakdown = predict_memory(shape, options, device.kind, device.free_bytes)
    budget = None if device.free_bytes is None else int(device.free_bytes * options.gpu_memory_utilization)
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
        max_context=0 if budget is None else largest_context(shape, options, device.kind, budget, device.free_bytes),
        model_context_length=shape.context_length,
    )


def largest_context(
    shape: ModelShape, options: FitOptions, device_kind: str, budget: int, free_bytes: int | None = None
) -> int:
    """The longest context (whole KV blocks, at most the model's) whose total still 'fits'."""
    allowed = int((1 - PREDICTION_MARGIN) * budget)
    fixed = predict_memory(shape, FitOptions(**{**asdict(options), "context_length": shape.context_length}),
                           device_kind, free_bytes)
    kv_dtype = resolve_kv_dtype(options.kv_dtype, device_kind)
    per_token = shape.kv_bytes_per_token(KV_DTYPE_BYTES[kv_dtype]) * options.batch
    # Activations shrink with contexts shorter than a step; count a full step (conservative).
    room = allowed - fixed.weights - fixed.weight_cache - fixed.activations - fixed.overhead
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
    return ModelShape(
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
    )


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
    intermediate = cfg.get("intermediate_size")
    if cfg.get("num_experts_per_tok") and cfg.get("moe_intermediate_size"):
        intermediate = int(cfg["moe_intermediate_size"]) * int(cfg["num_experts_per_tok"])
    return ModelShape(
        architecture=str(architectures[0]),
        num_layers=int(key("num_hidden_layers")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(intermediate or 4 * hidden),
        vocab_size=int(key("vocab_size")),
        context_length=int(cfg.get("max_position_embeddings") or 4096),
        weight_bytes=int(weight_bytes),
    )


def shape_from_checkpoint(path: str | os.PathLike[str]) -> ModelShape:
    """The shape of a local checkpoint (GGUF file or safetensors folder), through the loader."""
    from app.engine.loader.weights import open_checkpoint

    checkpoint = open_checkpoint(path)
    weight_bytes = sum(t.nbytes for t in checkpoint.tensors.values())
    if checkpoint.format == "gguf":
        return shape_from_gguf(checkpoint.metadata, weight_bytes)
    return shape_from_hf_config(checkpoint.hf_config, weight_bytes)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
