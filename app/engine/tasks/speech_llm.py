"""Transcription by a speech LLM (Qwen3-ASR, Granite Speech): an audio encoder in front of a decoder the
engine runs, beside faster-whisper's `Transcriber` and answering the same calls (`paddock serve --asr-model`).

The model is a task model (tasks/task_model.py: its own `LLMEngine`, one sequence at a time, behind a
lock) whose runner gets the audio encoder as its soft-token embedder: the clip's log-mel goes in as
the prompt's run of audio tokens, spliced as image soft tokens are. models/audio/ picks the family by
config.json: its encoder, its prompter (Qwen3-ASR's reply names the language unless one was forced;
Granite Speech's is the transcript alone) and the LoRA adapter merged into the text model (Granite
Speech's, which transformers turns on whenever audio is present). A text GGUF with llama.cpp's audio
mmproj beside it (Granite Speech's) loads the same way, its adapter already merged into the GGUF. Neither
model gives timestamps, so the transcript is one segment over the whole clip. A cancel check (a client that hung up) is read between engine
steps: the request is aborted there, as faster-whisper's stops between segments.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import (
    SPEECH_ARCHITECTURES,
    is_speech_model,
    load_audio_encoder,
    load_mmproj_audio_encoder,
    speech_adapter,
    speech_gguf,
    speech_prompter,
)
from app.engine.sampling_params import SamplingParams
from app.engine.tasks.audio import (
    SAMPLE_RATE,
    AudioError,
    AudioInput,
    CancelCheck,
    ProgressCallback,
    Segment,
    Transcript,
    TranscriptionCancelled,
    decode_audio,
    describe_audio,
)
from app.engine.tasks.task_model import TaskModel
from app.engine.tasks.transcript_formats import language_code
from app.engine.worker.images import ImageEmbedder

ASR_CONTEXT = 8192  # prompt + reply tokens: 13 audio tokens a second, so about eight minutes of audio
MAX_REPLY_TOKENS = 1024


class SpeechLLMTranscriber:
    """A speech LLM folder as a transcriber; `transcribe` as `Transcriber.transcribe`."""

    loaded = True  # loaded when made: the engine is built at start, like the chat model

    def __init__(self, task: TaskModel, prompter: Any, max_reply_tokens: int = MAX_REPLY_TOKENS):
        self.task, self.prompter = task, prompter
        self.model_name = task.name
        self.device = "cuda" if task.engine.backend.name == "cuda" else "cpu"  # what the Studio shows
        self.max_reply_tokens = max_reply_tokens
        self._request_ids = itertools.count()

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", context: int = ASR_CONTEXT) -> SpeechLLMTranscriber:
        """The speech LLM at `path`: a Hugging Face folder, or a text GGUF with its audio mmproj beside it
        (llama.cpp's layout: Granite Speech's or Qwen3-ASR's); errors name the path and the problem."""
        path = Path(path)
        config_file = path / "config.json"
        if path.is_dir() and not config_file.is_file():
            path = speech_gguf(path) or path  # a folder holding llama.cpp's pair
        is_gguf = path.suffix.lower() == ".gguf"
        if not is_gguf and (not path.is_dir() or not config_file.is_file()):
            raise CheckpointError(f"ASR model {path}: not a model folder (no config.json)")
        try:
            adapter = None if is_gguf else speech_adapter(path, _read_config(config_file) or {})
        except ValueError as exc:
            raise CheckpointError(f"ASR model {exc}") from None
        task = TaskModel.load(path, "ASR", device, context, lora_adapter=adapter)
        engine = task.engine
        try:
            if is_gguf:
                encoder = load_mmproj_audio_encoder(path, engine.model_config, engine.tokenizer, engine.backend)
            else:
                encoder = load_audio_encoder(path, engine.checkpoint.hf_config or {}, engine.backend)
            prompter = speech_prompter(encoder, engine.tokenizer) if encoder is not None else None
        except ValueError as exc:
            raise CheckpointError(
                f"ASR model {exc}" if str(path) in str(exc) else f"ASR model {path}: {exc}"
            ) from None
        if encoder is None:
            raise CheckpointError(
                f"ASR model {path}: {config_file.name} names {engine.checkpoint.architecture}, not a speech model "
                f"({', '.join(SPEECH_ARCHITECTURES)})"
            )
        hidden = engine.model_config.hidden_size
        if encoder.config.output_dim != hidden:
            raise CheckpointError(
                f"ASR model {path}: the audio projector outputs width {encoder.config.output_dim}, "
                f"the text model's is {hidden}"
            )
        # one clip's embeddings kept (tens of MB for minutes of audio): a clip is encoded once per request
        engine.runner.images = ImageEmbedder(encoder, engine.backend, max_cached=1)
        engine.vision = prompter  # places the audio tokens
        return cls(task, prompter)

    def reply_ids(self, samples: Any, language: str | None = None, prompt: str | None = None,
                  min_tokens: int = 0, cancel: CancelCheck | None = None) -> tuple[list[int], list[int]]:  # fmt: skip
        """`(prompt ids, greedy reply ids)` for mono 16 kHz samples (the tests read both); `cancel()` is
        checked between engine steps (TranscriptionCancelled, the request dropped from the engine)."""
        audio = self.prompter.audio_input(samples)
        ids = self.prompter.prompt_ids(audio, language, prompt or "")
        engine = self.task.engine
        room = engine.max_model_len - len(ids)
        if room < 1:
            seconds = samples.size / SAMPLE_RATE
            raise ValueError(
                f"{seconds:.0f} s of audio make a {len(ids)}-token prompt; {self.model_name} takes "
                f"{engine.max_model_len} tokens at once"
            )
        params = SamplingParams(
            temperature=0.0, max_tokens=min(room, self.max_reply_tokens), min_tokens=min_tokens
        )
        return ids, self.task.run(lambda: self._generate(ids, params, audio, cancel))

    def _generate(
        self, ids: list[int], params: SamplingParams, audio: Any, cancel: CancelCheck | None
    ) -> list[int]:
        engine = self.task.engine
        request_id = f"asr-{next(self._request_ids)}"
        engine.add_request(request_id, ids, params, images=[audio])
        reply: list[int] = []
        while engine.has_unfinished():
            if cancel is not None and cancel():
                engine.abort(request_id)
                raise TranscriptionCancelled(f"transcription cancelled after {len(reply)} tokens")
            for out in engine.step():
                if out.error is not None:
                    raise RuntimeError(f"{self.model_name}: {out.error}")
                reply.extend(out.new_token_ids)
        return reply

    def transcribe(
        self,
        audio: AudioInput,
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = False,
        progress: ProgressCallback | None = None,
        cancel: CancelCheck | None = None,
        source: str | None = None,
        max_seconds: float | None = None,
    ) -> Transcript:
        """As `Transcriber.transcribe`; greedy whatever the temperature (the model card decodes greedily),
        and no word timestamps (the model gives none)."""
        if not 0.0 <= temperature <= 1.0:
            raise ValueError(f"temperature must be between 0 and 1, got {temperature}")
        code = language_code(language) if language else None
        source = source or describe_audio(audio)
        samples = decode_audio(audio, source, max_seconds, cancel)
        duration = round(samples.size / SAMPLE_RATE, 3)
        if cancel is not None and cancel():
            raise TranscriptionCancelled("transcription cancelled before it started")
        if progress:
            progress(0.0)
        try:
            _, reply = self.reply_ids(samples, code, prompt, cancel=cancel)
        except ValueError as exc:
            raise AudioError(source, str(exc)) from None
        found, text = self.prompter.parse(reply, forced_language=code)
        if progress:
            progress(1.0)
        segments = [Segment(id=0, start=0.0, end=duration, text=text, tokens=list(reply))] if text else []
        return Transcript(text=text, language=found or "", duration=duration, segments=segments)


def is_speech_llm_folder(path: str | Path) -> bool:
    """A folder whose config.json names a speech LLM this module serves (Qwen3-ASR, Granite Speech), or a
    text GGUF (or a folder holding one) with Granite Speech's or Qwen3-ASR's mmproj beside it; anything else, unreadable
    files included, is left to faster-whisper, whose errors name what it lacks."""
    config = _read_config(Path(path) / "config.json")
    if config is not None:
        return is_speech_model(config)
    return speech_gguf(Path(path)) is not None


def _read_config(config_file: Path) -> dict[str, Any] | None:
    """config.json as an object, or None where it cannot be read (the loader then says why)."""
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None
