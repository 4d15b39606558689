"""The Models pane: the local folder with metadata and fit verdicts, load/unload/delete, hub search and download
(size and fit before the start, progress, an interrupted and a cancelled download both resumed) on a fake hub."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from PySide6.QtCore import Qt
from server.fakes import FakeEngine
from studio import fake_hub
from studio.fake_hub import FakeHub, make_tiny_gguf

from app.engine.plan.fit import TIGHT, DeviceMemory, FitOptions, check_fit, shape_from_checkpoint
from app.studio.downloads import model_folder
from app.ui.panes.models import EMBEDDED_NAME
from app.ui.widgets.fit_view import FitView

REPO, FILE = "acme/tiny-GGUF", "tiny-Q8_0.gguf"
WAIT_MS = 15_000


@pytest.fixture
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / FILE
    return path, make_tiny_gguf(path)


@pytest.fixture
def hub(tiny_gguf, monkeypatch):
    fake = FakeHub()
    fake.add_repo(REPO, {FILE: tiny_gguf[1], "README.md": b"# tiny\n"}, tags=("gguf",), downloads=100)
    fake.add_repo("acme/other-GGUF", {"a.gguf": tiny_gguf[1]}, tags=("gguf",), downloads=5)
    fake.serve(monkeypatch)
    yield fake
    fake.stop()


def _models_window(qtbot, make_window, make_context, **kwargs):
    context = make_context(FakeEngine(), **kwargs)
    window = make_window(context, panes=("models",))
    pane = window.pane("models")
    qtbot.waitUntil(lambda: pane.entries.rowCount() > 0, timeout=WAIT_MS)
    return window, pane


def _row_of(pane, name: str) -> int:
    return next(r for r in range(pane.entries.rowCount()) if pane.entries.entry(r).name == name)


def test_the_folder_lists_models_with_metadata_and_fit_verdicts(qtbot, make_window, make_context, home, tiny_gguf):
    folder = home / "models" / "acme"
    folder.mkdir(parents=True)
    (folder / FILE).write_bytes(tiny_gguf[1])
    _window, pane = _models_window(qtbot, make_window, make_context)
    assert pane.folder.text() == str(home / "models")  # the folder is visible
    assert pane.entries.rowCount() == 2
    assert pane.entries.entry(0).name == EMBEDDED_NAME
    row = _row_of(pane, f"acme/{FILE}")
    cells = [pane.entries.index(row, c).data() for c in range(pane.entries.columnCount())]
    assert cells[:7] == [f"acme/{FILE}", "GGUF", "llama", "chat", "27.5K", "Q8_0", "2,048"]

    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:
        pane.table.selectRow(row)
    report = checked.args[0].value.report
    assert report.verdict == "fits" and pane.fit.verdict.text() == "FITS"
    assert pane.fit.parts["weights"].text() and "Largest context that fits: 2,048" in pane.fit.max_context.text()
    assert "Q8_0" in pane.details.text() and "llama" in pane.details.text()

    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:  # the embedded model, real numbers
        pane.table.selectRow(0)
    embedded = checked.args[0].value.report
    assert 200 * 2**20 < embedded.breakdown.weights < 300 * 2**20
    assert embedded.model_context_length == 32768 and "gemma3" in pane.details.text()


def test_a_model_that_wont_fit_is_flagged_and_loading_it_asks_first(qtbot, make_window, make_context, home):
    (home / "models").mkdir(parents=True)
    # 8 KiB of KV per token: 10M tokens is 80 GB (the verdict is taken at the setting, up to the model's maximum)
    make_tiny_gguf(home / "models" / FILE, hidden=256, layers=8, context=10_000_000)
    built = []
    context = make_context(FakeEngine(), engine_factory=lambda config: built.append(config) or FakeEngine())
    context.settings.update({"engine.context_length": 10_000_000, "engine.gpu_memory_utilization": 0.05})
    window = make_window(context, panes=("models",))
    pane = window.pane("models")
    qtbot.waitUntil(lambda: pane.entries.rowCount() == 2, timeout=WAIT_MS)
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS):
        pane.table.selectRow(_row_of(pane, FILE))
    assert pane.fit.verdict.text() == "WON'T FIT" and pane.fit.verdict.property("verdict") == "won't fit"
    context.dialogs.confirm_answer = False
    qtbot.mouseClick(pane.load_button, Qt.MouseButton.LeftButton)
    assert "predicted not to fit" in context.dialogs.asked[-1] and built == []


def test_load_unload_and_delete(qtbot, make_window, make_context, home, tiny_gguf):
    (home / "models").mkdir(parents=True)
    path = home / "models" / FILE
    path.write_bytes(tiny_gguf[1])
    configs = []

    class EngineAtPath(FakeEngine):  # reports the file it was loaded from, as the real engine does
        @property
        def model(self):
            return dataclasses.replace(super().model, path=configs[-1].model)

    def factory(config):
        configs.append(config)
        return EngineAtPath(name=FILE)

    context = make_context(engine_factory=factory)
    window = make_window(context, panes=("models",))
    pane = window.pane("models")
    qtbot.waitUntil(lambda: pane.entries.rowCount() == 2, timeout=WAIT_MS)
    pane.table.selectRow(_row_of(pane, FILE))
    qtbot.mouseClick(pane.load_button, Qt.MouseButton.LeftButton)
    assert configs[-1].model == str(path.resolve()) and context.host.status.ready
    qtbot.waitUntil(lambda: "Loaded" in pane.notice.text(), timeout=WAIT_MS)
    assert not pane.delete_button.isEnabled()  # not while it is loaded
    qtbot.mouseClick(pane.unload_button, Qt.MouseButton.LeftButton)
    assert context.host.client is None
    qtbot.waitUntil(pane.delete_button.isEnabled, timeout=WAIT_MS)
    with qtbot.waitSignal(pane.listed, timeout=WAIT_MS):
        qtbot.mouseClick(pane.delete_button, Qt.MouseButton.LeftButton)
    assert not path.exists() and pane.entries.rowCount() == 1
    pane.table.selectRow(0)
    assert not pane.delete_button.isEnabled()  # the embedded model cannot be deleted


def _open_hub(qtbot, pane, hub_browser_query="acme"):
    browser = pane.hub
    browser.query.setText(hub_browser_query)
    with qtbot.waitSignal(browser.searched, timeout=WAIT_MS):
        qtbot.mouseClick(browser.search_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignals([browser.listed, browser.fit_checked], timeout=WAIT_MS):
        browser.results.selectRow(0)
    return browser


def test_hub_search_shows_size_and_fit_before_download_then_downloads(qtbot, make_window, make_context, hub,
                                                                      home, tiny_gguf):
    _window, pane = _models_window(qtbot, make_window, make_context)
    browser = _open_hub(qtbot, pane)
    assert [browser.results_model.row(r).repo_id for r in range(2)] == [REPO, "acme/other-GGUF"]
    size = len(tiny_gguf[1])
    assert browser.chosen[0].path == FILE and f"{size / 1024:.2f} KiB" in browser.download_button.text()
    assert browser.fit.verdict.text() == "FITS"  # before anything was downloaded
    expected = check_fit(shape_from_checkpoint(tiny_gguf[0]), FitOptions())
    assert browser.fit.report.breakdown.weights == expected.breakdown.weights
    assert not (home / "models" / "acme").exists()

    with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as finished, \
            qtbot.waitSignal(pane.listed, timeout=WAIT_MS):
        qtbot.mouseClick(browser.download_button, Qt.MouseButton.LeftButton)
    assert finished.args[0].ok and "verified" in browser.status.text()
    target = model_folder(home / "models", REPO) / FILE
    assert target.read_bytes() == tiny_gguf[1]
    assert f"{REPO}/{FILE}" in [pane.entries.entry(r).name for r in range(pane.entries.rowCount())]
    assert browser.download_button.text() == "Downloaded" and not browser.download_button.isEnabled()
    assert browser.files_model.index(0, 2).data() == "downloaded"


def test_an_interrupted_download_resumes_where_it_stopped(qtbot, make_window, make_context, hub, home, tiny_gguf):
    _window, pane = _models_window(qtbot, make_window, make_context)
    browser = _open_hub(qtbot, pane)
    hub.drop_after[FILE] = 5000
    with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as first:
        qtbot.mouseClick(browser.download_button, Qt.MouseButton.LeftButton)
    assert not first.args[0].ok and "interrupted" in browser.status.text()
    assert "Traceback" not in browser.status.text()
    assert browser.download_button.text().startswith("Resume (4.88 KiB of")
    with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as second:
        qtbot.mouseClick(browser.download_button, Qt.MouseButton.LeftButton)
    assert second.args[0].ok
    assert hub.ranges_for(FILE)[-2:] == [None, "bytes=5000-"]  # (before them: the fit probe's header read)
    assert (model_folder(home / "models", REPO) / FILE).read_bytes() == tiny_gguf[1]


def test_cancel_pauses_and_download_resumes(qtbot, make_window, make_context, hub, home, tiny_gguf, monkeypatch):
    release, held = threading.Event(), threading.Event()
    original = fake_hub._HubHandler._send_bytes

    def send_then_hold(handler, file_path, data, head, headers):
        if file_path != FILE or head or handler.headers.get("Range"):
            return original(handler, file_path, data, head, headers)
        handler.send_response(200)  # first attempt: 20 KB, then nothing until the test lets go
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data[:20_000])
        handler.wfile.flush()
        held.set()
        release.wait(10)
        handler.close_connection = True

    monkeypatch.setattr(fake_hub._HubHandler, "_send_bytes", send_then_hold)
    _window, pane = _models_window(qtbot, make_window, make_context, threaded=True)
    browser = _open_hub(qtbot, pane)
    try:
        with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as cancelled:
            qtbot.mouseClick(browser.download_button, Qt.MouseButton.LeftButton)
            qtbot.waitUntil(lambda: held.is_set() and browser.progress.value() > 0, timeout=WAIT_MS)
            assert browser.cancel_button.isEnabled() and "of" in browser.status.text()
            qtbot.mouseClick(browser.cancel_button, Qt.MouseButton.LeftButton)
            # Let the server end the stalled body: a read blocked on a silent socket only returns then
            # (without the cancel, the short body would be reported as an interrupted download instead).
            release.set()
    finally:
        release.set()
    assert cancelled.args[0].cancelled and "Paused with 19.53 KiB kept" in browser.status.text()
    part = model_folder(home / "models", REPO) / (FILE + ".part")
    assert part.stat().st_size == 20_000
    with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as resumed:
        qtbot.mouseClick(browser.download_button, Qt.MouseButton.LeftButton)
    assert resumed.args[0].ok and not part.exists()
    assert (model_folder(home / "models", REPO) / FILE).read_bytes() == tiny_gguf[1]


def test_hub_errors_are_sentences(qtbot, make_window, make_context, hub):
    _window, pane = _models_window(qtbot, make_window, make_context)
    hub.gated.add(REPO)
    browser = pane.hub
    with qtbot.waitSignal(browser.listed, timeout=WAIT_MS) as listed:
        browser.open_repo(REPO)
    assert not listed.args[0].ok and "gated" in browser.repo.text()
    browser.open_repo("acme/missing")
    qtbot.waitUntil(lambda: "not found" in browser.repo.text(), timeout=WAIT_MS)


def test_fit_view_shows_a_tight_verdict(qtbot, tiny_gguf):
    view = FitView()
    qtbot.addWidget(view)
    shape = shape_from_checkpoint(tiny_gguf[0])
    free = int(check_fit(shape, FitOptions(), DeviceMemory("cuda", "GPU", 10**12, 10**12)).breakdown.total * 1.02)
    report = check_fit(shape, FitOptions(), DeviceMemory("cuda", "Test GPU", free, 2 * free))
    assert report.verdict == TIGHT
    view.show_report(report)
    assert view.verdict.text() == "TIGHT" and "Test GPU" in view.headline.text()
