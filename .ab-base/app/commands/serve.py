"""`paddock serve`: the OpenAI- and Anthropic-compatible API (and MCP at /mcp) over one loaded model."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.server.settings import ServerSettings

HELP = "serve the loaded model over an OpenAI- and Anthropic-compatible HTTP API (and MCP at /mcp)"
EPILOG = (
    "Engine environment switches (kernel A/B runs, the kernel cache folder) are listed in "
    "docs/configuration.md; `python -m app.engine.envs` prints them."
)

# Request limits as flags: (flag, ServerSettings field, what more gets); defaults come from ServerSettings.
LIMIT_FLAGS = (
    (
        "--max-concurrent-requests",
        "max_concurrent_requests",
        "requests in flight (once their body is whole); more get 429",
    ),
    ("--max-body-bytes", "max_body_bytes", "JSON request body size; more get 413"),
    ("--max-audio-body-bytes", "max_audio_body_bytes", "audio upload size; more get 413"),
    ("--max-audio-seconds", "max_audio_seconds", "audio length; longer gets 400"),
    ("--max-concurrent-uploads", "max_concurrent_uploads", "transcriptions in flight; more get 429"),
    ("--max-choices", "max_choices", "`n` of one request; more gets 400"),
    ("--max-prompts", "max_prompts", "prompts in one completions list; more get 400"),
    ("--max-generations", "max_generations", "n x prompts of one request; more get 400"),
    ("--prompt-workers", "prompt_workers", "threads rendering templates and tokenizing"),
    ("--max-images", "max_images", "image parts of one request; more get 400"),
    ("--max-image-bytes", "max_image_bytes", "one image's decoded size; more gets 400"),
)
# Slow clients: (flag, ServerSettings field, what a client slower than this gets); seconds, floats.
TIMEOUT_FLAGS = (
    (
        "--header-timeout",
        "header_timeout_seconds",
        "a request's line and headers; later gets 408, connection closed",
    ),
    ("--body-timeout", "body_timeout_seconds", "a JSON body, whole; later gets 408, connection closed"),
    (
        "--upload-timeout",
        "upload_timeout_seconds",
        "an audio upload, whole; later gets 408, connection closed",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.commands.common import (
        add_async_decode_argument,
        add_kv_arguments,
        add_model_arguments,
        add_pacing_argument,
        add_speculative_arguments,
    )
    from app.engine.server.settings import DEFAULT_HOST, DEFAULT_PORT, ServerSettings

    parser.epilog = EPILOG
    add_model_arguments(parser)
    add_async_decode_argument(parser)
    add_pacing_argument(parser)
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    add_kv_arguments(parser)
    add_speculative_arguments(parser)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PADDOCK_API_KEY"),
        help="require this key (Authorization: Bearer KEY or x-api-key: KEY); default $PADDOCK_API_KEY",
    )
    parser.add_argument(
        "--max-batch", type=int, default=32, metavar="N", help="requests decoded together (default 32)"
    )
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        metavar="NAME",
        help="another name clients may use (repeatable)",
    )
    defaults = ServerSettings()
    for flag, field, what in LIMIT_FLAGS:
        default = getattr(defaults, field)
        parser.add_argument(
            flag, type=int, default=default, dest=field, metavar="N", help=f"{what} (default {default})"
        )
    for flag, field, what in TIMEOUT_FLAGS:
        default = getattr(defaults, field)
        parser.add_argument(
            flag, type=float, default=default, dest=field, metavar="S", help=f"{what} (default {default:g} s)"
        )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin allowed to call the API, e.g. http://localhost:3000 (repeatable; default none)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another Host name clients use to reach this server, beside its address and localhost "
        "(repeatable; needed for the Host check when listening on 0.0.0.0)",
    )
    parser.add_argument(
        "--embedding-model",
        default=None,
        metavar="DIR_OR_GGUF",
        help="embedding model beside the chat model (default: MiniLM): a sentence-transformers BERT folder, "
        "or a Qwen3-Embedding folder or .gguf (last-token pooling, its own engine); 'self': last-token "
        "embeddings from the loaded model itself",
    )
    parser.add_argument(
        "--rerank-model",
        default=None,
        metavar="DIR_OR_GGUF",
        help="a Qwen3-Reranker folder or .gguf scoring /v1/rerank beside the chat model (default: cosine "
        "similarity of the embedding model's vectors)",
    )
    parser.add_argument(
        "--asr-model",
        action="append",
        default=[],
        metavar="DIR",
        help="a Qwen3-ASR or Granite Speech folder (or either's text GGUF with llama.cpp's mmproj beside it), or a "
        "Gemma 4 folder with audio, that /v1/audio/transcriptions also serves, by its folder or file name "
        "(repeatable; faster-whisper stays the default model)",
    )
    parser.add_argument("--no-embeddings", action="store_true", help="do not load an embedding model")
    parser.add_argument("--no-mcp", action="store_true", help="do not serve MCP at /mcp")
    parser.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch http(s) image URLs in requests (default: only inline data: URLs and base64 images)",
    )
    parser.add_argument(
        "--keep-volatile-metadata",
        action="store_true",
        help="keep client metadata that changes on every request in the prompt (Claude Code's "
        "x-anthropic-billing-header line); by default it is dropped, so the prefix cache hits past it",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def load_embedder(args: argparse.Namespace) -> object | None:
    """The embedding model, or None when switched off. The default one failing turns embeddings off
    with a warning; a model named with --embedding-model failing raises (OSError, ValueError)."""
    if args.no_embeddings:
        return None
    from app.engine.embeddings import BertEmbedder, load_default_embedder
    from app.engine.tasks.task_model import is_decoder_model, load_decoder_embedder

    if args.embedding_model:
        if is_decoder_model(args.embedding_model):
            return load_decoder_embedder(args.embedding_model, device=args.device)
        return BertEmbedder.from_dir(args.embedding_model)
    try:
        return load_default_embedder()
    except (OSError, RuntimeError, ValueError) as exc:
        logging.getLogger("paddock.serve").warning("embeddings are off: %s", exc)
        return None


def load_reranker(args: argparse.Namespace) -> object | None:
    """The --rerank-model, loaded as its own engine; None without one (the embedder's cosines score)."""
    if not args.rerank_model:
        return None
    from app.engine.tasks.task_model import load_decoder_reranker

    return load_decoder_reranker(args.rerank_model, device=args.device)


def server_settings(args: argparse.Namespace) -> ServerSettings:
    """The server's settings from the parsed flags; ValueError names a value out of range."""
    from app.engine.server.settings import ServerSettings

    return ServerSettings(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        model_aliases=tuple(args.served_model_name),
        cors_origins=tuple(args.cors_origin),
        allowed_hosts=tuple(args.allowed_host),
        enable_mcp=not args.no_mcp,
        allow_image_urls=args.allow_image_urls,
        strip_volatile_metadata=not args.keep_volatile_metadata,
        log_level=args.log_level,
        **{field: getattr(args, field) for _, field, _ in (*LIMIT_FLAGS, *TIMEOUT_FLAGS)},
    )


def load_speech_models(args: argparse.Namespace) -> list[object]:
    """The --asr-model folders, each loaded as its own engine (CheckpointError, a ValueError, naming it)."""
    from app.engine.tasks.speech_llm import SpeechLLMTranscriber

    return [SpeechLLMTranscriber.load(path, device=args.device) for path in args.asr_model]


def exit_on_sigterm() -> None:
    """SIGTERM (kill, systemd, docker stop) ends `paddock serve` through its `finally` as Ctrl-C does.

    uvicorn catches SIGTERM to shut the HTTP side down, then raises it again under the handler it found;
    Python's default one kills the process there, before `engine.close()`, so the engine thread never
    moved the prefix cache down to the KV disk tier. A SystemExit raised in its place unwinds normally
    (exit status 143, the shell's for SIGTERM)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    from app.commands.common import engine_config
    from app.engine import AsyncEngine
    from app.engine.server.launch import serve_blocking

    # The engine thread and the HTTP event loop share the GIL: hand it over often, so streams
    # are written while the GPU works rather than in bursts between steps.
    sys.setswitchinterval(0.0005)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = server_settings(args)
        config = engine_config(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"paddock serve: {exc}", file=sys.stderr)
        return 2
    try:  # models named on the command line, loaded before the chat model takes its share of the GPU
        embedder = None if args.embedding_model == "self" else load_embedder(args)
        reranker = load_reranker(args)
        speech_models = load_speech_models(args)
    except (OSError, ValueError) as exc:
        print(f"paddock serve: {exc}", file=sys.stderr)
        return 2
    try:
        engine = AsyncEngine(config)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"paddock serve: {exc}", file=sys.stderr)
        return 2
    exit_on_sigterm()
    try:
        if args.embedding_model == "self":
            from app.engine.tasks.pooling import DecoderEmbedder

            embedder = DecoderEmbedder(engine.engine, run_on_engine=lambda fn: engine.call(fn).result())
        serve_blocking(
            engine,
            settings=settings,
            embedder=embedder,  # type: ignore[arg-type]
            reranker=reranker,
            speech_models=speech_models,
        )
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(f"paddock serve: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.close()
    return 0
