"""Settings declared as data, stored safely; secrets in the keyring or the file; paths; task plumbing."""

from __future__ import annotations

import json
import threading

import keyring
import keyring.backend
import keyring.errors
import pytest

from app.studio.paths import studio_paths
from app.studio.secrets import OPENROUTER_API_KEY, SecretStore
from app.studio.settings import SETTINGS, Settings, SettingsError
from app.studio.tasks import CancelToken, SyncExecutor, TaskCancelled, ThreadExecutor


def test_every_declared_setting_is_complete_and_its_default_valid():
    assert len({s.key for s in SETTINGS}) == len(SETTINGS)
    for setting in SETTINGS:
        assert setting.label and setting.help and setting.section
        assert setting.coerce(setting.default) == setting.default


def test_round_trip_through_a_flat_json_file(tmp_path):
    path = tmp_path / "settings.json"
    settings = Settings.load(path)
    assert settings.problems == [] and settings.get("server.port") == 11660
    settings.update({"server.port": "8080", "engine.device": "cuda", "server.require_api_key": "yes"})
    settings.save()
    assert json.loads(path.read_text()) == {"engine.device": "cuda", "server.port": 8080,
                                            "server.require_api_key": True}
    again = Settings.load(path)
    assert again["server.port"] == 8080 and again["engine.device"] == "cuda" and again["server.require_api_key"]


def test_bad_values_are_refused_with_the_key_named_and_nothing_changes(tmp_path):
    settings = Settings.load(tmp_path / "settings.json")
    with pytest.raises(SettingsError, match=r"server\.port: 70000 is above the maximum 65535"):
        settings.set("server.port", 70000)
    with pytest.raises(SettingsError, match="not one of auto, cpu, cuda"):
        settings.update({"chat.temperature": 0.1, "engine.device": "tpu"})
    assert settings.get("chat.temperature") == 0.7  # the valid half of a bad update was not applied
    with pytest.raises(SettingsError, match="unknown setting 'nope'"):
        settings.set("nope", 1)
    with pytest.raises(SettingsError, match="not a valid int"):
        settings.set("engine.max_num_seqs", "many")


def test_a_bad_value_in_the_file_is_reported_and_kept(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"server.port": "eighty", "chat.temperature": 0.3, "from.a.newer.version": 1}))
    settings = Settings.load(path)
    assert settings["server.port"] == 11660 and settings["chat.temperature"] == 0.3
    [problem] = settings.problems
    assert "server.port" in problem and "'eighty'" in problem
    with pytest.raises(SettingsError, match=r"server\.port"):
        Settings.load(path, strict=True)
    settings.set("chat.top_p", 0.5)
    settings.save()
    saved = json.loads(path.read_text())
    assert saved["server.port"] == "eighty" and saved["from.a.newer.version"] == 1 and saved["chat.top_p"] == 0.5
    settings.set("server.port", 9000)
    assert settings.problems == []


def test_a_file_that_is_not_json_is_kept_aside_not_wiped(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"server.port": 8080,,}')
    settings = Settings.load(path)
    assert "not valid JSON (line 1" in settings.problems[0]
    assert path.read_text() == '{"server.port": 8080,,}'  # loading never writes
    settings.set("server.port", 8081)
    settings.save()
    assert (tmp_path / "settings.json.broken").read_text() == '{"server.port": 8080,,}'
    assert json.loads(path.read_text()) == {"server.port": 8081}


def test_listeners_hear_about_changes(tmp_path):
    settings = Settings.load(tmp_path / "s.json")
    heard = []
    unsubscribe = settings.subscribe(lambda key, value: heard.append((key, value)))
    settings.set("appearance.theme", "dark")
    unsubscribe()
    settings.set("appearance.theme", "light")
    assert heard == [("appearance.theme", "dark")]


class MemoryKeyring(keyring.backend.KeyringBackend):
    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.store.get((service, username))

    def set_password(self, service, username, password):
        self.store[(service, username)] = password

    def delete_password(self, service, username):
        if self.store.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError("none")


def test_secrets_fall_back_to_the_settings_file_with_a_warning(tmp_path, monkeypatch):
    from keyring.backends import fail

    monkeypatch.setattr(keyring, "get_keyring", lambda: fail.Keyring())
    settings = Settings.load(tmp_path / "settings.json")
    store = SecretStore(settings)
    assert not store.in_keyring and "plain text" in store.warning
    store.set(OPENROUTER_API_KEY, "  sk-or-123 ")
    assert json.loads(settings.path.read_text())["secrets"] == {OPENROUTER_API_KEY: "sk-or-123"}
    assert SecretStore(Settings.load(settings.path)).get(OPENROUTER_API_KEY) == "sk-or-123"
    store.delete(OPENROUTER_API_KEY)
    assert "secrets" not in json.loads(settings.path.read_text())


