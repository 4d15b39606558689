"""Transcription by a speech LLM (Qwen3-ASR, Granite Speech, or Gemma 4 with an audio tower): an audio
encoder in front of a decoder the engine runs, beside faster-whisper's `Transcriber` and answering the same
calls (`paddock serve --asr-model`).

The model is a task model (tasks/task_model.py: its own `LLMEngine`, one sequence at a time, behind a
lock) whose runner has the audio encoder as its soft-token embedder: the clip's log-mel goes in as
the prompt's run of audio tokens, spliced as image soft tokens are. Qwen3-ASR's and Gemma 4's engines load
their own audio tower (core/audio.py); Qwen3-ASR's reply names the language (unless one was forced) before
`<asr_text>`, and Gemma 4's prompt is the model card's (gemma4_asr.py). Granite Speech's encoder is attached
here, with its prompter and the LoRA adapter merged into the text model (transformers turns it on whenever
audio is present); a text GGUF with llama.cpp's audio mmproj beside it loads the same way: Granite Speech's,
its adapter already merged into the GGUF, or Qwen3-ASR's (`qwen3vl` text, `qwen3a` mmproj), which the engine
does not attach (core/audio.py reads a GGUF's mmproj for Gemma 4 only). None gives timestamps, so the transcript is one segment
over the clip, or per window where the model takes a bounded clip (Gemma 4: 30 s). A cancel check (a
client that hung up) is read between engine steps: the request is aborted there, as faster-whisper's
stops between segments.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import (
    SPEECH_ARCHITECTURES,
    Qwen3AsrAudioEncoder,
    is_speech_model,
    load_audio_encoder,
    load_mmproj_audio_encoder,
    speech_adapter,
    speech_gguf,
    speech_prompter,
)
from app.engine.models.audio.gemma4_audio_config import has_gemma4_audio
from app.engine.models.audio.gemma4_audio_prompter import Gemma4AudioPrompter
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
from app.engine.tasks.gemma4_asr import Gemma4AsrPrompter
from app.engine.tasks.task_model import TaskModel
from app.engine.tasks.transcript_formats import language_code
from app.engine.worker.images import ImageEmbedder

MAX_REPLY_TOKENS = 1024
MIN_WINDOW_SAMPLES = 1600  # a last window under 0.1 s holds no word: not transcribed


class SpeechLLMTranscriber:
    """A speech LLM folder (or Granite Speech's or Qwen3-ASR's GGUF pair) as a transcriber; `transcribe` as
    `Transcriber.transcribe`."""

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
        if engine.audio is not None:  # the engine loaded its audio tower (Qwen3-ASR, Gemma 4: core/audio.py)
            # one clip's embeddings kept (tens of MB for minutes of audio): a clip is encoded once per request
            engine.runner.images.max_cached = 1
            if isinstance(engine.audio, Gemma4AudioPrompter):
                return cls(task, Gemma4AsrPrompter(engine.audio, engine.chat_template, engine.tokenizer))
            return cls(task, engine.audio)
        try:  # Granite Speech's folder's encoder, or the mmproj beside a text GGUF (Granite Speech's, Qwen3-ASR's)
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
                f"({', '.join(SPEECH_ARCHITECTURES)}, or Gemma 4 with an audio_config)"
            )
        hidden = engine.model_config.hidden_size
        if encoder.config.output_dim != hidden:
            raise CheckpointError(
                f"ASR model {path}: the audio projector outputs width {encoder.config.output_dim}, "
                f"the text model's is {hidden}"
            )
        # one clip's embeddings kept (tens of MB for minutes of audio): a clip is encoded once per request
        engine.runner.images = ImageEmbedder(encoder, engine.backend, max_cached=1)
        # places the audio tokens: Qwen3-ASR's clips are audio inputs, as the engine's own tower takes them;
        # Granite Speech's ride the image path
        if isinstance(encoder, Qwen3AsrAudioEncoder):
            engine.audio = prompter
        else:
            engine.vision = prompter
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
        request_id = f"asr-{next(self._request_ids)}"

        def cancelled(tokens: int) -> Exception:
            return TranscriptionCancelled(f"transcription cancelled after {tokens} tokens")

        return ids, self.task.run(
            lambda: self.task.generate(request_id, ids, params, [audio], cancel, cancelled)
        )

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
        window = getattr(self.prompter, "window_samples", None) or samples.size
        starts = [
            s for s in range(0, samples.size, window) if s == 0 or samples.size - s >= MIN_WINDOW_SAMPLES
        ]
        segments, found = [], code
        for i, start in enumerate(starts):
            if progress:
                progress(i / len(starts))
            try:
                _, reply = self.reply_ids(samples[start : start + window], code, prompt, cancel=cancel)
            except ValueError as exc:  # AudioClipError too: a clip the model cannot take
                raise AudioError(source, str(exc)) from None
            found, text = self.prompter.parse(reply, forced_language=code)
            if text:
                end = min(samples.size, start + window) / SAMPLE_RATE
                segments.append(Segment(id=len(segments), start=round(start / SAMPLE_RATE, 3), end=round(end, 3),
                                        text=text, tokens=list(reply)))  # fmt: skip
        if progress:
            progress(1.0)
        return Transcript(text=" ".join(s.text for s in segments), language=found or "", duration=duration,
                          segments=segments)  # fmt: skip


def is_speech_llm_folder(path: str | Path) -> bool:
    """A folder whose config.json names a speech LLM this module serves (Qwen3-ASR, Granite Speech, Gemma 4
    with an audio tower), or a text GGUF (or a folder holding one) with Granite Speech's or Qwen3-ASR's mmproj
    beside it; anything else, unreadable files included, is left to faster-whisper, whose errors name what it
    lacks."""
    config = _read_config(Path(path) / "config.json")
    if config is not None:
        return is_speech_model(config) or has_gemma4_audio(config)
    return speech_gguf(Path(path)) is not None


def _read_config(config_file: Path) -> dict[str, Any] | None:
    """config.json as an object, or None where it cannot be read (the loader then says why)."""
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None
