"""Transcription by a speech LLM (Qwen3-ASR): an audio encoder in front of a decoder the engine
runs, beside faster-whisper's `Transcriber` and answering the same calls (`paddock serve --asr-model`).

The model is a task model (tasks/task_model.py: its own `LLMEngine`, one sequence at a time, behind a
lock) whose runner gets the audio encoder as its soft-token embedder: the clip's log-mel goes in as
the prompt's run of `<|audio_pad|>` tokens, spliced as image soft tokens are. The reply names the
language (unless one was forced) before `<asr_text>`; the model gives no timestamps, so the transcript
is one segment over the whole clip. A cancel check (a client that hung up) is read between engine
steps: the request is aborted there, as faster-whisper's stops between segments.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import load_audio_encoder
from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr
from app.engine.models.audio.qwen3_asr_prompter import Qwen3AsrPrompter
from app.engine.plan.audio_fit import ASR_CONTEXT
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

MAX_REPLY_TOKENS = 1024


class SpeechLLMTranscriber:
    """A Qwen3-ASR folder as a transcriber; `transcribe` as `Transcriber.transcribe`."""

    loaded = True  # loaded when made: the engine is built at start, like the chat model

    def __init__(self, task: TaskModel, prompter: Qwen3AsrPrompter, max_reply_tokens: int = MAX_REPLY_TOKENS):
        self.task, self.prompter = task, prompter
        self.model_name = task.name
        self.device = "cuda" if task.engine.backend.name == "cuda" else "cpu"  # what the Studio shows
        self.max_reply_tokens = max_reply_tokens
        self._request_ids = itertools.count()

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", context: int = ASR_CONTEXT) -> SpeechLLMTranscriber:
        """The speech LLM at `path` (a Hugging Face folder); errors name the path and the problem."""
        path = Path(path)
        config_file = path / "config.json"
        if path.suffix.lower() == ".gguf":
            raise CheckpointError(
                f"ASR model {path}: speech GGUFs (with an audio mmproj) are not read yet; give the Hugging Face folder"
            )
        if not path.is_dir() or not config_file.is_file():
            raise CheckpointError(f"ASR model {path}: not a model folder (no config.json)")
        task = TaskModel.load(path, "ASR", device, context)
        engine = task.engine
        try:
            encoder = load_audio_encoder(path, engine.checkpoint.hf_config or {}, engine.backend)
        except ValueError as exc:
            raise CheckpointError(
                f"ASR model {exc}" if str(path) in str(exc) else f"ASR model {path}: {exc}"
            ) from None
        if encoder is None:
            raise CheckpointError(
                f"ASR model {path}: {config_file.name} names {engine.checkpoint.architecture}, not a speech model "
                "(Qwen3ASRForConditionalGeneration)"
            )
        hidden = engine.model_config.hidden_size
        if encoder.config.output_dim != hidden:
            raise CheckpointError(
                f"ASR model {path}: the audio projector outputs width {encoder.config.output_dim}, "
                f"the text model's is {hidden}"
            )
        # one clip's embeddings kept (tens of MB for minutes of audio): a clip is encoded once per request
        engine.runner.images = ImageEmbedder(encoder, engine.backend, max_cached=1)
        engine.vision = prompter = Qwen3AsrPrompter(
            encoder.config, engine.tokenizer
        )  # places the audio tokens
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
    """A folder whose config.json names a speech LLM this module serves (Qwen3-ASR); anything else,
    unreadable files included, is left to faster-whisper, whose errors name what it lacks."""
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and is_qwen3_asr(config)
