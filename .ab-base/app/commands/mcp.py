"""`paddock mcp`: the engine's MCP tools (generate, chat, embed, count_tokens) over stdin/stdout."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys

HELP = (
    "serve MCP tools (generate, chat, embed, count_tokens) over stdio, for MCP clients that launch a command"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.commands.common import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument(
        "--max-batch", type=int, default=8, metavar="N", help="requests decoded together (default 8)"
    )
    parser.add_argument(
        "--embedding-model",
        default=None,
        metavar="DIR_OR_GGUF",
        help="embedding model (default: MiniLM): a sentence-transformers folder, or a Qwen3-Embedding "
        "folder or .gguf",
    )
    parser.add_argument("--no-embeddings", action="store_true", help="do not load an embedding model")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from app.commands.common import engine_config
    from app.commands.serve import load_embedder
    from app.engine import AsyncEngine
    from app.engine.server.mcp import run_stdio
    from app.engine.server.settings import ServerSettings

    # stdout carries the protocol: everything else (logs, stray prints while loading) goes to stderr
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    with contextlib.redirect_stdout(sys.stderr):
        try:
            config = engine_config(args)
            embedder = load_embedder(args)  # before the chat model takes its share of the GPU
            engine = AsyncEngine(config)
        except (OSError, ValueError, RuntimeError) as exc:  # a model named on the command line
            print(f"paddock mcp: {exc}", file=sys.stderr)
            return 2
    try:
        asyncio.run(run_stdio(engine, embedder, ServerSettings(log_level="warning")))
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()
    return 0
