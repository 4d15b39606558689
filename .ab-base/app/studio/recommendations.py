"""Models to suggest: a curated table of GGUFs the engine runs, usable offline.

Each entry names one GGUF on the Hugging Face hub and carries what will-it-fit needs: its size and the
GGUF header keys that describe its shape, as llama.cpp's converter writes them (for the hybrids the
recurrent layers' sizes and which layers are attention; for Gemma 4 the sliding and global layers' KV
shapes and the layers that share KV). Its `shape` is what `shape_from_gguf` reads from that header,
through the family's own parser, so the verdict for this machine is `paddock fit`'s before anything is
downloaded (tests/ui/test_recommendations.py writes files with these headers and compares the two), at
the context the Studio will load it with (fit_estimate.py), with the decode speed to expect here. What
each model does (`job`: chat, embeddings, reranking) is read from the same header, as the Models pane
reads an installed file's. The task models are judged as the engine runs one beside the chat model
(plan/task_fit.py). A projector the hub tab fetches beside a GGUF is counted once it is on disk.

Where the numbers come from (sizes are the file's bytes; the tensors are counted as the whole file,
which overstates them by the header's few MB):
- Qwen2.5, Gemma 3, Llama, Qwen3 rows: the hub's listed file sizes (2026-11), rounded to the MB.
- Qwen3.5 4B / 9B / 27B / 35B-A3B (unsloth's Q4_K_M): exact bytes, pinned with their SHA-256 in a public
  llama.cpp model catalog (koil's LocalModelCatalog.java) whose figures for the files of the rows above
  agree with the hub's to the byte (Qwen3 4B 2,497,280,256; Qwen3 8B 5,027,783,488). Shapes: the models'
  config.json as quoted in public code (Qwen3.5-4B: vllm-metal's tests; 27B: a Qwen3_5Config written out
  in full; 35B-A3B: transformers 5.24's Qwen3_5MoeTextConfig defaults, documented as that checkpoint's;
  9B: its Qwen3_5TextConfig defaults, "Qwen3.5-9B style"), with the layer counts the cards give
  (4B/9B: 24 Gated DeltaNet + 8 attention layers; 27B: 48 + 16; 35B-A3B: 30 + 10).
- Nemotron 3 Nano 30B-A3B (unsloth's Q4_K_M): 24,574,373,664 bytes as a public app's model list pins it
  (another's "~24.6 GB file"; bartowski's Q4_K_M of the same model is 24,655,899,872). Shape: NVIDIA's
  config.json, quoted verbatim in several public projects (hybrid_override_pattern, 2688 wide, Mamba-2
  64 x 64 heads, 8 groups, state 128; 128 experts of 1856, 6 used, shared 3712) and Megatron's example.
- Gemma 4 E4B (unsloth's Q4_K_M): 4,977,171,584 bytes, pinned with its SHA-256 at the repo's revision
  bfc15c38 by two public projects (apps list an earlier upload at 4,977,169,568). Shape: the E4B
  config.json as quoted in several public projects (42 layers, 18 of them sharing KV, 24 owning a cache).
- Qwen3-Embedding 0.6B Q8_0 (Qwen's own GGUF repo): 639,150,592 bytes, pinned by a public catalog and the
  same file's LFS pointer in another upload. Qwen3-Reranker 0.6B Q8_0: 639,153,088 bytes, from its repo's
  model card, converted with llama.cpp's rerank head (`cls.output.weight`, pooling type RANK). Shapes: the
  Qwen3-Embedding-0.6B config.json (both cards: 28 layers, 32K context).
- Gemma 4 31B and 26B-A4B (ggml-org's Q4_K_M, made by plain llama-quantize): no byte count found, so the tensor
  bytes computed from the published configs (bench/make_random_gguf.py's GEMMA4_SHAPES, in llama.cpp's layout)
  with llama-quantize's Q4_K_M choices (its `llama_tensor_get_type`: the tied embedding Q6_K, attn_v and ffn_down
  Q6_K on its `use_more_bits` layers, the experts' 704-wide down rows falling back to Q5_0 / Q8_0, the router and
  norms F32), without the header (a few MB); tests/ui/test_recommendations.py recomputes them. 31B: 18,671,229,168
  bytes, where a public comparison lists the Q4_K_M at 18.7e9.
Left out: Qwen3-ASR (the engine reads its Hugging Face folder, not a single GGUF) and PaddleOCR-VL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.engine.plan.fit import (
    DeviceMemory,
    FitOptions,
    FitReport,
    ModelShape,
    gguf_job,
    is_task_job,
    shape_from_gguf,
)
from app.studio.fit_estimate import DecodeSpeed, decode_speed, fit_at_context, memory_bandwidth

MB = 1_000_000
Header = Mapping[str, object]


@dataclass(frozen=True)
class Recommendation:
    title: str  # what the user reads: "Qwen3 4B"
    repo_id: str
    file: str
    memory_class: str  # the GPU memory it is meant for: "4 GB", "8 GB" ...
    size_bytes: int
    header: Header = field(repr=False)  # the GGUF header keys that carry its shape (and job)
    note: str = ""
    tensors: tuple[str, ...] = ()  # tensors its job is read from besides the header: a reranker's head
    attention_layers: int | None = None  # as its model card counts them: the layers that keep a KV cache

    @property
    def architecture(self) -> str:
        return str(self.header["general.architecture"])

    @property
    def context(self) -> int:
        return int(self.header[f"{self.architecture}.context_length"])  # type: ignore[call-overload]

    @property
    def shape(self) -> ModelShape:
        """The shape `shape_from_gguf` reads from this file's header."""
        return shape_from_gguf(self.header, self.size_bytes)

    @property
    def job(self) -> str:
        """What it does, read from its header as the Models pane reads an installed GGUF's."""
        return gguf_job(self.header, self.tensors)

    def gguf_metadata(self) -> dict[str, object]:
        """The header keys that carry this shape (for writing a file `paddock fit` reads the same way)."""
        return dict(self.header)


