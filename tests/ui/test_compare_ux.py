"""Compare as people expect it: /v1 completed, the model list from /v1/models, the local column named, live
speed, rendered answers with a raw view, and the columns and last results back after a restart."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl
from server.fakes import FakeEngine

WAIT_MS = 15_000


def _remote(pane, url: str, model: str = "fake-model"):
    column = pane.columns[1]
    column.kind.setCurrentIndex(column.kind.findData("openai"))
    column.model.setText(model)
    column.base_url.setText(url)
    return column


def test_a_url_without_v1_gets_it_and_the_model_list_comes_from_the_endpoint(qtbot, make_window, servers):
    fake = servers("ok", reply="Fine.")
    window = make_window(panes=("compare",))
    pane = window.pane("compare")
    assert pane.columns[0].model.text() == "fake-model"  # the local column names the loaded model
    column = _remote(pane, fake.base_url.removesuffix("/v1"), model="")
    column.base_url.editingFinished.emit()
    assert column.base_url.text() == fake.base_url and "/v1 added" in column.url_note.text()
    qtbot.mouseClick(column.list_models, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: column.model_choices() == ["fake-model"], timeout=WAIT_MS)
    assert column.model.text() == "fake-model"
    pane.prompt.setPlainText("Hi")
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS) as done:
        pane.run()
    assert [c.status for c in done.args[0].value.columns] == ["done", "done"]


def test_a_404_on_a_url_without_v1_says_so(qtbot, make_window, servers):
    fake = servers("ok")
    pane = make_window(panes=("compare",)).pane("compare")
    column = _remote(pane, fake.base_url.removesuffix("/v1") + "/api")  # a path: left alone, but hinted
    pane.prompt.setPlainText("Hi")
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS):
        pane.run()
    assert "HTTP 404" in column.error.text() and "usually ends in /v1" in column.error.text()


def test_live_speed_while_streaming_and_rendered_answers_with_raw_and_copy(qtbot, make_window, servers, copied):
    fake = servers("slow", reply="# Head\n\nsome words to stream\n\n```python\nx = 1\n```", delay_s=0.03)
    pane = make_window(panes=("compare",)).pane("compare")
    column = _remote(pane, fake.base_url)
    pane.prompt.setPlainText("Hi")
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS):
        pane.run()
        fake.gate.set()
        qtbot.waitUntil(lambda: column.stats.text().startswith("streaming") and "tok/s" in column.stats.text(),
                        timeout=WAIT_MS)
    assert column.stats.text().startswith("done")
    shown = column.output.toPlainText()
    assert "# Head" not in shown and "```" not in shown and "x = 1" in shown
    column.output.anchorClicked.emit(QUrl(f"{column.output._scheme}:0"))
    assert copied == ["x = 1"]
    pane.raw_view.setChecked(True)
    assert column.output.toPlainText().startswith("# Head") and "```python" in column.output.toPlainText()


def test_columns_and_the_last_results_are_back_after_a_restart(qtbot, make_window, make_context, servers):
    fake = servers("ok", reply="Kept answer.")
    first = make_window(make_context(FakeEngine()), panes=("compare",))
    pane = first.pane("compare")
    _remote(pane, fake.base_url)
    third = pane.add_column("openrouter", "meta-llama/llama-3.1-8b-instruct")
    pane.prompt.setPlainText("Remember me")
    pane.max_tokens.setValue(77)
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS):
        pane.run()
    assert third.error.isVisibleTo(third)  # no OpenRouter key: that column failed, the others answered
    first.close()  # the window closes: the pane keeps its setup

    again = make_window(make_context(FakeEngine()), panes=("compare",)).pane("compare")
    assert [c.setup() for c in again.columns] == [
        {"kind": "local", "model": "", "base_url": ""},
        {"kind": "openai", "model": "fake-model", "base_url": fake.base_url},
        {"kind": "openrouter", "model": "meta-llama/llama-3.1-8b-instruct", "base_url": ""}]
    assert again.prompt.toPlainText() == "Remember me" and again.max_tokens.value() == 77
    assert again.columns[1].output.toPlainText() == "Kept answer." and again.columns[0].output.toPlainText()
    assert again.columns[1].stats.text().startswith("done") and "No OpenRouter API key" in again.columns[2].error.text()
    assert again.save_button.isEnabled() and again.result.columns[1].text == "Kept answer."


def test_a_broken_saved_setup_opens_the_defaults(qtbot, make_window, make_context, home):
    (home / "data").mkdir(parents=True)
    (home / "data" / "compare.json").write_text("{not json")
    pane = make_window(make_context(), panes=("compare",)).pane("compare")
    assert [c.kind_key for c in pane.columns] == ["local", "openrouter"]
