"""Will-it-fit: the memory plan's prediction for a model (memory.py), against what the device has free.

The budget is the device's free memory x gpu_memory_utilization (what the engine may take).
Verdicts: "fits" when the total is within the budget less the prediction margin, "tight" when it is
over that but still under the free memory, "won't fit" otherwise. The report also gives the KV blocks
the engine would allocate with the same options (`kv_blocks`, counted as the engine counts them) and
the largest context that fits.

A mixture of experts may keep only a hot set of its experts on the GPU (`experts_on_gpu`, planned
by `expert_plan.py`): the rest is in pinned host RAM (reported, not counted against the device),
and the device holds staging slots for the cold experts a step copies in. A model that takes images
adds its vision tower (vision_fit.py), a speech model its audio encoder, projector and LoRA adapter,
one that takes audio its audio tower (audio_fit.py). Task models loaded
beside the chat model (`beside`: an embedder, a reranker, a speech model, each run as task_fit.py plans
it) add theirs to the total the verdict and the largest context are judged by.

The shape comes from GGUF metadata or a config.json through the families' own parsers (shape.py),
so a prediction needs no weights: before a download it can be made from a repo's config and file
sizes. This is the module the Studio and `paddock fit` import: it re-exports what they use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from app.engine.plan.audio_fit import AudioShape as AudioShape
from app.engine.plan.audio_fit import audio_beside_gguf as audio_beside_gguf
from app.engine.plan.audio_fit import audio_from_hf_config as audio_from_hf_config
from app.engine.plan.audio_fit import is_audio_tensor as is_audio_tensor
from app.engine.plan.audio_fit import is_speech_config as is_speech_config
from app.engine.plan.device import DeviceMemory as DeviceMemory
from app.engine.plan.device import cpu_memory as cpu_memory
from app.engine.plan.device import device_memory as device_memory
from app.engine.plan.device import format_bytes as format_bytes
from app.engine.plan.expert_plan import ExpertPlan, auto_plan, fixed_plan
from app.engine.plan.job import OCR as OCR
from app.engine.plan.job import TASK_JOBS as TASK_JOBS
from app.engine.plan.job import TRANSCRIPTION as TRANSCRIPTION
from app.engine.plan.job import folder_job as folder_job
from app.engine.plan.job import gguf_job as gguf_job
from app.engine.plan.job import is_task_job as is_task_job
from app.engine.plan.job import with_audio as with_audio
from app.engine.plan.job import with_images as with_images
from app.engine.plan.memory import FitOptions as FitOptions
from app.engine.plan.memory import MemoryBreakdown as MemoryBreakdown
from app.engine.plan.memory import kv_block_bytes, kv_blocks, max_model_len, memory, resolve_kv_dtype
from app.engine.plan.shape import ModelShape as ModelShape
from app.engine.plan.shape import shape_from_checkpoint as shape_from_checkpoint
from app.engine.plan.shape import shape_from_gguf as shape_from_gguf
from app.engine.plan.shape import shape_from_hf_config as shape_from_hf_config
from app.engine.plan.task_fit import BesideFit as BesideFit
from app.engine.plan.task_fit import BesideModel as BesideModel
from app.engine.plan.task_fit import beside_fit
from app.engine.plan.task_fit import task_fit_options as task_fit_options
from app.engine.plan.vision_fit import VisionShape as VisionShape
from app.engine.plan.vision_fit import is_mmproj_name as is_mmproj_name
from app.engine.plan.vision_fit import is_vision_tensor as is_vision_tensor
from app.engine.plan.vision_fit import takes_images as takes_images
from app.engine.plan.vision_fit import vision_beside_gguf as vision_beside_gguf
from app.engine.plan.vision_fit import vision_from_hf_config as vision_from_hf_config
from app.engine.plan.vision_fit import vision_from_mmproj as vision_from_mmproj

PREDICTION_MARGIN = 0.05  # predictions are trusted to within 5%: closer than that is "tight"

FITS, TIGHT, WONT_FIT, UNKNOWN = "fits", "tight", "won't fit", "unknown"


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
    audio_source: str | None = None  # its audio side ("Granite Speech in <folder>/*.safetensors"); None: no audio
    audio_clip: str = ""  # what its audio working set encodes ("minute of audio", "30 s clip")
    kv_blocks: int = 0  # the KV blocks an engine with these options allocates (its null block included)
    block_size: int = 16
    engine_context: int = 0  # the context that engine serves: the one asked for, at most what its blocks hold
    beside: tuple[BesideFit, ...] = ()  # task models loaded beside it, counted in `total`

    @property
    def total(self) -> int:
        """Everything the verdict counts: the model's own breakdown and the task models beside it."""
        return self.breakdown.total + sum(b.total for b in self.beside)

    def summary(self) -> str:
        b = self.breakdown
        lines = [
            f"Verdict: {self.verdict} ({format_bytes(self.total)} needed; {self.device.describe()})",
            f"  weights      {format_bytes(b.weights):>10}",
            *([f"  vision       {format_bytes(b.vision):>10}  ({format_bytes(b.vision_weights)} of weights in "
               f"{self.vision_source}, {format_bytes(b.vision_activations)} to encode an image)"]
              if self.vision_source else []),
            *([f"  audio        {format_bytes(b.audio):>10}  ({format_bytes(b.audio_weights)} of encoder, projector "
               f"and adapter in {self.audio_source}, {format_bytes(b.audio_activations)} to encode a {self.audio_clip})"]
              if self.audio_source else []),
            f"  copies       {format_bytes(b.weight_cache):>10}  (CUDA: float16 / repacked weights, faster batched "
            "products)",
            f"  KV cache     {format_bytes(b.kv_cache):>10}  ({self.context_length} tokens x {self.batch}, "
            f"{self.kv_dtype})",
            f"  activations  {format_bytes(b.activations):>10}",
            *([f"  state        {format_bytes(b.state):>10}  (recurrent layers: {b.state_slots} sequence slots + "
               f"{b.state_snapshots} prefix-cache snapshots)"] if b.state else []),
            f"  overhead     {format_bytes(b.overhead):>10}",
            *(f"  beside       {format_bytes(t.total):>10}  ({t.job} model {t.name}: weights "
              f"{format_bytes(t.breakdown.weights)}, KV {format_bytes(t.breakdown.kv_cache)}"
              + (f", audio tower {format_bytes(t.breakdown.audio)}" if t.breakdown.audio else "") + ")"
              for t in self.beside),
        ]
        if b.experts_on_gpu is not None:
            lines.insert(2, f"  experts      {b.experts_on_gpu} per layer on the GPU; "
                            f"{format_bytes(b.host_experts)} in pinned host RAM, "
                            f"{format_bytes(b.expert_staging)} staging, "
                            f"~{format_bytes(int(b.pcie_bytes_per_token))} over PCIe per token")  # fmt: skip
        lines.append(f"KV blocks an engine with these settings allocates: {self.kv_blocks} of {self.block_size} "
                     f"tokens (context {self.engine_context})")
        if self.budget_bytes is not None:
            lines.append(f"Largest context that fits: {self.max_context} tokens "
                         f"(model maximum {self.model_context_length})")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["breakdown"]["total"] = self.breakdown.total
        data["breakdown"]["vision"] = self.breakdown.vision
        data["breakdown"]["audio"] = self.breakdown.audio
        for entry, task in zip(data["beside"], self.beside, strict=True):
            entry["breakdown"]["total"] = task.total
        data["total"] = self.total
        return data


