"""Audio encoders: speech to the text model's input embeddings (soft tokens), beside `vision/`.

Qwen3-ASR (`qwen3_asr.py`: chunked convolutions, a windowed Whisper-style encoder and a two-layer
projector feeding Qwen3), its config and tensors (`qwen3_asr_config.py`, `qwen3_asr_weights.py`),
and the log-mel features its feature extractor computes, in numpy (`mel.py`). Granite Speech
(`granite_speech.py`: a conformer and a windowed Q-Former feeding Granite, whose LoRA adapter the loader
merges), its config, tensors and features (`granite_speech_config.py`, `granite_speech_weights.py`,
`granite_speech_features.py`). Gemma 4's audio tower and embedder (`gemma4_audio.py`, a conformer), its
config and tensors (`gemma4_audio_config.py`), its log-mel front end (`gemma4_audio_features.py`) and
prompt expansion (`gemma4_audio_prompter.py`). Each family's prompter builds its prompt and reads its reply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engine.models.audio.gemma4_audio import Gemma4AudioTower
from app.engine.models.audio.gemma4_audio_config import (
    gemma4_audio_config,
    has_gemma4_audio,
    load_gemma4_audio,
)
from app.engine.models.audio.granite_speech import GraniteSpeechAudioEncoder
from app.engine.models.audio.granite_speech_config import (
    GraniteSpeechAudioConfig,
    granite_speech_audio_config,
    is_granite_speech,
)
from app.engine.models.audio.granite_speech_weights import load_granite_speech_audio
from app.engine.models.audio.qwen3_asr import Qwen3AsrAudioEncoder
from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr, qwen3_asr_audio_config
from app.engine.models.audio.qwen3_asr_weights import load_qwen3_asr_audio

__all__ = ["SPEECH_ARCHITECTURES", "Gemma4AudioTower", "GraniteSpeechAudioEncoder", "Qwen3AsrAudioEncoder",
           "is_speech_model", "load_audio_encoder", "load_gemma4_audio_tower", "load_mmproj_audio_encoder",
           "speech_gguf", "speech_prompter"]  # fmt: skip

QWEN3_ASR_AUDIO_TOKEN = "<|audio_pad|>"  # what a Qwen3-ASR GGUF's vocabulary calls the audio's soft token
# the speech LLMs whose audio side this package runs (config.json architectures); Gemma 4's audio tower
# is an optional part of a chat model (has_gemma4_audio)
SPEECH_ARCHITECTURES = ("Qwen3ASRForConditionalGeneration", "GraniteSpeechForConditionalGeneration")


def is_speech_model(hf_config: dict[str, Any]) -> bool:
    return is_qwen3_asr(hf_config) or is_granite_speech(hf_config)


def load_audio_encoder(
    folder: Path, hf_config: dict[str, Any], backend: Any
) -> Qwen3AsrAudioEncoder | GraniteSpeechAudioEncoder | None:
    """The folder's audio encoder (a Qwen3-ASR or Granite Speech checkpoint's), or None for a model without one."""
    if is_granite_speech(hf_config):
        granite = granite_speech_audio_config(folder, hf_config)
        return GraniteSpeechAudioEncoder(backend, granite, load_granite_speech_audio(folder, granite))
    if not is_qwen3_asr(hf_config):
        return None
    cfg = qwen3_asr_audio_config(folder, hf_config)
    return Qwen3AsrAudioEncoder(backend, cfg, load_qwen3_asr_audio(folder, cfg))


def load_mmproj_audio_encoder(
    model_path: Path, text_config: Any, tokenizer: Any, backend: Any
) -> GraniteSpeechAudioEncoder | Qwen3AsrAudioEncoder:
    """The audio encoder of a text GGUF from the llama.cpp mmproj beside it (Granite Speech's: its
    `<|audio|>` token from the text model's vocabulary, its soft tokens scaled as the text model's
    embeddings are; Qwen3-ASR's `qwen3a`: its `<|audio_pad|>` token from the vocabulary)."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.loader.names import CheckpointError
    from app.engine.models.audio.granite_speech_mmproj import (
        granite_speech_from_mmproj,
        is_granite_speech_mmproj,
    )
    from app.engine.models.audio.granite_speech_prompter import AUDIO_TOKEN
    from app.engine.models.audio.qwen3_asr_mmproj import is_qwen3_asr_mmproj, qwen3_asr_from_mmproj
    from app.engine.models.audio.speech_mmproj import audio_projector_type
    from app.engine.models.vision.weights import find_mmproj

    mmproj = find_mmproj(model_path)
    if mmproj is None:
        raise CheckpointError(
            f"{model_path}: no mmproj*.gguf beside it (a speech GGUF's audio encoder is the mmproj file llama.cpp pairs with it)"
        )
    meta = read_gguf(mmproj).metadata
    if not is_qwen3_asr_mmproj(meta) and not is_granite_speech_mmproj(meta):
        raise CheckpointError(
            f"{mmproj}: clip.projector_type is {audio_projector_type(meta)!r}, not 'granite_speech' "
            "(Granite Speech) or 'qwen3a' (Qwen3-ASR)"
        )
    if is_qwen3_asr_mmproj(meta):
        pad_id = tokenizer.token_to_id(QWEN3_ASR_AUDIO_TOKEN)
        if pad_id is None:
            raise CheckpointError(f"{model_path}: its vocabulary has no {QWEN3_ASR_AUDIO_TOKEN} token for the audio")
        qwen_cfg, qwen_tensors = qwen3_asr_from_mmproj(mmproj, pad_id)
        return Qwen3AsrAudioEncoder(backend, qwen_cfg, qwen_tensors)
    audio_id = tokenizer.token_to_id(AUDIO_TOKEN)
    if audio_id is None:
        raise CheckpointError(f"{model_path}: its vocabulary has no {AUDIO_TOKEN} token for the audio")
    cfg, tensors = granite_speech_from_mmproj(mmproj, text_config.hidden_size, audio_id, text_config.embedding_scale)
    return GraniteSpeechAudioEncoder(backend, cfg, tensors)


def speech_gguf(path: Path) -> Path | None:
    """The text GGUF at `path` (the file, or a folder's one model GGUF) when a Granite Speech or Qwen3-ASR mmproj is beside
    it; None otherwise, unreadable files included (the loader then says what is wrong)."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.models.audio.granite_speech_mmproj import is_granite_speech_mmproj
    from app.engine.models.audio.qwen3_asr_mmproj import is_qwen3_asr_mmproj
    from app.engine.models.vision.weights import find_mmproj

    if path.is_file():
        models = [path] if path.suffix.lower() == ".gguf" else []
    else:
        models = sorted(p for p in path.glob("*.gguf") if "mmproj" not in p.name.lower()) if path.is_dir() else []
    if len(models) != 1:
        return None
    try:
        mmproj = find_mmproj(models[0])
        if mmproj is None:
            return None
        meta = read_gguf(mmproj).metadata
        return models[0] if is_granite_speech_mmproj(meta) or is_qwen3_asr_mmproj(meta) else None
    except (OSError, ValueError):
        return None


def speech_prompter(encoder: Any, tokenizer: Any) -> Any:
    """The prompter of an encoder's family: its prompt ids, soft-token counts and reply parsing."""
    from app.engine.models.audio.granite_speech_prompter import GraniteSpeechPrompter
    from app.engine.models.audio.qwen3_asr_prompter import Qwen3AsrPrompter

    if isinstance(encoder.config, GraniteSpeechAudioConfig):
        return GraniteSpeechPrompter(encoder.config, tokenizer)
    return Qwen3AsrPrompter(encoder.config, tokenizer)


def speech_adapter(folder: Path, hf_config: dict[str, Any]) -> Path | None:
    """The LoRA adapter folder a speech model turns on whenever audio is present (Granite Speech's
    adapter_config.json + adapter_model.safetensors beside its weights), or None for a family without one.
    A Granite Speech config that says it has one (`has_lora_adapter`, true by default) and a folder without
    it is refused: transcripts would come from the text model alone."""
    from app.engine.loader.lora import ADAPTER_CONFIG, has_lora_adapter
    from app.engine.loader.names import CheckpointError

    if not is_granite_speech(hf_config) or hf_config.get("has_lora_adapter", True) is False:
        return None
    if not has_lora_adapter(folder):
        raise CheckpointError(
            f"{folder / ADAPTER_CONFIG}: missing; config.json has_lora_adapter is true and Granite Speech "
            "transcribes with its LoRA adapter on"
        )
    return folder


def load_gemma4_audio_tower(folder: Path, hf_config: dict[str, Any], backend: Any) -> Gemma4AudioTower | None:
    """A Gemma 4 folder's audio tower and embedder, or None for one without `audio_config`."""
    if not has_gemma4_audio(hf_config):
        return None
    cfg = gemma4_audio_config(folder, hf_config)
    return Gemma4AudioTower(backend, cfg, load_gemma4_audio(folder, cfg))
