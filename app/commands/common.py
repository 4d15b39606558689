"""Arguments and helpers shared by the commands that load a model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

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


def engine_config(args: argparse.Namespace, **overrides: object) -> EngineConfig:
    """The EngineConfig the model arguments ask for (`--max-batch` and `--async-decode` where the
    command has them)."""
    from app.engine import EngineConfig

    fields: dict[str, object] = dict(model=resolve_model(args.model), device=args.device, max_model_len=args.max_ctx)
    if getattr(args, "max_batch", None) is not None:
        fields["max_num_seqs"] = args.max_batch
    if getattr(args, "async_decode", None) is not None:
        fields["async_decode"] = args.async_decode
    return EngineConfig(**{**fields, **overrides})
