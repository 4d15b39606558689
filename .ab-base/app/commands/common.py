"""Arguments and helpers shared by the commands that load a model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from app.engine.config import MIN_KV_BLOCKS

if TYPE_CHECKING:
    from app.engine import EngineConfig


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="default",
        help="a .gguf file, a Hugging Face model folder, a model name in the models folder, "
        "or 'default' (the embedded Gemma 3 270M)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--max-ctx", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument(
        "--mmproj",
        default=None,
        metavar="FILE",
        help="a llama.cpp mmproj GGUF: the vision tower for a GGUF model (default: an mmproj*.gguf beside it)",
    )
    parser.add_argument(
        "--cpu-kernels", choices=["auto", "numba", "numpy"], default="auto",
        help="CPU products: numba kernels over the quantized blocks, or the numpy float32 reference "
        "(default: numba where it is installed)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="CPU kernel threads (default: every core)")
    parser.add_argument(
        "--experts-on-gpu", default=None, metavar="N|auto|all",
        help="mixture of experts: experts per layer kept on the GPU; the rest stay in pinned host RAM and "
        "stream in per step over PCIe (auto: the largest hot set that fits; default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-memory-utilization", type=fraction, default=None, metavar="FRACTION",
        help="CUDA: the share of the free GPU memory the engine may take, 0.05 to 1.0; the KV cache gets "
        "what the weights and working buffers leave of it (default 0.9)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-blocks", type=kv_block_count, default=None, metavar="N",
        help="the KV cache's size on the device in blocks of 16 tokens, instead of what the memory holds; the "
        "context is at most what N - 1 blocks hold (one is the pool's null block) (default: sized from the memory)",
    )  # fmt: skip


def fraction(text: str) -> float:
    """`--gpu-memory-utilization`: a share of the GPU memory, 0.05 .. 1.0 (the range EngineConfig takes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a fraction such as 0.8, not {text!r}") from None
    if not 0.05 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0.05 and 1.0 (a fraction, not a percentage), not {text}")
    return value


def kv_block_count(text: str) -> int:
    """`--kv-blocks`: at least 2 (the pool's null block and one block a request can use)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number of blocks, not {text!r}") from None
    if value < MIN_KV_BLOCKS:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_KV_BLOCKS} (the pool's null block and one block of 16 tokens), not {value}"
        )
    return value


def resolve_model(name: str) -> str:
    """A path the engine can open: the argument itself, or a match in the Studio's models folder."""
    if name == "default" or Path(name).expanduser().exists():
        return name
    try:
        from app.studio.library import find_model
    except ImportError:
        return name
    found = find_model(name)
    return str(found) if found is not None else name


def add_async_decode_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--async-decode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch each decode step before the previous one's tokens are read back (default: on with "
        "CUDA graphs)",
    )


def add_pacing_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--decode-latency-factor", type=latency_factor, default=None, metavar="X",
        help="while requests decode, cut each step's prefill so that the step's predicted time stays within X "
        "times a decode-only step's: a bound on their inter-token latency while a long prompt prefills, paid in "
        "that prompt's time to first token (e.g. 2; default 0: off, every step takes the whole token budget)",
    )  # fmt: skip


def latency_factor(text: str) -> float:
    """`--decode-latency-factor`: 0 (off) or a multiple of a decode-only step's time, at least 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number such as 2 (or 0: off), not {text!r}") from None
    if value != 0 and not value >= 1.0:
        raise argparse.ArgumentTypeError(
            f"must be 0 (off) or at least 1 (a multiple of a decode-only step's time), not {text}"
        )
    return value


def add_kv_arguments(parser: argparse.ArgumentParser) -> None:
    """The KV cache's flags: prefix reuse, element type and the offload tiers (host RAM, disk)."""
    group = parser.add_argument_group("KV cache")
    group.add_argument("--prefix-cache", choices=["on", "off"], default="on",
                       help="reuse the KV of prompt prefixes seen before (default on; off: no reuse at all)")
    group.add_argument("--kv-dtype", choices=["auto", "f16", "fp8"], default="auto",
                       help="KV cache element type (auto: float16 on the GPU, float32 on the CPU; fp8: e4m3 with "
                       "per-block scales, about half of f16's memory, on both backends)")
    group.add_argument("--kv-host-gb", type=float, default=4.0, metavar="GB",
                       help="host RAM (pinned on CUDA, in the background from the start) for prefix blocks "
                       "evicted from the KV cache (hybrid models: for evicted recurrent-state snapshots) "
                       "(default 4; 0: off)")
    group.add_argument("--kv-disk-gb", type=float, default=0.0, metavar="GB",
                       help="disk space for prefix blocks evicted from host RAM; kept across restarts (default 0: off)")
    group.add_argument("--kv-disk-dir", default=None, metavar="DIR",
                       help="folder of the disk tier (default: the user cache folder's paddock/kv)")
    group.add_argument("--state-snapshot-gb", type=float, default=None, metavar="GB",
                       help="hybrid models: memory for the prefix cache's recurrent-state snapshots (default: a "
                       "fifth of the cache budget, at most 8 per sequence; 0: no prefix reuse)")
    group.add_argument("--state-snapshot-interval", type=int, default=None, metavar="TOKENS",
                       help="hybrid models: a prompt's state is snapshotted every this many tokens, so a request "
                       "sharing part of it resumes close to where they differ (default: as many tokens as one "
                       "snapshot's memory holds in KV, at least a block, at most 4096; 0: only at its end)")


