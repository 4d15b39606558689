"""Engine configuration: what the user asked for, frozen; "auto" values resolved once."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "default"  # the embedded Gemma 3 270M Q4_K_M

# KV cache element types, the one table: each name users give -> the canonical name, and each canonical
# name's bytes per element. "auto" is the backend's own (AUTO_KV_DTYPE): float16 on CUDA, float32 on the CPU.
KV_DTYPES = {"auto": "auto", "f16": "float16", "float16": "float16", "fp16": "float16", "half": "float16",
             "f32": "float32", "float32": "float32", "fp32": "float32", "fp8": "fp8", "f8": "fp8",
             "fp8_e4m3": "fp8"}  # fmt: skip
KV_DTYPE_BYTES = {"float32": 4, "float16": 2, "fp8": 1}  # fp8 adds per-(block, head) scales: backend/fp8_kv.py
AUTO_KV_DTYPE = {"cuda": "float16", "cpu": "float32"}
# The CUDA backend's "auto" weight cache: float16 copies within this share of the free memory
# (backend/cuda/dense.py), predicted by the memory plan (plan/memory.py).
DENSE_CACHE_FRACTION = 0.35
# The smallest fixed KV pool (num_kv_blocks, --kv-blocks): block 0 is the pool's null block, so a request
# needs one more; the context served is what the rest hold (plan/memory.py max_model_len).
MIN_KV_BLOCKS = 2


def kv_dtype_name(name: str, device: str | None = None) -> str:
    """The canonical KV dtype for a user's name ("auto" stays "auto" unless `device`, "cuda" or "cpu",
    is given); ValueError naming the accepted names."""
    canonical = KV_DTYPES.get(name.strip().lower())
    if canonical is None:
        raise ValueError(f"KV dtype must be one of {', '.join(sorted(KV_DTYPES))}, not {name!r}")
    return AUTO_KV_DTYPE[device] if canonical == "auto" and device is not None else canonical


def parse_experts_on_gpu(value: str | int | None) -> int | str | None:
    """`--experts-on-gpu`: a whole number of experts per layer, "auto" or "all" (None: all)."""
    if value is None or isinstance(value, int):
        if isinstance(value, int) and value < 0:
            raise ValueError(f"--experts-on-gpu must be at least 0, not {value}")
        return value
    text = value.strip().lower()
    if text in ("auto", "all"):
        return text
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"--experts-on-gpu takes a number of experts per layer, 'auto' or 'all', not {value!r}") from None
    return parse_experts_on_gpu(count)


@dataclass(frozen=True)
class EngineConfig:
    model: str = (
        DEFAULT_MODEL  # a .gguf file, a Hugging Face model folder, a name in the models folder, or "default"
    )
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    max_model_len: int | None = None  # None: the model's own context, capped by what the KV budget holds
    max_num_seqs: int = 32  # requests decoded together
    max_num_batched_tokens: int = 2048  # tokens per step: decodes first, then prefill chunks
    # while requests decode, a step's prefill tokens are cut so that its predicted time stays within this
    # many times a decode-only step's (core/step_pacing.py): a bound on the decoders' inter-token latency
    # while a long prompt prefills, paid in that prompt's time to first token. 0 or None: off (every step
    # takes the whole budget, the default until a GPU has measured what the bound costs a long prompt);
    # otherwise at least 1.0
    decode_latency_factor: float | None = 0.0
    block_size: int = 16  # tokens per KV block
    # the KV pool in blocks, the null block included (--kv-blocks); the context served is at most what the
    # other blocks hold. None: sized from kv_cache_bytes (CPU) or free device memory (CUDA)
    num_kv_blocks: int | None = None
    kv_cache_bytes: int | None = None  # CPU: KV budget in bytes (None: 2 GiB)
    gpu_memory_utilization: float = 0.90  # CUDA: fraction of free memory the engine may take
    kv_dtype: str = "auto"  # "auto" | "f16" | "fp8" (and "float32"; aliases in KV_DTYPES)
    enable_prefix_caching: bool = True  # False: no prefix reuse at all (no radix tree, no tiers)
    # Offload tiers for evicted prefix blocks (cache/offload.py): host RAM, then a disk folder.
    kv_host_gb: float = 0.0  # 0: no host tier
    kv_disk_gb: float = 0.0  # 0: no disk tier
    kv_disk_dir: str | None = None  # None: the user cache folder's paddock/kv
    cuda_graphs: bool = True  # replay decode steps as CUDA graphs (CUDA only)
    # with cuda_graphs, also replay one sequence's prefill chunk of up to 512 tokens as a graph
    # (worker/prefill_graphs.py)
    prefill_graphs: bool = True
    # launch each decode step before reading the previous one's ids back (core/pipeline.py);
    # None: on with CUDA graphs, off otherwise (--async-decode / --no-async-decode)
    async_decode: bool | None = None
    # float16 copies of the weights for batched products (CUDA only): "auto" keeps them only on a
    # GPU with room to spare (plan/memory.py: use_weight_cache), "on", or "off"
    weight_cache: str = "auto"
    mmproj: str | None = None  # a llama.cpp mmproj GGUF (vision tower); None: one beside a GGUF model, if any
    # a PEFT LoRA adapter folder merged into the weights at load (loader/lora.py): Granite Speech's, which
    # transformers turns on whenever audio is present, for its transcription engine; None: none
    lora_adapter: str | None = None
    # the CPU backend's products: "numba" (kernels over the GGUF blocks, backend/cpu_fast/), "numpy"
    # (the float32 reference), or "auto" (numba where it imports)
    cpu_kernels: str = "auto"
    threads: int | None = None  # CPU kernel threads; None: every core
    served_model_name: str | None = None  # the id the API reports; None: the file's stem
    seed: int = 0  # for requests without their own seed
    # a mixture of experts' experts per layer kept on the GPU: a number (the rest stream in from
    # pinned host RAM per step: moe/residency.py), "auto" (the largest hot set the fit
    # allows) or "all"/None (every expert resident). The numpy backend honours a number too.
    experts_on_gpu: int | str | None = None
    # hybrid models (recurrent layers): memory for the prefix cache's recurrent-state snapshots
    # (None: a share of the cache room, plan/memory.py), and the prompt interval in tokens
    # at which prefill takes one (cache/state_cache.py; 0: only at the prompt's last block boundary;
    # None: as many tokens as one snapshot's bytes hold KV, plan/memory.py snapshot_interval)
    state_snapshot_gb: float | None = None
    state_snapshot_interval: int | None = None
    # speculative decoding (app/engine/spec/): "ngram" (prompt lookup), "draft" (a small model of the
    # same tokenizer, `draft_model`: core/draft_model.py), "mtp" (the model's own multi-token-prediction
    # head: core/mtp_drafter.py) or "off"; at most
    # `num_draft_tokens` drafts per request and step (adapted per request from its acceptance),
    # none while more than `speculative_max_batch` requests run
    speculative: str = "off"
    num_draft_tokens: int = 8
    speculative_max_batch: int = 4
    draft_model: str | None = None  # speculative "draft": the draft model (a path or name, as `model`)

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be positive")
        factor = self.decode_latency_factor
        if factor is not None and factor != 0 and not factor >= 1.0:  # negative, below 1 or NaN
            raise ValueError(f"decode_latency_factor must be 0 (off) or at least 1.0 (a multiple of a decode-only "
                             f"step's time), not {self.decode_latency_factor}")  # fmt: skip
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ValueError("max_model_len must be at least 16 tokens")
        if self.weight_cache not in ("auto", "on", "off"):
            raise ValueError(f"weight_cache must be auto, on or off, not {self.weight_cache!r}")
        if self.cpu_kernels not in ("auto", "numba", "numpy"):
            raise ValueError(f"cpu_kernels must be auto, numba or numpy, not {self.cpu_kernels!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be between 0.05 and 1.0, not {self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < MIN_KV_BLOCKS:
            raise ValueError(f"num_kv_blocks must be at least {MIN_KV_BLOCKS} (the pool's null block and one "
                             f"block of {self.block_size} tokens), not {self.num_kv_blocks}")  # fmt: skip
        if self.kv_dtype.strip().lower() not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be auto, f16 or fp8 (or float32), not {self.kv_dtype!r}")
        object.__setattr__(self, "experts_on_gpu", parse_experts_on_gpu(self.experts_on_gpu))
        if self.kv_host_gb < 0 or self.kv_disk_gb < 0:
            raise ValueError("kv_host_gb and kv_disk_gb must be 0 (off) or positive")
        if self.state_snapshot_gb is not None and self.state_snapshot_gb < 0:
            raise ValueError(f"state_snapshot_gb must be 0 (off) or positive, got {self.state_snapshot_gb}")
        if self.speculative not in ("off", "ngram", "draft", "mtp"):
            raise ValueError(f"speculative must be off, ngram, draft or mtp, not {self.speculative!r}")
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("speculative draft needs a draft model (draft_model, --draft-model PATH)")
        if self.num_draft_tokens < 1 or self.speculative_max_batch < 1:
            raise ValueError("num_draft_tokens and speculative_max_batch must be at least 1")
        if self.state_snapshot_interval is not None and self.state_snapshot_interval < 0:
            raise ValueError(f"state_snapshot_interval must be 0 or positive, got {self.state_snapshot_interval}")

    @property
    def kv_dtype_name(self) -> str:
        """The canonical KV dtype: "auto", "float16", "float32" or "fp8"."""
        return kv_dtype_name(self.kv_dtype)
