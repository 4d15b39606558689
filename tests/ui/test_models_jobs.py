"""The Models pane says what each installed model does, read from its files (plan/job.py), and judges a task
model as the engine runs one beside the chat model: tiny fixture models of each kind in the models folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtCore import Qt

from app.engine.plan.fit import check_fit, shape_from_checkpoint, task_fit_options
from app.ui.models.library import HEADERS
from app.ui.widgets.fit_view import AUDIO_ROW

from .test_models_pane import WAIT_MS, _models_window, _row_of

FIXTURES = Path(__file__).parents[1] / "fixtures"
JOB_COLUMN = HEADERS.index("Does")


def _install(models: Path) -> dict[str, str]:
    """Copies of the fixtures under the names a user might give them, and the job each must show."""
    models.mkdir(parents=True)
    shutil.copy(FIXTURES / "qwen3_tasks" / "embedding-f16.gguf", models / "qwen3-chat-model.gguf")  # name lies
    shutil.copy(FIXTURES / "qwen3_tasks" / "reranker-f16.gguf", models / "reranker.gguf")
    shutil.copy(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf", models / "embedder.gguf")  # name lies
    shutil.copytree(FIXTURES / "qwen3_tasks" / "embedding", models / "st-embedder")
    shutil.copytree(FIXTURES / "qwen3_asr" / "hf", models / "asr")
    shutil.copytree(FIXTURES / "gemma4_vision" / "hf", models / "gemma4-vision")
    gemma3 = models / "gemma3"  # a GGUF with the mmproj the loader would use beside it
    gemma3.mkdir()
    shutil.copy(FIXTURES / "families" / "gemma3" / "gemma3-f16.gguf", gemma3 / "gemma3.gguf")
    shutil.copy(FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf", gemma3 / "mmproj-gemma3.gguf")
    return {
        "qwen3-chat-model.gguf": "embeddings",  # pooling type LAST in its header
        "reranker.gguf": "reranking",  # pooling type RANK and the yes/no head
        "embedder.gguf": "chat",
        "st-embedder": "embeddings",  # modules.json's Pooling module
        "asr": "transcription",  # config.json: Qwen3-ASR
        "gemma4-vision": "chat + images",
        "gemma3/gemma3.gguf": "chat + images",
    }


def test_the_models_pane_shows_what_each_model_does(qtbot, make_window, make_context, home):
    expected = _install(home / "models")
    _window, pane = _models_window(qtbot, make_window, make_context)
    qtbot.waitUntil(lambda: pane.entries.rowCount() == len(expected) + 1, timeout=WAIT_MS)  # + the embedded one
    assert pane.entries.headerData(JOB_COLUMN, Qt.Orientation.Horizontal) == "Does"
    shown = {name: pane.entries.index(_row_of(pane, name), JOB_COLUMN).data() for name in expected}
    assert shown == expected
    row = _row_of(pane, "reranker.gguf")
    pane.table.selectRow(row)
    assert "Does: reranking" in pane.details.text()


def test_a_task_model_is_judged_as_its_engine_runs_it(qtbot, make_window, make_context, home):
    """A Qwen3-ASR folder's verdict counts its audio tower and the task engine's KV pool, not the chat's."""
    _install(home / "models")
    _window, pane = _models_window(qtbot, make_window, make_context)
    qtbot.waitUntil(lambda: pane.entries.rowCount() > 7, timeout=WAIT_MS)
    row = _row_of(pane, "asr")
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:
        pane.table.selectRow(row)
    shown = checked.args[0].value.report
    shape = shape_from_checkpoint(home / "models" / "asr")
    assert shape.audio is not None and shape.audio.weight_bytes > 0
    expected = check_fit(shape, task_fit_options(shape, "transcription"), shown.device)
    assert shown.breakdown == expected.breakdown and shown.kv_blocks == expected.kv_blocks == 8192 // 16 + 1
    assert shown.breakdown.audio_weights == shape.audio.weight_bytes


def test_a_speech_models_audio_tower_has_its_own_row(qtbot, make_window, make_context, home):
    _install(home / "models")
    _window, pane = _models_window(qtbot, make_window, make_context)
    qtbot.waitUntil(lambda: pane.entries.rowCount() > 7, timeout=WAIT_MS)
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:
        pane.table.selectRow(_row_of(pane, "asr"))
    assert pane.fit.form.isRowVisible(AUDIO_ROW) and pane.fit.parts["audio"].text() != "0 B"
    assert checked.args[0].value.speed is None  # a task model: no chat decode speed shown
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS):
        pane.table.selectRow(_row_of(pane, "embedder.gguf"))
    assert not pane.fit.form.isRowVisible(AUDIO_ROW)


def test_the_documents_embedding_model_counts_beside_the_chat_model(qtbot, make_window, make_context, home):
    """A Qwen3-Embedding set for the Documents pane is a second engine: a chat model's verdict includes it."""
    _install(home / "models")
    window, pane = _models_window(qtbot, make_window, make_context)
    qtbot.waitUntil(lambda: pane.entries.rowCount() > 7, timeout=WAIT_MS)
    chat = _row_of(pane, "embedder.gguf")  # a chat Qwen3, whatever its name
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as alone:
        pane.table.selectRow(chat)
    embedder = home / "models" / "qwen3-chat-model.gguf"  # an embedder, whatever its name
    window.context.settings.set("documents.embedding_model", str(embedder))
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS):  # another row, then the chat model again
        pane.table.selectRow(_row_of(pane, "reranker.gguf"))
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as both:
        pane.table.selectRow(chat)
    before, after = alone.args[0].value.report, both.args[0].value.report
    beside = check_fit(shape_from_checkpoint(embedder), task_fit_options(shape_from_checkpoint(embedder), "embeddings"),
                       after.device)  # fmt: skip
    assert [(t.name, t.job) for t in after.beside] == [("qwen3-chat-model.gguf", "embeddings")]
    assert after.total == before.total + after.beside[0].total
    assert after.beside[0].total == beside.breakdown.total - beside.breakdown.overhead
    assert "for the embeddings model qwen3-chat-model.gguf beside it" in pane.fit.total.text()