def _keys(arch: str, **values: object) -> dict[str, object]:
    """`{arch}.<key>` header entries; `__` in a name stands for a dot (attention__head_count)."""
    return {"general.architecture": arch, **{f"{arch}.{k.replace('__', '.')}": v for k, v in values.items()}}


def _dense(arch: str, layers: int, hidden: int, heads: int, kv_heads: int | list[int], head_dim: int, ffn: int,
           vocab: int, context: int, **extra: object) -> dict[str, object]:
    return _keys(arch, block_count=layers, embedding_length=hidden, attention__head_count=heads,
                 attention__head_count_kv=kv_heads, attention__key_length=head_dim, attention__value_length=head_dim,
                 feed_forward_length=ffn, vocab_size=vocab, context_length=context, **extra)  # fmt: skip


def _qwen35(arch: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, gdn: tuple[int, int, int, int],
            moe: tuple[int, int, int, int] | None = None) -> dict[str, object]:
    """Qwen3.5's header as llama.cpp writes it: 256-wide attention heads rotating a quarter of each, Gated
    DeltaNet layers of (key heads, value heads, key dim, value dim) with a 4-tap convolution, attention at
    every 4th layer; a MoE's (experts, used, expert FFN, shared expert FFN)."""
    k_heads, v_heads, k_dim, v_dim = gdn
    experts = {} if moe is None else dict(zip(
        ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"),
        moe, strict=True))  # fmt: skip
    return _dense(arch, layers, hidden, heads, kv_heads, 256, ffn, 248_320, 262_144, rope__dimension_count=64,
                  ssm__group_count=k_heads, ssm__time_step_rank=v_heads, ssm__state_size=k_dim,
                  ssm__inner_size=v_heads * v_dim, ssm__conv_kernel=4, full_attention_interval=4,
                  **experts)  # fmt: skip


