"""Engine configuration: what the user asked for, frozen; "auto" values resolved once."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "default"  # the embedded Gemma 3 270M Q4_K_M


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL  # a .gguf file, a Hugging Face model folder, a name in the models folder, or "default"
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    max_model_len: int | None = None  # None: the model's own context, capped by what the KV budget holds
    max_num_seqs: int = 32  # requests decoded together
    max_num_batched_tokens: int = 2048  # tokens per step: decodes first, then prefill chunks
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # None: sized from kv_cache_bytes (CPU) or free device memory (CUDA)
    kv_cache_bytes: int | None = None  # CPU: KV budget in bytes (None: 2 GiB)
    gpu_memory_utilization: float = 0.90  # CUDA: fraction of free memory the engine may take
    kv_dtype: str = "auto"  # "auto" | "float32" | "float16" | "fp8"
    enable_prefix_caching: bool = True
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
    served_model_name: str | None = None  # the id the API reports; None: the file's stem
    seed: int = 0  # for requests without their own seed

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be positive")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ValueError("max_model_len must be at least 16 tokens")
        if self.weight_cache not in ("auto", "on", "off"):
            raise ValueError(f"weight_cache must be auto, on or off, not {self.weight_cache!r}")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be between 0.05 and 1.0")