def check_fit(
    shape: ModelShape,
    options: FitOptions | None = None,
    device: DeviceMemory | None = None,
    beside: tuple[BesideModel, ...] = (),
) -> FitReport:
    """The verdict for `shape` under `options` on `device` (default: the GPU if usable, else CPU RAM), with
    the task models `beside` it loaded too."""
    options = options or FitOptions()
    device = device or device_memory()
    context = options.context_length or shape.context_length
    tasks = tuple(beside_fit(model, device.kind, device.free_bytes) for model in beside)
    taken = sum(t.total for t in tasks)
    budget = None if device.free_bytes is None else int(device.free_bytes * options.gpu_memory_utilization)
    own_budget = None if budget is None else budget - taken  # what the chat model's engine may take
    experts = plan_experts(shape, options, device, own_budget)
    breakdown = memory(shape, options, device.kind, device.free_bytes, experts)
    blocks = kv_blocks(shape, options, device.kind, device.free_bytes, experts)
    total = breakdown.total + taken
    if budget is None or device.free_bytes is None:
        verdict = UNKNOWN
    elif total <= (1 - PREDICTION_MARGIN) * budget:
        verdict = FITS
    elif total <= device.free_bytes:
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
        else largest_context(shape, options, device.kind, budget, device.free_bytes, experts, taken),
        model_context_length=shape.context_length,
        vision_source=shape.vision.source if shape.vision else None,
        audio_source=f"{shape.audio.family} in {shape.audio.source}" if shape.audio else None,
        audio_clip=shape.audio.clip if shape.audio else "",
        kv_blocks=blocks,
        block_size=options.block_size,
        engine_context=max_model_len(shape, options, blocks),
        beside=tasks,
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
    everything = memory(shape, options, device.kind, device.free_bytes, full)
    room = int((1 - PREDICTION_MARGIN) * budget) - (everything.total - full.gpu_bytes)
    return auto_plan(full, room)


def largest_context(
    shape: ModelShape,
    options: FitOptions,
    device_kind: str,
    budget: int,
    free_bytes: int | None = None,
    experts: ExpertPlan | None = None,
    beside_bytes: int = 0,
) -> int:
    """The longest context (whole KV blocks, at most the model's) whose total, with `beside_bytes` of task
    models, still 'fits'."""
    allowed = int((1 - PREDICTION_MARGIN) * budget) - beside_bytes
    fixed = memory(shape, replace(options, context_length=shape.context_length), device_kind, free_bytes, experts)
    kv_dtype = resolve_kv_dtype(options.kv_dtype, device_kind)
    per_block = kv_block_bytes(shape, options.block_size, kv_dtype) * options.batch
    # Activations shrink with contexts shorter than a step; count a full step (conservative).
    room = allowed - fixed.besides_kv  # everything but the KV cache is fixed
    if room <= 0:
        return 0
    tokens = min(room // per_block * options.block_size, shape.context_length)
    return tokens // options.block_size * options.block_size
