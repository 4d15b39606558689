"""`paddock transcribe FILE`: speech to text with the embedded Whisper model (or another one)."""

from __future__ import annotations

import argparse
import sys

HELP = (
    "Transcribe an audio or video file with Whisper (the embedded tiny.en model by default), Qwen3-ASR, "
    "Granite Speech or Gemma 4."
)
FORMATS = ("text", "json", "verbose_json", "srt", "vtt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="audio or video file (anything FFmpeg reads)")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    parser.add_argument("--language", help="spoken language, ISO-639-1 code or name (default: detect)")
    parser.add_argument("--prompt", help="text that guides spelling and style")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature, 0..1 (default: 0)"
    )
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="a CTranslate2 Whisper folder, a Qwen3-ASR or Granite Speech folder or text GGUF with llama.cpp's "
        "mmproj beside it, or a Gemma 4 folder with audio (default: embedded tiny.en)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to run")
    parser.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.engine.tasks import transcript_formats as formats
    from app.engine.tasks.audio import AudioError, Transcriber
    from app.engine.tasks.speech_llm import SpeechLLMTranscriber, is_speech_llm_folder

    try:
        if args.model and is_speech_llm_folder(args.model):
            transcriber = SpeechLLMTranscriber.load(args.model, device=args.device)
        else:
            transcriber = Transcriber(model_path=args.model, device=args.device)
        transcript = transcriber.transcribe(
            args.file,
            language=args.language,
            prompt=args.prompt,
            temperature=args.temperature,
            word_timestamps=args.format == "verbose_json",
        )
        # verbose_json from the command line carries both segment and word timestamps.
        granularities = ("segment", "word") if args.format == "verbose_json" else ()
        body = formats.render(transcript, args.format, granularities)
    except (AudioError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"paddock transcribe: error: {exc}", file=sys.stderr)
        return 1
    if args.format in ("json", "verbose_json"):
        body += "\n"
    if args.output:
        Path(args.output).write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
    return 0
