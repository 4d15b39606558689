"""Chat models to suggest when the loaded one is a base model: a curated table, usable offline.

Each entry names one instruct GGUF on the Hugging Face hub and carries the numbers
will-it-fit needs (the shape keys of its GGUF header and its size), so the verdict for
this machine is known before anything is downloaded, and without a network. The verdict
is `app.engine.plan.fit.check_fit` over the same `ModelShape` that `paddock fit` reads
from the file's header, at the context the Studio will load it with (fit_estimate.py), with the
decode speed to expect on this machine (tests/ui/test_recommendations.py writes files with these headers
and compares the two). Sizes are the hub's listed file sizes (2026-11), rounded to the MB;
the tensors are counted as the whole file, which overstates them by the header's few MB.
Only architectures the engine runs are listed (gemma3, llama, qwen2, qwen3).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.plan.fit import DeviceMemory, FitOptions, FitReport, ModelShape
from app.studio.fit_estimate import DecodeSpeed, decode_speed, fit_at_context, memory_bandwidth

MB = 1_000_000


@dataclass(frozen=True)
class Recommendation:
    title: str  # what the user reads: "Qwen3 4B Instruct"
    repo_id: str
    file: str
    memory_class: str  # the GPU memory it is meant for: "4 GB", "8 GB" ...
    size_bytes: int
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    note: str = ""

    @property
    def shape(self) -> ModelShape:
        """The shape `shape_from_gguf` reads from this file's header."""
        return ModelShape(self.architecture, self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim,
                          self.ffn, self.vocab, self.context, self.size_bytes, self.head_dim)

    def gguf_metadata(self) -> dict[str, object]:
        """The header keys that carry this shape (for writing a file `paddock fit` reads the same way)."""
        a = self.architecture
        return {"general.architecture": a, f"{a}.block_count": self.layers, f"{a}.embedding_length": self.hidden,
                f"{a}.attention.head_count": self.heads, f"{a}.attention.head_count_kv": self.kv_heads,
                f"{a}.attention.key_length": self.head_dim, f"{a}.attention.value_length": self.head_dim,
                f"{a}.feed_forward_length": self.ffn, f"{a}.vocab_size": self.vocab,
                f"{a}.context_length": self.context}


def _r(title: str, repo: str, file: str, memory_class: str, size_mb: int, arch: str,
       shape: tuple[int, int, int, int, int, int, int, int], note: str = "") -> Recommendation:
    layers, hidden, heads, kv_heads, head_dim, ffn, vocab, context = shape
    return Recommendation(title, repo, file, memory_class, size_mb * MB, arch, layers, hidden, heads, kv_heads,
                          head_dim, ffn, vocab, context, note)


# (layers, hidden, heads, KV heads, head dim, FFN, vocabulary, context) from each model's GGUF header
RECOMMENDED: tuple[Recommendation, ...] = (
    _r("Qwen2.5 0.5B Instruct", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf",
       "CPU / 2 GB", 491, "qwen2", (24, 896, 14, 2, 64, 4864, 151936, 32768), "tiny and quick; simple answers"),
    _r("Gemma 3 1B IT", "unsloth/gemma-3-1b-it-GGUF", "gemma-3-1b-it-Q4_K_M.gguf",
       "CPU / 2 GB", 806, "gemma3", (26, 1152, 4, 1, 256, 6912, 262144, 32768), "the embedded model's bigger sibling"),
    _r("Qwen2.5 1.5B Instruct", "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "qwen2.5-1.5b-instruct-q4_k_m.gguf",
       "4 GB", 1117, "qwen2", (28, 1536, 12, 2, 128, 8960, 151936, 32768)),
    _r("Llama 3.2 3B Instruct", "bartowski/Llama-3.2-3B-Instruct-GGUF", "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
       "6 GB", 2019, "llama", (28, 3072, 24, 8, 128, 8192, 128256, 131072)),
    _r("Qwen3 4B", "Qwen/Qwen3-4B-GGUF", "Qwen3-4B-Q4_K_M.gguf",
       "6 GB", 2497, "qwen3", (36, 2560, 32, 8, 128, 9728, 151936, 40960), "thinks before answering"),
    _r("Llama 3.1 8B Instruct", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
       "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "12 GB", 4921, "llama",
       (32, 4096, 32, 8, 128, 14336, 128256, 131072)),
    _r("Qwen3 8B", "Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf",
       "12 GB", 5027, "qwen3", (36, 4096, 32, 8, 128, 12288, 151936, 40960)),
    _r("Qwen3 14B", "Qwen/Qwen3-14B-GGUF", "Qwen3-14B-Q4_K_M.gguf",
       "24 GB", 9002, "qwen3", (40, 5120, 40, 8, 128, 17408, 151936, 40960)),
    _r("Qwen3 32B", "Qwen/Qwen3-32B-GGUF", "Qwen3-32B-Q4_K_M.gguf",
       "48 GB", 19762, "qwen3", (64, 5120, 64, 8, 128, 25600, 151936, 40960)),
)


@dataclass(frozen=True)
class RecommendationFit:
    recommendation: Recommendation
    report: FitReport
    speed: DecodeSpeed | None = None  # None: this machine's memory bandwidth is unknown


def recommended_fits(options: FitOptions | None = None, device: DeviceMemory | None = None,
                     table: tuple[Recommendation, ...] = RECOMMENDED,
                     bandwidth: float | None = None) -> list[RecommendationFit]:
    """Each recommendation with its will-it-fit report on `device` (default: this machine's GPU or RAM) at
    the context the Studio loads it with, and its decode speed at `bandwidth` (default: measured here)."""
    from app.engine.plan.fit import device_memory

    options = options or FitOptions()
    device = device or device_memory()  # read once: every row is judged against the same free memory
    bandwidth = bandwidth if bandwidth is not None else memory_bandwidth(device.kind)
    return [RecommendationFit(rec, fit_at_context(rec.shape, options, device), decode_speed(rec.shape, bandwidth))
            for rec in table]
