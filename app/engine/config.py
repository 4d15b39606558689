"""Engine configuration: what the user asked for, frozen; "auto" values resolved once."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "default"  # the embedded Gemma 3 270M Q4_K_M

# KV cache element types by the names users give them (the fit module's names beside the short
# ones the CLI takes); "auto" is float16 on CUDA and float32 on the CPU (backend.kv_dtype).
KV_DTYPES = {"auto": "auto", "f16": "float16", "float16": "float16", "fp16": "float16",
             "f32": "float32", "float32": "float32", "fp8": "fp8", "f8": "fp8", "fp8_e4m3": "fp8"}  # fmt: skip


@dataclass(frozen=True)
class EngineConfig:
    model: str = (
        DEFAULT_MODEL  # a .gguf file, a Hugging Face model folder, a name in the models folder, or "default"
    )
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    max_model_len: int | None = None  # None: the model's own context, capped by what the KV budget holds
    max_num_seqs: int = 32  # requests decoded together
    max_num_batched_tokens: int = 2048  # tokens per step: decodes first, then prefill chunks
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # None: sized from kv_cache_bytes (CPU) or free device memory (CUDA)
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
    # launch each decode step before reading the previous one's ids back (worker/pipeline.py);
    # None: on with CUDA graphs, off otherwise (--async-decode / --no-async-decode)
    async_decode: bool | None = None
    # float16 copies of the weights for batched products (CUDA only): "auto" keeps them only on a
    # GPU with room to spare (app/engine/fit.py: use_weight_cache), "on", or "off"
    weight_cache: str = "auto"
    mmproj: str | None = None  # a llama.cpp mmproj GGUF (vision tower); None: one beside a GGUF model, if any
    # the CPU backend's products: "numba" (kernels over the GGUF blocks, backend/cpu_fast/), "numpy"
    # (the float32 reference), or "auto" (numba where it imports)
    cpu_kernels: str = "auto"
    threads: int | None = None  # CPU kernel threads; None: every core
    served_model_name: str | None = None  # the id the API reports; None: the file's stem
    seed: int = 0  # for requests without their own seed
    # a mixture of experts' experts per layer kept on the GPU: a number (the rest stream in from
    # pinned host RAM per step: core/expert_residency.py), "auto" (the largest hot set the fit
    # allows) or "all"/None (every expert resident). The numpy backend honours a number too.
    experts_on_gpu: int | str | None = None
    # hybrid models (recurrent layers): memory for the prefix cache's recurrent-state snapshots
    # (None: a share of the cache budget, core/memory_plan.py), and the prompt interval in tokens
    # at which prefill takes one (cache/state_cache.py; 0: only at the prompt's last block boundary)
    state_snapshot_gb: float | None = None
    state_snapshot_interval: int = 512

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be positive")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ValueError("max_model_len must be at least 16 tokens")
        if self.weight_cache not in ("auto", "on", "off"):
            raise ValueError(f"weight_cache must be auto, on or off, not {self.weight_cache!r}")
        if self.cpu_kernels not in ("auto", "numba", "numpy"):
            raise ValueError(f"cpu_kernels must be auto, numba or numpy, not {self.cpu_kernels!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be between 0.05 and 1.0")
        if self.kv_dtype.lower() not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be auto, f16 or fp8 (or float32), not {self.kv_dtype!r}")
        from app.engine.core.expert_plan import parse_experts_on_gpu

        object.__setattr__(self, "experts_on_gpu", parse_experts_on_gpu(self.experts_on_gpu))
        if self.kv_host_gb < 0 or self.kv_disk_gb < 0:
            raise ValueError("kv_host_gb and kv_disk_gb must be 0 (off) or positive")
        if self.state_snapshot_gb is not None and self.state_snapshot_gb < 0:
            raise ValueError(f"state_snapshot_gb must be 0 (off) or positive, got {self.state_snapshot_gb}")
        if self.state_snapshot_interval < 0:
            raise ValueError(f"state_snapshot_interval must be 0 or positive, got {self.state_snapshot_interval}")

    @property
    def kv_dtype_name(self) -> str:
        """The canonical KV dtype: "auto", "float16", "float32" or "fp8"."""
        return KV_DTYPES[self.kv_dtype.lower()]
