"""What a checkpoint does, read from its own files (plan/job.py): the GGUF pooling type and reranker head as
llama.cpp writes them, a folder's config.json and sentence-transformers modules, and the towers the engine
loads beside it; never the file name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.engine.loader.names import CheckpointError
from app.engine.plan.job import (
    CHAT,
    CHAT_AUDIO,
    CHAT_IMAGES,
    CHAT_IMAGES_AUDIO,
    EMBEDDINGS,
    OCR,
    RERANKING,
    TRANSCRIPTION,
    gguf_job,
    model_job,
)
from tests.engine.qwen3_task_fixtures import EMBEDDING, EMBEDDING_GGUF, RERANKER, RERANKER_GGUF

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("path", "job"),
    [
        (EMBEDDING_GGUF, EMBEDDINGS),  # qwen3.pooling_type = 3 (LAST)
        (RERANKER_GGUF, RERANKING),  # qwen3.pooling_type = 4 (RANK), cls.output.weight
        (EMBEDDING, EMBEDDINGS),  # modules.json with a Pooling module
        (FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf", CHAT),
        (FIXTURES / "families" / "qwen3" / "hf", CHAT),
        (FIXTURES / "qwen3_asr" / "hf", TRANSCRIPTION),
        (FIXTURES / "gemma4_vision" / "hf", CHAT_IMAGES),
        (FIXTURES / "vision" / "qwen2_5_vl" / "hf", CHAT_IMAGES),
        (FIXTURES / "gemma4" / "dense", CHAT),  # Gemma 4 without a vision_config: text only
        (FIXTURES / "gemma4_audio" / "hf", CHAT_AUDIO),  # an audio_config, a null vision_config
        (FIXTURES / "granite_speech" / "hf", TRANSCRIPTION),
        (FIXTURES / "vision" / "paddleocr_vl" / "hf", OCR),
    ],
    ids=lambda v: v if isinstance(v, str) else f"{v.parent.name}/{v.name}",
)
def test_the_job_is_read_from_the_checkpoint(path: Path, job: str) -> None:
    assert model_job(path) == job


def test_a_qwen3_reranker_folder_declares_nothing_a_chat_model_does_not() -> None:
    """Its config.json is a chat Qwen3's and it has no modules.json: only its GGUF conversion says reranker."""
    assert model_job(RERANKER) == CHAT and model_job(RERANKER_GGUF) == RERANKING


def test_the_name_does_not_decide(tmp_path: Path) -> None:
    shutil.copy(EMBEDDING_GGUF, tmp_path / "Qwen3-8B-Instruct-chat.gguf")
    shutil.copy(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf", tmp_path / "reranker-embedding.gguf")
    assert model_job(tmp_path / "Qwen3-8B-Instruct-chat.gguf") == EMBEDDINGS
    assert model_job(tmp_path / "reranker-embedding.gguf") == CHAT


def test_a_gguf_takes_images_with_the_mmproj_the_loader_would_use(tmp_path: Path) -> None:
    gemma = tmp_path / "gemma3.gguf"
    shutil.copy(FIXTURES / "families" / "gemma3" / "gemma3-f16.gguf", gemma)
    assert model_job(gemma) == CHAT
    shutil.copy(FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf", tmp_path / "mmproj-gemma3.gguf")
    assert model_job(gemma) == CHAT_IMAGES


def _folder_with(tmp_path: Path, source: Path, **config) -> Path:
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, **config}))
    return folder


def test_folders_declaring_speech_ocr_or_an_audio_tower(tmp_path: Path) -> None:
    vision = FIXTURES / "gemma4_vision" / "hf"
    audio = _folder_with(tmp_path / "audio", vision, audio_config={"hidden_size": 32})
    assert model_job(audio) == CHAT_IMAGES_AUDIO  # Gemma 4 with its conformer beside the vision tower
    ocr = _folder_with(tmp_path / "ocr", FIXTURES / "qwen3_tasks" / "reranker", model_type="paddleocr_vl")
    assert model_job(ocr) == OCR
    speech = _folder_with(tmp_path / "speech", FIXTURES / "qwen3_tasks" / "reranker",
                          architectures=["GraniteSpeechForConditionalGeneration"])  # fmt: skip
    assert model_job(speech) == TRANSCRIPTION


def test_a_header_alone_and_a_broken_modules_file(tmp_path: Path) -> None:
    meta = {"general.architecture": "qwen3", "qwen3.pooling_type": 1}  # MEAN
    assert gguf_job(meta, ()) == EMBEDDINGS
    assert gguf_job({"general.architecture": "qwen3"}, ["cls.output.weight"]) == RERANKING
    assert gguf_job({"general.architecture": "gemma3"}, (), images=True) == CHAT_IMAGES
    # llama.cpp's PaddleOCR-VL text GGUF reads pages whatever mmproj is beside it
    assert gguf_job({"general.architecture": "paddleocr"}, (), images=True) == OCR
    broken = _folder_with(tmp_path, EMBEDDING)
    (broken / "modules.json").write_text('{"not": "a list"}')
    with pytest.raises(CheckpointError, match=r"modules\.json: holds a JSON dict, not a list of modules"):
        model_job(broken)
