"""The Compare pane against local OpenAI-compatible test servers (one slow, one failing) and the local engine."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt

WAIT_MS = 15_000


def _set(column, kind: str, model: str = "", base_url: str = "") -> None:
    column.kind.setCurrentIndex(column.kind.findData(kind))
    column.model.setText(model)
    column.base_url.setText(base_url)


def _pane(make_window):
    window = make_window(panes=("compare",))
    return window, window.pane("compare")


def test_columns_stream_side_by_side_and_a_failure_stays_in_its_column(qtbot, make_window, servers):
    slow = servers("slow", reply="Slow but sure answer.", delay_s=0.01)
    failing = servers("fail")
    _window, pane = _pane(make_window)
    local, remote_slow = pane.columns
    _set(remote_slow, "openai", "fake-model", slow.base_url)
    remote_failing = pane.add_column()
    _set(remote_failing, "openai", "fake-model", failing.base_url)
    pane.prompt.setPlainText("Say something")

    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.run_button, Qt.MouseButton.LeftButton)
        # the local and failing columns finish while the slow one still waits for its first token
        qtbot.waitUntil(lambda: remote_failing.error.isVisibleTo(remote_failing)
                        and local.stats.text().startswith("done"), timeout=WAIT_MS)
        assert remote_slow.output.toPlainText() == "" and not remote_slow.stats.text().startswith("done")
        assert pane.stop_button.isEnabled() and not pane.run_button.isEnabled()
        slow.gate.set()
    result = outcome.args[0].value
    assert [c.status for c in result.columns] == ["done", "done", "error"]

    assert local.output.toPlainText() == "Echo: Say something"
    assert remote_slow.output.toPlainText() == "Slow but sure answer."
    stats = remote_slow.stats.text()
    assert "TTFT" in stats and "tok/s" in stats and "7 prompt + 4 tokens" in stats
    assert "TTFT" in local.stats.text()
    assert "HTTP 500" in remote_failing.error.text() and "The model crashed." in remote_failing.error.text()
    assert remote_failing.output.toPlainText() == ""
    assert "1 column failed" in pane.notice.text()
    assert slow.bodies[0]["messages"] == [{"role": "user", "content": "Say something"}]


def test_results_save_as_markdown_and_json(qtbot, make_window, servers, tmp_path):
    ok = servers("ok", reply="Fine.")
    window, pane = _pane(make_window)
    _set(pane.columns[1], "openai", "fake-model", ok.base_url)
    pane.prompt.setPlainText("Hi")
    assert not pane.save_button.isEnabled()
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS):
        pane.run()
    dialogs = window.context.dialogs
    dialogs.save_to = str(tmp_path / "run.md")
    qtbot.mouseClick(pane.save_button, Qt.MouseButton.LeftButton)
    markdown = (tmp_path / "run.md").read_text()
    assert "**Prompt:** Hi" in markdown and "Fine." in markdown and "Echo: Hi" in markdown
    dialogs.save_to = str(tmp_path / "run.json")
    pane.save()
    saved = json.loads((tmp_path / "run.json").read_text())
    assert [c["text"] for c in saved["columns"]] == ["Echo: Hi", "Fine."]
    assert saved["columns"][1]["ttft_s"] is not None and saved["columns"][1]["completion_tokens"] == 1
    assert "Saved to" in pane.notice.text()


def test_incomplete_columns_and_a_missing_openrouter_key_are_explained(qtbot, make_window):
    _window, pane = _pane(make_window)
    pane.prompt.setPlainText("Hi")
    _set(pane.columns[1], "openai", "some-model", "")
    pane.run()
    assert "base URL" in pane.columns[1].error.text() and not pane.running
    _set(pane.columns[1], "openrouter", "meta-llama/llama-3.1-8b-instruct")
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS):
        pane.run()
    assert "No OpenRouter API key set" in pane.columns[1].error.text()
    assert "openrouter.ai/keys" in pane.key_note.text()


def test_the_openrouter_key_is_stored_in_secrets(qtbot, make_window):
    window, pane = _pane(make_window)
    pane.openrouter_key.setText("sk-or-test")
    qtbot.mouseClick(pane.save_key_button, Qt.MouseButton.LeftButton)
    assert window.context.secrets.get("openrouter_api_key") == "sk-or-test"
    assert pane.openrouter_key.text() == "" and "stored" in pane.openrouter_key.placeholderText()
    assert "plain text" in pane.key_note.text()  # no keyring in tests: the user is told where it went


def test_two_to_four_columns(qtbot, make_window):
    _window, pane = _pane(make_window)
    assert len(pane.columns) == 2 and not pane.columns[0].remove.isEnabled()
    pane.add_column()
    pane.add_column()
    assert len(pane.columns) == 4 and not pane.add_button.isEnabled() and pane.add_column() is None
    pane.remove_column(pane.columns[3])
    assert len(pane.columns) == 3 and pane.add_button.isEnabled()


def test_stop_cancels_the_waiting_columns(qtbot, make_window, servers):
    slow = servers("slow")
    _window, pane = _pane(make_window)
    _set(pane.columns[1], "openai", "fake-model", slow.base_url)
    pane.prompt.setPlainText("Hi")
    with qtbot.waitSignal(pane.compare_finished, timeout=WAIT_MS) as outcome:
        pane.run()
        qtbot.waitUntil(lambda: len(slow.bodies) == 1, timeout=WAIT_MS)
        qtbot.mouseClick(pane.stop_button, Qt.MouseButton.LeftButton)
    assert outcome.args[0].value.columns[1].status == "cancelled"
    assert pane.columns[1].stats.text().startswith("stopped") and pane.run_button.isEnabled()
