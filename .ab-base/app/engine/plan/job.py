"""What a checkpoint does (its job), read from the checkpoint's own description of itself, as the engine
would run it: never guessed from a file name.

- A GGUF: llama.cpp's converter writes `{arch}.pooling_type` for sentence-transformers models (LAST, MEAN,
  CLS: an embedder) and RANK for a reranker, whose yes/no head it keeps as `cls.output.weight` (the
  tensor `--rerank-model` scores with, tasks/task_model.py). Anything else is a chat model, which takes
  images where a vision tower is beside it (vision_fit.py finds it as the loader does).
- A Hugging Face folder: config.json names a speech model (Qwen3-ASR, Granite Speech: transcription) or
  PaddleOCR-VL (OCR) by its `model_type` / `architectures`; a sentence-transformers `modules.json` with a
  Pooling module is an embedder (what `--embedding-model` pools by); otherwise a chat model, with images
  where its vision tower counts (vision_fit.py) and audio where its family's audio tower does.

A Qwen3-Reranker folder declares nothing a chat Qwen3 does not (same config.json, no modules.json): it
reads as chat; its GGUF conversion carries the head and the pooling type, and reads as reranking.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError

CHAT = "chat"
CHAT_IMAGES = "chat + images"
CHAT_AUDIO = "chat + audio"
CHAT_IMAGES_AUDIO = "chat + images + audio"
EMBEDDINGS = "embeddings"
RERANKING = "reranking"
TRANSCRIPTION = "transcription"
OCR = "OCR"
TASK_JOBS = (EMBEDDINGS, RERANKING, TRANSCRIPTION, OCR)  # run beside the chat model, one text at a time

CLASSIFIER_HEAD = "cls.output.weight"  # llama.cpp's Qwen3-Reranker head: the "yes" and "no" rows
# gguf-py's PoolingType: what `{arch}.pooling_type` holds
POOLING_EMBEDS = (1, 2, 3)  # MEAN, CLS, LAST
POOLING_RANK = 4
# config.json model types and architectures whose whole job is fixed by the checkpoint, for the families whose
# readers are not on this floor's path yet (Granite Speech, PaddleOCR-VL: their names in loader/names.py);
# Qwen3-ASR is told by its own reader (models/audio/qwen3_asr_config.is_qwen3_asr)
_FOLDER_JOBS = {"granite_speech": TRANSCRIPTION, "paddleocr_vl": OCR}
_ARCHITECTURE_JOBS = {"GraniteSpeechForConditionalGeneration": TRANSCRIPTION, "PaddleOCRVLForConditionalGeneration": OCR}
# families whose audio tower the engine loads beside the text model from a folder's `audio_config`
# (Gemma 4's conformer, core/audio.py; a Gemma 4 GGUF's audio mmproj is not told apart here)
AUDIO_TOWER_MODEL_TYPES = ("gemma4",)
# GGUF architectures whose whole job is fixed (llama.cpp's name for PaddleOCR-VL's ERNIE text model)
_GGUF_JOBS = {"paddleocr": OCR}


def gguf_job(meta: Mapping[str, Any], tensor_names: Iterable[str], images: bool = False) -> str:
    """The job of a GGUF from its header keys and tensor names; `images`: a vision tower is beside it."""
    arch = str(meta.get("general.architecture") or "")
    pooling = meta.get(f"{arch}.pooling_type")
    if pooling == POOLING_RANK or CLASSIFIER_HEAD in set(tensor_names):
        return RERANKING
    if pooling in POOLING_EMBEDS:
        return EMBEDDINGS
    if arch in _GGUF_JOBS:
        return _GGUF_JOBS[arch]
    return CHAT_IMAGES if images else CHAT


def folder_job(folder: str | Path, config: Mapping[str, Any], images: bool = False) -> str:
    """The job of a Hugging Face folder from its config.json (and modules.json); `images`: its vision tower
    counts (the loader gives its family one)."""
    from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr

    if is_qwen3_asr(dict(config)):
        return TRANSCRIPTION
    fixed = _FOLDER_JOBS.get(str(config.get("model_type") or ""))
    for name in config.get("architectures") or ():
        fixed = fixed or _ARCHITECTURE_JOBS.get(str(name))
    if fixed:
        return fixed
    if pooling_module(Path(folder)) is not None:
        return EMBEDDINGS
    audio = config.get("model_type") in AUDIO_TOWER_MODEL_TYPES and isinstance(config.get("audio_config"), dict)
    if not images:
        return CHAT_AUDIO if audio else CHAT
    return CHAT_IMAGES_AUDIO if audio else CHAT_IMAGES


def model_job(path: str | Path) -> str:
    """The job of a local checkpoint (a .gguf file, with the mmproj the loader would find beside it, or a
    Hugging Face folder), from its headers and config files alone (ValueError naming what is unreadable)."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.loader.names import architecture_of
    from app.engine.plan.vision_fit import mmproj_beside, takes_images

    path = Path(path)
    if path.is_file():
        file = read_gguf(path)
        arch = str(file.metadata.get("general.architecture") or "")
        return gguf_job(file.metadata, file.tensors, takes_images(arch) and mmproj_beside(path) is not None)
    config = read_json(path / "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path / 'config.json'}: holds a JSON {type(config).__name__}, not a config")
    try:
        # a null vision_config (Gemma 4 E-series exported without vision) is no tower
        images = takes_images(architecture_of(config)) and isinstance(config.get("vision_config"), dict)
    except CheckpointError:
        images = False
    return folder_job(path, config, images)


def with_images(job: str | None) -> str | None:
    """The job of a model whose vision tower was found beside it (an mmproj): a chat model takes images."""
    return CHAT_IMAGES if job == CHAT else job


def with_audio(job: str | None) -> str | None:
    """The job of a chat model whose audio tower was found beside it (a Gemma 4 mmproj's audio half)."""
    return {CHAT: CHAT_AUDIO, CHAT_IMAGES: CHAT_IMAGES_AUDIO}.get(job or "", job)


def is_task_job(job: str | None) -> bool:
    """A model that runs beside the chat model (tasks/task_model.py), not as it."""
    return job in TASK_JOBS


def pooling_module(folder: Path) -> dict[str, Any] | None:
    """The settings of modules.json's Pooling module ({} where it has no config.json); None without one
    (CheckpointError naming the file that is not what sentence-transformers writes)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = read_json(modules_file)
    if not isinstance(modules, list):
        raise CheckpointError(f"{modules_file}: holds a JSON {type(modules).__name__}, not a list of modules")
    for module in modules:
        if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling"):
            config = folder / str(module.get("path", "")) / "config.json"
            settings = read_json(config) if config.is_file() else {}
            if not isinstance(settings, dict):
                kind = type(settings).__name__
                raise CheckpointError(f"{config}: holds a JSON {kind}, not pooling settings")
            return settings
    return None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
