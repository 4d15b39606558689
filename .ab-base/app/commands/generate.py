"""`paddock generate`: run one prompt through the engine and print the continuation."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "generate text from a prompt with a local model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.commands.common import (
        add_async_decode_argument,
        add_model_arguments,
        add_pacing_argument,
        add_speculative_arguments,
    )

    add_model_arguments(parser)
    add_async_decode_argument(parser)
    add_pacing_argument(parser)
    add_speculative_arguments(parser)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 for greedy (default 0.8)")
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--top-logprobs", type=int, default=0, metavar="K", help="report the K best tokens per step"
    )
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", default=None, help="system prompt (with --chat)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image for a vision model, placed before the prompt (repeatable; needs --chat)",
    )
    parser.add_argument(
        "prompt", help="the prompt (raw text; special tokens such as <start_of_turn> are parsed)"
    )


def prompt_ids(engine, args: argparse.Namespace, images: list | None = None) -> list[int]:
    """The prompt's token ids; with `images` (PreparedImages), their placeholders before the prompt
    text in the user turn, expanded into the model's image tokens."""
    tokenizer = engine.tokenizer
    if not args.chat:
        return tokenizer.encode(args.prompt)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    placeholders = engine.vision.placeholder * len(images) if images else ""
    messages.append({"role": "user", "content": placeholders + args.prompt})
    text = engine.chat_template.render(messages, add_generation_prompt=True)
    if images:
        text = engine.vision.expand(text, images)
    has_bos = tokenizer.bos_token is not None and text.startswith(tokenizer.bos_token)
    return tokenizer.encode(text, add_special_tokens=not has_bos)


def load_images(engine, paths: list[str]) -> list:
    """The images' PreparedImages; ValueError naming the file that cannot be used."""
    if not paths:
        return []
    if engine.vision is None:
        raise ValueError("--image: the loaded model has no vision (give a vision model, or its --mmproj)")
    images = []
    for path in paths:
        try:
            with open(path, "rb") as file:
                images.append(engine.vision.prepare(file.read()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--image {path}: {exc}") from None
    return images


def run(args: argparse.Namespace) -> int:
    from app.commands.common import engine_config
    from app.engine import LLMEngine, SamplingParams

    try:
        engine = LLMEngine(engine_config(args, max_num_seqs=1))
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            logprobs=args.top_logprobs if args.json or args.top_logprobs else None,
            stop=list(engine.chat_template.stop_strings) if args.chat else [],
        )
        if args.image and not args.chat:
            raise ValueError("--image needs --chat (the images go into the chat template's user turn)")
        images = load_images(engine, args.image)
        ids = prompt_ids(engine, args, images)
        views = engine.vision.views(images) if images else []
        engine.add_request("cli", ids, params, images=views)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"paddock generate: {exc}", file=sys.stderr)
        return 2
    token_ids: list[int] = []
    text: list[str] = []
    top: list[list[list[float]]] = []
    while engine.has_unfinished():
        for out in engine.step():
            token_ids.extend(out.new_token_ids)
            text.append(out.new_text)
            for lp in out.logprobs or []:
                top.append([[t, round(v, 6)] for t, v in lp.top])
            if not args.json:
                sys.stdout.write(out.new_text)
                sys.stdout.flush()
    if args.json:
        record = {"prompt_token_ids": ids, "token_ids": token_ids, "text": "".join(text), "top_logprobs": top}
        print(json.dumps(record, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    return 0