def _gemma4(layers: int, hidden: int, heads: int, kv_heads: int | tuple[int, int], ffn: int, context: int,
            window: int, **extra: object) -> dict[str, object]:
    """Gemma 4's header: 256-wide sliding heads and 512-wide global ones, five sliding layers to one global;
    `kv_heads` as (sliding, global) where the two differ, written per layer as llama.cpp does."""
    pattern = ([True] * 5 + [False]) * (layers // 6)
    kv = kv_heads if isinstance(kv_heads, int) else [kv_heads[0] if s else kv_heads[1] for s in pattern]
    return _dense("gemma4", layers, hidden, heads, kv, 512, ffn, 262_144, context,
                  attention__key_length_swa=256, attention__value_length_swa=256, attention__sliding_window=window,
                  attention__sliding_window_pattern=pattern, **extra)  # fmt: skip


def _gemma4_e4b() -> dict[str, object]:
    """Gemma 4 E4B: sliding window 512; the last 18 layers read the KV of an earlier one; per-layer inputs of 256."""
    return _gemma4(42, 2560, 8, 2, 10_240, 131_072, 512, attention__shared_kv_layers=18,
                   embedding_length_per_layer_input=256)  # fmt: skip


def _gemma4_31b() -> dict[str, object]:
    """Gemma 4 31B: 60 layers, 16 KV heads on the sliding ones (window 1024), 4 on the global ones."""
    return _gemma4(60, 5376, 32, (16, 4), 21_504, 262_144, 1024)


def _gemma4_26b_a4b() -> dict[str, object]:
    """Gemma 4 26B-A4B: 30 layers, 8 and 2 KV heads; 128 experts of 704 (8 used) beside each layer's MLP."""
    return _gemma4(30, 2816, 16, (8, 2), 2112, 262_144, 1024, expert_count=128, expert_used_count=8,
                   expert_feed_forward_length=704)  # fmt: skip


def _nemotron3_nano() -> dict[str, object]:
    """Nemotron 3 Nano 30B-A3B as llama.cpp's nemotron_h_moe header says it, per layer of its
    `hybrid_override_pattern` (M: Mamba-2, E: experts, *: attention): KV heads on the 6 attention layers,
    the expert width on the 23 expert layers, zero elsewhere; Mamba-2 of 64 heads x 64 with 8 groups of
    state 128; 128 experts (6 used, sigmoid-routed, scaled 2.5) and a shared one."""
    pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    return _keys("nemotron_h_moe", block_count=len(pattern), embedding_length=2688, attention__head_count=32,
                 attention__head_count_kv=[2 if c == "*" else 0 for c in pattern], attention__key_length=128,
                 attention__value_length=128, feed_forward_length=[1856 if c == "E" else 0 for c in pattern],
                 vocab_size=131_072, context_length=262_144, ssm__time_step_rank=64, ssm__inner_size=64 * 64,
                 ssm__state_size=128, ssm__group_count=8, ssm__conv_kernel=4, expert_count=128, expert_used_count=6,
                 expert_feed_forward_length=1856, expert_shared_feed_forward_length=3712,
                 expert_weights_scale=2.5)  # fmt: skip


def _qwen3_task(pooling: int, **extra: object) -> dict[str, object]:
    """Qwen3-Embedding / Qwen3-Reranker 0.6B: Qwen3 0.6B with the pooling type llama.cpp writes."""
    return _dense("qwen3", 28, 1024, 16, 8, 128, 3072, 151_669, 32_768, pooling_type=pooling, **extra)


RECOMMENDED: tuple[Recommendation, ...] = (
    Recommendation("Qwen2.5 0.5B Instruct", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf",
                   "CPU / 2 GB", 491 * MB, _dense("qwen2", 24, 896, 14, 2, 64, 4864, 151936, 32768),
                   "tiny and quick; simple answers"),
    Recommendation("Gemma 3 1B IT", "unsloth/gemma-3-1b-it-GGUF", "gemma-3-1b-it-Q4_K_M.gguf", "CPU / 2 GB",
                   806 * MB, _dense("gemma3", 26, 1152, 4, 1, 256, 6912, 262144, 32768),
                   "the embedded model's bigger sibling"),
    Recommendation("Qwen2.5 1.5B Instruct", "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "qwen2.5-1.5b-instruct-q4_k_m.gguf",
                   "4 GB", 1117 * MB, _dense("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, 32768)),
    Recommendation("Llama 3.2 3B Instruct", "bartowski/Llama-3.2-3B-Instruct-GGUF", "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
                   "6 GB", 2019 * MB, _dense("llama", 28, 3072, 24, 8, 128, 8192, 128256, 131072)),
    Recommendation("Qwen3 4B", "Qwen/Qwen3-4B-GGUF", "Qwen3-4B-Q4_K_M.gguf", "6 GB", 2497 * MB,
                   _dense("qwen3", 36, 2560, 32, 8, 128, 9728, 151936, 40960), "thinks before answering"),
    Recommendation("Qwen3.5 4B", "unsloth/Qwen3.5-4B-GGUF", "Qwen3.5-4B-Q4_K_M.gguf", "6 GB", 2_740_937_888,
                   _qwen35("qwen35", 32, 2560, 16, 4, 9216, (16, 32, 128, 128)),
                   "hybrid: a small fixed state per conversation, KV in 8 of 32 layers; long contexts are cheap",
                   attention_layers=8),
    Recommendation("Gemma 4 E4B IT", "unsloth/gemma-4-E4B-it-GGUF", "gemma-4-E4B-it-Q4_K_M.gguf", "8 GB",
                   4_977_171_584, _gemma4_e4b(), "per-layer embeddings; 18 of 42 layers reuse another's KV",
                   attention_layers=24),
    Recommendation("Llama 3.1 8B Instruct", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
                   "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "12 GB", 4921 * MB,
                   _dense("llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072)),
    Recommendation("Qwen3 8B", "Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf", "12 GB", 5027 * MB,
                   _dense("qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960)),
    Recommendation("Qwen3.5 9B", "unsloth/Qwen3.5-9B-GGUF", "Qwen3.5-9B-Q4_K_M.gguf", "12 GB", 5_680_522_464,
                   _qwen35("qwen35", 32, 4096, 16, 4, 12_288, (16, 32, 128, 128)),
                   "hybrid: KV in 8 of 32 layers", attention_layers=8),
    Recommendation("Qwen3 14B", "Qwen/Qwen3-14B-GGUF", "Qwen3-14B-Q4_K_M.gguf", "24 GB", 9002 * MB,
                   _dense("qwen3", 40, 5120, 40, 8, 128, 17408, 151936, 40960)),
    Recommendation("Qwen3.5 27B", "unsloth/Qwen3.5-27B-GGUF", "Qwen3.5-27B-Q4_K_M.gguf", "32 GB", 16_740_812_704,
                   _qwen35("qwen35", 64, 5120, 24, 4, 17_408, (16, 48, 128, 128)),
                   "hybrid: KV in 16 of 64 layers; on 24 GB, give its state snapshots less room (--state-snapshot-gb)",
                   attention_layers=16),
    Recommendation("Qwen3 32B", "Qwen/Qwen3-32B-GGUF", "Qwen3-32B-Q4_K_M.gguf", "48 GB", 19762 * MB,
                   _dense("qwen3", 64, 5120, 64, 8, 128, 25600, 151936, 40960)),
    Recommendation("Gemma 4 26B-A4B IT", "ggml-org/gemma-4-26B-A4B-it-GGUF", "gemma-4-26B-A4B-it-Q4_K_M.gguf",
                   "24 GB", 16_780_192_888, _gemma4_26b_a4b(),
                   "mixture of experts beside each layer's MLP, 4B active; experts can stay in host RAM",
                   attention_layers=30),
    Recommendation("Gemma 4 31B IT", "ggml-org/gemma-4-31B-it-GGUF", "gemma-4-31B-it-Q4_K_M.gguf", "48 GB",
                   18_671_229_168, _gemma4_31b(), "dense; its sliding layers keep 16 KV heads: 0.9 MB of KV a token",
                   attention_layers=60),
    Recommendation("Nemotron 3 Nano 30B-A3B", "unsloth/Nemotron-3-Nano-30B-A3B-GGUF",
                   "Nemotron-3-Nano-30B-A3B-Q4_K_M.gguf", "32 GB", 24_574_373_664, _nemotron3_nano(),
                   "Mamba-2 hybrid mixture of experts, 3B active; KV in 6 of 52 layers", attention_layers=6),
    Recommendation("Qwen3.5 35B-A3B", "unsloth/Qwen3.5-35B-A3B-GGUF", "Qwen3.5-35B-A3B-Q4_K_M.gguf", "32 GB",
                   22_016_023_168, _qwen35("qwen35moe", 40, 2048, 16, 2, 512, (16, 32, 128, 128), (256, 8, 512, 512)),
                   "mixture of experts, 3B active: quick for its size; experts can stay in host RAM",
                   attention_layers=10),
    Recommendation("Qwen3-Embedding 0.6B", "Qwen/Qwen3-Embedding-0.6B-GGUF", "Qwen3-Embedding-0.6B-Q8_0.gguf",
                   "CPU / 2 GB", 639_150_592, _qwen3_task(3),
                   "embeds the Documents pane's files; paddock serve --embedding-model"),
    Recommendation("Qwen3-Reranker 0.6B", "JonathanMiddleton/Qwen3-Reranker-0.6B", "Qwen3-Reranker-0.6B-Q8_0.gguf",
                   "CPU / 2 GB", 639_153_088, _qwen3_task(4, classifier__output_labels=["yes", "no"]),
                   "orders passages by relevance; paddock serve --rerank-model", tensors=("cls.output.weight",)),
)


@dataclass(frozen=True)
class RecommendationFit:
    recommendation: Recommendation
    report: FitReport
    speed: DecodeSpeed | None = None  # None: this machine's memory bandwidth is unknown, or not a chat model


def recommended_fits(options: FitOptions | None = None, device: DeviceMemory | None = None,
                     table: tuple[Recommendation, ...] = RECOMMENDED,
                     bandwidth: float | None = None) -> list[RecommendationFit]:
    """Each recommendation with its will-it-fit report on `device` (default: this machine's GPU or RAM) at
    the context the Studio loads it with (a task model: as the engine runs one beside the chat model), and a
    chat model's decode speed at `bandwidth` (default: measured here)."""
    from app.engine.plan.fit import device_memory

    options = options or FitOptions()
    device = device or device_memory()  # read once: every row is judged against the same free memory
    bandwidth = bandwidth if bandwidth is not None else memory_bandwidth(device.kind)
    fits = []
    for rec in table:
        shape, job = rec.shape, rec.job
        speed = None if is_task_job(job) else decode_speed(shape, bandwidth)
        fits.append(RecommendationFit(rec, fit_at_context(shape, options, device, job), speed))
    return fits
