"""Task models in will-it-fit: an embedder, a reranker or a speech model is planned as its engine runs (the KV
blocks and context `paddock fit` predicts are the ones TaskModel.load allocates), a speech model with its
audio tower, and `paddock fit --embedding-model/--rerank-model/--asr-model` adds each beside the chat model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from app.commands import fit as fit_command
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.plan.fit import (
    FITS,
    TIGHT,
    WONT_FIT,
    BesideModel,
    DeviceMemory,
    FitOptions,
    check_fit,
    cpu_memory,
    shape_from_checkpoint,
    task_fit_options,
)
from app.engine.plan.job import EMBEDDINGS, RERANKING, TRANSCRIPTION
from app.engine.plan.task_fit import TASK_CONTEXT
from tests.engine.qwen3_task_fixtures import EMBEDDING_GGUF, RERANKER_GGUF

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ASR = FIXTURES / "qwen3_asr" / "hf"
CHAT = FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf"
MiB = 2**20


@pytest.mark.parametrize(("path", "job"), [(EMBEDDING_GGUF, EMBEDDINGS), (RERANKER_GGUF, RERANKING)],
                         ids=["embedding", "reranker"])  # fmt: skip
def test_fit_predicts_the_task_engines_blocks(path: Path, job: str) -> None:
    from app.engine.tasks.task_model import TaskModel

    engine = TaskModel.load(path, job, device="cpu").engine
    shape = shape_from_checkpoint(path)
    report = check_fit(shape, task_fit_options(shape, job), cpu_memory())
    assert (report.kv_blocks, report.engine_context) == (engine.plan.num_blocks, engine.max_model_len)
    assert report.kv_blocks == TASK_CONTEXT // 16 + 1  # one text of 8,192 tokens, whatever the model's context
    assert engine.kv.capacity == report.kv_blocks - 1  # the pool's null block
    assert report.breakdown.kv_cache == report.kv_blocks * shape.kv_bytes_per_token(4) * 16  # float32 on the CPU


def test_a_speech_model_brings_its_audio_tower() -> None:
    from app.engine.tasks.speech_llm import SpeechLLMTranscriber

    shape = shape_from_checkpoint(ASR)
    audio = sum(
        t.data.nbytes for f in weight_files(ASR) for name, t in read_safetensors_file(f).items()
        if name.startswith(("model.audio_tower.", "model.multi_modal_projector."))
    )  # fmt: skip
    assert shape.audio is not None and shape.audio.weight_bytes == audio > 0
    engine = SpeechLLMTranscriber.load(ASR, device="cpu").task.engine
    assert shape.weight_bytes == sum(t.nbytes for t in engine.checkpoint.tensors.values())  # the text model's
    report = check_fit(shape, task_fit_options(shape, TRANSCRIPTION), cpu_memory())
    assert report.kv_blocks == engine.plan.num_blocks
    assert report.breakdown.audio == shape.audio.weight_bytes + shape.audio.activation_bytes
    assert report.breakdown.audio < report.breakdown.total - report.breakdown.overhead  # counted in the total
    assert shape.audio.clip == "clip of 8,192 tokens"  # the longest clip the speech model's context holds


def _paddock_fit(capsys, *args: str) -> dict:
    parser = argparse.ArgumentParser()
    fit_command.add_arguments(parser)
    assert fit_command.run(parser.parse_args([*args, "--json", "--device", "cpu"])) == 0
    return json.loads(capsys.readouterr().out)


def test_paddock_fit_counts_the_task_models_beside_the_chat_model(capsys) -> None:
    alone = _paddock_fit(capsys, str(CHAT))
    both = _paddock_fit(capsys, str(CHAT), "--embedding-model", str(EMBEDDING_GGUF), "--asr-model", str(ASR))
    assert [(b["name"], b["job"]) for b in both["beside"]] == [("embedding-f16.gguf", EMBEDDINGS), ("hf", TRANSCRIPTION)]
    added = sum(b["breakdown"]["total"] for b in both["beside"])
    assert both["total"] == alone["total"] + added and both["breakdown"] == alone["breakdown"]
    embedding, asr = both["beside"]
    assert embedding["breakdown"]["overhead"] == 0 and embedding["breakdown"]["kv_cache"] > 0  # runtime: counted once
    assert asr["breakdown"]["audio_weights"] > 0 and asr["breakdown"]["audio_activations"] > 0
    assert _paddock_fit(capsys, str(ASR))["job"] == TRANSCRIPTION  # a speech model alone: planned as a task model


def test_a_task_model_beside_turns_the_verdict(capsys) -> None:
    """A device where the chat model alone fits and, with a speech model beside it, does not."""
    chat, asr = shape_from_checkpoint(CHAT), shape_from_checkpoint(ASR)
    beside = (BesideModel("asr", TRANSCRIPTION, asr),)
    probe = check_fit(chat, FitOptions(), DeviceMemory("cpu", "probe", 64 * MiB * 1024, 64 * MiB * 1024), beside)
    own, extra = probe.breakdown.total, probe.beside[0].total
    free = int((own + extra // 2) / (0.9 * 0.95))  # room for the chat model and half the speech model
    device = DeviceMemory("cpu", "small", free, free)
    assert check_fit(chat, FitOptions(), device).verdict == FITS
    report = check_fit(chat, FitOptions(), device, beside)
    assert report.verdict in (WONT_FIT, TIGHT) and report.max_context < check_fit(chat, FitOptions(), device).max_context
    assert report.total == own + extra and "transcription model asr" in report.summary()
    parser = argparse.ArgumentParser()  # a path that is not there is refused before anything is planned
    fit_command.add_arguments(parser)
    assert fit_command.run(parser.parse_args([str(CHAT), "--rerank-model", "/no/such/reranker"])) == 2
    assert "--rerank-model /no/such/reranker: no such file or folder" in capsys.readouterr().err