def add_speculative_arguments(parser: argparse.ArgumentParser) -> None:
    """Speculative decoding's flags (app/engine/spec/)."""
    group = parser.add_argument_group("speculative decoding")
    group.add_argument("--speculative", choices=["off", "ngram", "draft", "mtp"], default="off",
                       help="draft tokens and verify them in one step: ngram looks the last tokens up in the "
                       "prompt and output (prompt lookup; pays where the answer repeats the prompt, as code "
                       "edits do); draft runs --draft-model greedily; mtp runs the model's own "
                       "multi-token-prediction head (Qwen3.5, Qwen3-Next, Nemotron-H MoE). Greedy output is unchanged; sampled "
                       "output keeps its distribution (default off)")
    group.add_argument("--draft-model", default=None, metavar="PATH",
                       help="with --speculative draft: a small model of the same tokenizer as --model (a "
                       ".gguf file, a Hugging Face folder or a name in the models folder)")
    group.add_argument("--num-draft-tokens", type=int, default=8, metavar="K",
                       help="most drafted tokens per request and step; each request adapts its own between 2 "
                       "and K from its acceptance (default 8)")
    group.add_argument("--speculative-max-batch", type=int, default=4, metavar="N",
                       help="no drafts while more than N requests run: the batch keeps the device busy (default 4)")


def engine_config(args: argparse.Namespace, **overrides: object) -> EngineConfig:
    """The EngineConfig the model arguments ask for (`--max-batch`, `--async-decode`, `--decode-latency-factor`
    and the KV flags where the command has them)."""
    from app.engine import EngineConfig

    fields: dict[str, object] = dict(
        model=resolve_model(args.model), device=args.device, max_model_len=args.max_ctx
    )
    # (argument, EngineConfig field); commands built before these arguments existed lack them
    for name, field in (("mmproj", "mmproj"), ("cpu_kernels", "cpu_kernels"), ("threads", "threads"),
                        ("experts_on_gpu", "experts_on_gpu"), ("gpu_memory_utilization", "gpu_memory_utilization"),
                        ("kv_blocks", "num_kv_blocks")):  # fmt: skip
        if getattr(args, name, None) is not None:
            fields[field] = getattr(args, name)
    if getattr(args, "max_batch", None) is not None:
        fields["max_num_seqs"] = args.max_batch
    if getattr(args, "async_decode", None) is not None:
        fields["async_decode"] = args.async_decode
    if getattr(args, "decode_latency_factor", None) is not None:
        fields["decode_latency_factor"] = args.decode_latency_factor
    if getattr(args, "speculative", None) is not None:  # the commands with add_speculative_arguments
        fields.update(speculative=args.speculative, num_draft_tokens=args.num_draft_tokens,
                      speculative_max_batch=args.speculative_max_batch,
                      draft_model=resolve_model(args.draft_model) if args.draft_model else None)
    if getattr(args, "prefix_cache", None) is not None:  # the commands with add_kv_arguments
        fields.update(enable_prefix_caching=args.prefix_cache == "on", kv_dtype=args.kv_dtype,
                      kv_host_gb=args.kv_host_gb, kv_disk_gb=args.kv_disk_gb, kv_disk_dir=args.kv_disk_dir,
                      state_snapshot_gb=args.state_snapshot_gb, state_snapshot_interval=args.state_snapshot_interval)
    return EngineConfig(**{**fields, **overrides})
