"""Transcription by a speech LLM (Qwen3-ASR, or Gemma 4 with an audio tower): an audio encoder in front
of a decoder the engine runs, beside faster-whisper's `Transcriber` and answering the same calls
(`paddock serve --asr-model`).

The model is a task model (tasks/task_model.py: its own `LLMEngine`, one sequence at a time, behind a
lock) whose runner has the audio encoder as its soft-token embedder: the clip's log-mel goes in as
the prompt's run of audio tokens, spliced as image soft tokens are. Qwen3-ASR's encoder is attached
here and its reply names the language (unless one was forced) before `<asr_text>`; Gemma 4's engine
loads its own audio tower and its prompt is the model card's (gemma4_asr.py). Neither gives timestamps,
so the transcript is one segment over the clip, or per window where the model takes a bounded clip
(Gemma 4: 30 s). A cancel check (a client that hung up) is read between engine steps: the request is
aborted there, as faster-whisper's stops between segments.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio.gemma4_audio_config import has_gemma4_audio
from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr
from app.engine.models.audio.qwen3_asr_prompter import Qwen3AsrPrompter
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

ASR_CONTEXT = 8192  # prompt + reply tokens: 13 audio tokens a second, so about eight minutes of audio
MAX_REPLY_TOKENS = 1024
MIN_WINDOW_SAMPLES = 1600  # a last window under 0.1 s holds no word: not transcribed


class SpeechLLMTranscriber:
    """A Qwen3-ASR or Gemma 4 (with audio) folder as a transcriber; `transcribe` as `Transcriber.transcribe`."""

    loaded = True  # loaded when made: the engine is built at start, like the chat model

    def __init__(
        self,
        task: TaskModel,
        prompter: Qwen3AsrPrompter | Gemma4AsrPrompter,
        max_reply_tokens: int = MAX_REPLY_TOKENS,
    ):
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
        task = TaskModel.load(path, "ASR", device, context)  # the engine loads the audio tower (core/audio.py)
        engine = task.engine
        if engine.audio is None:
            raise CheckpointError(
                f"ASR model {path}: {config_file.name} names {engine.checkpoint.architecture}, not a speech model "
                "(Qwen3ASRForConditionalGeneration, or Gemma 4 with an audio_config)"
            )
        # one clip's embeddings kept (tens of MB for minutes of audio): a clip is encoded once per request
        engine.runner.images.max_cached = 1
        if isinstance(engine.audio, Qwen3AsrPrompter):
            return cls(task, engine.audio)
        return cls(task, Gemma4AsrPrompter(engine.audio, engine.chat_template, engine.tokenizer))

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
    """A folder whose config.json names a speech LLM this module serves (Qwen3-ASR, Gemma 4 with an
    audio tower); anything else, unreadable files included, is left to faster-whisper, whose errors
    name what it lacks."""
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and (is_qwen3_asr(config) or has_gemma4_audio(config))
