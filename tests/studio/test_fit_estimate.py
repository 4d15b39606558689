"""Will-it-fit as the Studio shows it: at the chat's context (default 8k) with the model's maximum beside it,
and the decode speed memory bandwidth allows on this machine ("fits but slow")."""

from __future__ import annotations

import dataclasses

from app.engine.plan.fit import FITS, WONT_FIT, DeviceMemory, FitOptions, check_fit, is_task_job
from app.studio.fit_estimate import (
    SLOW_TOKENS_PER_S,
    active_weight_bytes,
    decode_speed,
    estimate,
    fit_at_context,
    memory_bandwidth,
)
from app.studio.recommendations import RECOMMENDED, recommended_fits
from app.studio.runtime import fit_options
from app.studio.settings import Settings

GiB = 2**30
CPU_24GB = DeviceMemory("cpu", "no GPU: CPU RAM", 24 * GiB, 24 * GiB)
BANDWIDTH = 20e9  # bytes/s: a desktop's dual-channel DDR4, as the copy probe measures it


def _studio_defaults(tmp_path) -> FitOptions:
    return fit_options(Settings.load(tmp_path / "settings.json"))  # a fresh install's settings


def test_on_a_24_gb_cpu_every_verdict_is_at_8k_and_llama_3_2_3b_fits(tmp_path):
    options = _studio_defaults(tmp_path)
    assert options.context_length == 8192
    rows = {row.recommendation.title: row for row in recommended_fits(options, CPU_24GB, bandwidth=BANDWIDTH)}
    assert len(rows) == len(RECOMMENDED)
    for title, row in rows.items():
        assert row.report.context_length == min(8192, row.recommendation.context), title
        assert row.report.model_context_length == row.recommendation.context  # the maximum, shown beside it
        assert row.report.breakdown.weights == row.recommendation.size_bytes and row.report.breakdown.kv_cache > 0
        if is_task_job(row.recommendation.job):
            assert row.speed is None  # an embedder or a reranker generates nothing: no decode speed
        else:  # every weight read per token, or a mixture of experts' routed share of them
            assert row.speed is not None
            assert row.speed.bytes_per_token == active_weight_bytes(row.recommendation.shape) > 0
    llama = rows["Llama 3.2 3B Instruct"]
    assert llama.report.verdict == FITS and llama.report.model_context_length == 131072
    # the case: at its full 131k context (28 GiB of float32 KV) the same model did not fit
    assert check_fit(llama.recommendation.shape, FitOptions(), CPU_24GB).verdict == WONT_FIT
    assert rows["Qwen3 8B"].report.verdict == FITS and rows["Qwen3 32B"].report.verdict != FITS


def test_fits_but_slow_is_told_from_memory_bandwidth(tmp_path):
    rows = {row.recommendation.title: row for row in
            recommended_fits(_studio_defaults(tmp_path), CPU_24GB, bandwidth=BANDWIDTH)}
    small, big = rows["Llama 3.2 3B Instruct"].speed, rows["Qwen3 8B"].speed
    assert small.tokens_per_s == BANDWIDTH / 2_019_000_000 and not small.slow  # ~9.9 tokens/s
    assert big.tokens_per_s == BANDWIDTH / 5_027_000_000 < SLOW_TOKENS_PER_S and big.slow  # ~4.0 tokens/s
    assert big.short() == "~4.0 tok/s, slow" and "answers will come slowly" in big.describe()
    assert small.short() == "~9.9 tok/s" and "20.0 GB/s" in small.describe()
    assert decode_speed(RECOMMENDED[0].shape, None) is None  # bandwidth unknown: no number is made up


def test_a_mixture_of_experts_reads_only_its_routed_experts_per_token():
    dense = RECOMMENDED[0].shape
    moe = dataclasses.replace(dense, weight_bytes=10 * GiB, expert_bytes=8 * GiB, num_experts=128, experts_used=8)
    assert active_weight_bytes(dense) == dense.weight_bytes
    assert active_weight_bytes(moe) == 2 * GiB + 8 * GiB * 8 // 128


def test_a_context_setting_past_the_model_maximum_is_the_maximum_and_0_is_the_maximum():
    shape = RECOMMENDED[0].shape  # 32k
    assert fit_at_context(shape, FitOptions(context_length=1_000_000), CPU_24GB).context_length == 32768
    assert fit_at_context(shape, FitOptions(context_length=None), CPU_24GB).context_length == 32768
    assert fit_at_context(shape, FitOptions(context_length=4096), CPU_24GB).context_length == 4096