def test_secrets_go_to_the_keyring_when_one_works(tmp_path, monkeypatch):
    backend = MemoryKeyring()
    monkeypatch.setattr(keyring, "get_keyring", lambda: backend)
    settings = Settings.load(tmp_path / "settings.json")
    settings.set_plaintext_secret(OPENROUTER_API_KEY, "old-plain")  # saved before a keyring existed
    settings.save()
    store = SecretStore(settings)
    assert store.in_keyring and store.warning is None
    assert store.get(OPENROUTER_API_KEY) == "old-plain"
    store.set(OPENROUTER_API_KEY, "sk-new")
    assert backend.store[("paddock-studio", OPENROUTER_API_KEY)] == "sk-new"
    assert "secrets" not in json.loads(settings.path.read_text())  # the plaintext copy is gone
    store.set(OPENROUTER_API_KEY, "")
    assert store.get(OPENROUTER_API_KEY) is None


def test_paddock_home_holds_every_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDOCK_HOME", str(tmp_path))
    paths = studio_paths().ensure()
    for folder in (paths.config_dir, paths.data_dir, paths.cache_dir, paths.models_dir):
        assert folder.is_dir() and folder.is_relative_to(tmp_path)
    assert paths.settings_file.parent == paths.config_dir and paths.history_db.parent == paths.data_dir


def test_sync_executor_delivers_values_errors_and_cancellation():
    executor = SyncExecutor()
    progress, done = [], []

    def work(ctx):
        for step in range(3):
            ctx.report(step + 1, 3, f"step {step + 1}")
        return "finished"

    handle = executor.submit(work, on_progress=progress.append, on_done=done.append)
    assert handle.result().value == "finished" and done[0].ok
    assert [p.fraction for p in progress] == [1 / 3, 2 / 3, 1.0]

    failed = executor.submit(lambda ctx: 1 / 0).result()
    assert not failed.ok and failed.error_message == "division by zero"

    token = CancelToken()
    token.cancel()
    cancelled = executor.submit(lambda ctx: ctx.report(1, 2), token=token).result()
    assert cancelled.cancelled and cancelled.error_message == "Cancelled."
    with pytest.raises(TaskCancelled):
        cancelled.unwrap()


def test_thread_executor_runs_off_the_calling_thread_and_cancels():
    executor = ThreadExecutor(max_workers=1)
    started = threading.Event()

    def wait_for_cancel(ctx):
        started.set()
        ctx.token.wait(30)
        ctx.token.raise_if_cancelled()
        return "not cancelled"

    handle = executor.submit(wait_for_cancel)
    started.wait(30)
    closed = []
    handle.token.on_cancel(lambda: closed.append(True))
    handle.cancel()
    assert handle.result(30).cancelled and closed == [True]
    assert executor.submit(lambda ctx: threading.current_thread().name).result(30).value.startswith("studio-task")
    executor.shutdown()


def test_work_asked_of_a_shut_down_executor_never_runs_and_calls_nothing_back():
    """A view's late event while the window closes (a table's selection cleared) must not raise."""
    executor = ThreadExecutor(max_workers=1)
    executor.shutdown()
    ran, called = [], []
    handle = executor.submit(lambda ctx: ran.append(True), on_done=called.append)
    assert handle.done() and handle.result(0).cancelled and handle.token.cancelled
    assert ran == [] and called == []


def test_install_desktop_writes_the_entry_and_icons_under_xdg_data_home(tmp_path, monkeypatch, capsys):
    from app.cli import main as paddock

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert paddock(["install-desktop"]) == 0
    entry = (tmp_path / "applications" / "paddock-studio.desktop").read_text()
    assert "Name=Paddock Studio" in entry and "Icon=paddock" in entry
    exec_line = next(line for line in entry.splitlines() if line.startswith("Exec="))
    assert exec_line.endswith("studio") and "/" in exec_line  # an absolute launcher of this installation
    svg = tmp_path / "icons/hicolor/scalable/apps/paddock.svg"
    png = tmp_path / "icons/hicolor/256x256/apps/paddock.png"
    assert svg.read_text().lstrip().startswith("<?xml") and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paddock(["install-desktop", "--uninstall"]) == 0
    assert not svg.exists() and not png.exists() and not (tmp_path / "applications/paddock-studio.desktop").exists()