def test_the_bandwidth_is_measured_here_once():
    measured = memory_bandwidth("cpu")
    assert measured is not None and measured > 1e8  # any machine copies faster than 100 MB/s
    assert memory_bandwidth("cpu") == measured  # cached: measured once per process
    result = estimate(RECOMMENDED[0].shape, FitOptions(context_length=8192), CPU_24GB)
    assert result.speed is not None and result.speed.bandwidth == measured


def test_the_chat_pickers_verdict_counts_the_documents_embedding_model(tmp_path):
    """`fit_of` (the chat's model picker, the Models pane's question before loading): a Qwen3-Embedding set
    for the Documents pane runs as a second engine beside the chat model, so it is counted; the built-in
    MiniLM (no setting) is not the engine's; a task model itself is judged as its engine runs it."""
    from pathlib import Path

    from app.studio.library import ModelLibrary
    from app.studio.model_choice import fit_of

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    settings = Settings.load(tmp_path / "settings.json")
    library = ModelLibrary(tmp_path / "models")
    chat = library.describe(fixtures / "families" / "qwen3" / "qwen3-kquants.gguf")
    embedder = library.describe(fixtures / "qwen3_tasks" / "embedding-f16.gguf")
    assert (chat.job, embedder.job) == ("chat", "embeddings")
    alone = fit_of(chat, settings)
    assert alone.beside == ()
    settings.set("documents.embedding_model", str(embedder.path))
    both = fit_of(chat, settings)
    assert [(t.name, t.job) for t in both.beside] == [("embedding-f16.gguf", "embeddings")]
    assert both.total == alone.total + both.beside[0].total and both.breakdown == alone.breakdown
    own = fit_of(embedder, settings)  # the embedder itself: one text of 8,192 tokens, nothing beside it
    assert own.beside == () and own.kv_blocks == 8192 // 16 + 1 and own.context_length == 512


def test_the_chat_pickers_verdict_counts_the_transcribe_panes_speech_llm(tmp_path):
    """The Transcribe pane's model (`transcribe.model`) is a second engine beside the chat model when it is a
    speech LLM (the tiny Qwen3-ASR folder here): counted as a transcription model at its own context, audio
    tower included; a Whisper folder (faster-whisper, outside the engine) is not."""
    from pathlib import Path

    from app.studio.library import ModelLibrary
    from app.studio.model_choice import fit_of

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    settings = Settings.load(tmp_path / "settings.json")
    chat = ModelLibrary(tmp_path / "models").describe(fixtures / "families" / "qwen3" / "qwen3-kquants.gguf")
    alone = fit_of(chat, settings)
    whisper = tmp_path / "whisper-small"  # no config.json of a speech LLM: faster-whisper's
    whisper.mkdir()
    settings.set("transcribe.model", str(whisper))
    assert fit_of(chat, settings).beside == ()
    settings.set("transcribe.model", str(fixtures / "qwen3_asr" / "hf"))
    both = fit_of(chat, settings)
    assert [(t.name, t.job) for t in both.beside] == [("hf", "transcription")]
    speech = both.beside[0]
    assert speech.breakdown.audio > 0 and speech.breakdown.overhead == 0  # the chat model's runtime, counted once
    assert speech.breakdown.kv_cache > 0
    assert both.total == alone.total + speech.total and both.breakdown == alone.breakdown
    settings.set("documents.embedding_model", str(fixtures / "qwen3_tasks" / "embedding-f16.gguf"))
    assert [t.job for t in fit_of(chat, settings).beside] == ["embeddings", "transcription"]


def test_a_speech_gguf_pair_for_the_transcribe_pane_is_counted_with_its_mmproj(tmp_path):
    """Qwen3-ASR as llama.cpp publishes it (a text GGUF with the `qwen3a` mmproj beside it) chosen for the
    Transcribe pane: the speech engine beside the chat model, the mmproj's audio tower in it."""
    from pathlib import Path

    from qwen3_asr_pair import MMPROJ_NAME, write_pair

    from app.studio.library import ModelLibrary
    from app.studio.model_choice import fit_of

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    settings = Settings.load(tmp_path / "settings.json")
    chat = ModelLibrary(tmp_path / "models").describe(fixtures / "families" / "qwen3" / "qwen3-kquants.gguf")
    (tmp_path / "asr").mkdir()
    pair = write_pair(tmp_path / "asr")
    settings.set("transcribe.model", str(pair))
    [speech] = fit_of(chat, settings).beside
    assert (speech.name, speech.job) == (pair.name, "transcription")
    assert speech.breakdown.audio > 0 and (tmp_path / "asr" / MMPROJ_NAME).exists()
    settings.set("transcribe.model", str(tmp_path / "asr"))  # the folder holding the pair: the same engine
    assert [t.breakdown for t in fit_of(chat, settings).beside] == [speech.breakdown]
