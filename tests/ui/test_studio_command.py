"""`paddock studio`: a window where there is a display, the headless API where there is none."""

from __future__ import annotations

import argparse
import sys

import pytest

from app.commands import serve, studio


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    studio.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="DISPLAY and WAYLAND_DISPLAY are Linux's")
def test_no_display_variables_means_no_display():
    assert studio.no_display_reason({}) == "neither DISPLAY nor WAYLAND_DISPLAY is set"
    assert studio.no_display_reason({"DISPLAY": ":0"}, probe=False) is None
    assert studio.no_display_reason({"WAYLAND_DISPLAY": "wayland-0"}, probe=False) is None


def test_qt_failing_to_start_is_caught_in_a_child_process():
    problem = studio.qt_start_problem({"QT_QPA_PLATFORM": "no-such-platform", "PATH": "/usr/bin:/bin"})
    assert problem is not None and problem.startswith("Qt could not start")
    assert studio.qt_start_problem({"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"}) is None


def test_without_a_display_the_api_is_served_headless_like_paddock_serve(monkeypatch, capsys):
    served = []
    monkeypatch.setattr(serve, "run", lambda args: served.append(args) or 0)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert studio.run(_args()) == 0
    [args] = served
    assert (args.host, args.port, args.model) == ("127.0.0.1", 11660, "default")
    message = capsys.readouterr().err
    assert "no display" in message and "http://127.0.0.1:11660" in message


def test_headless_flag_and_model_arguments_pass_through(monkeypatch, capsys):
    served = []
    monkeypatch.setattr(serve, "run", lambda args: served.append(args) or 0)
    studio.run(_args("--headless", "--model", "my.gguf", "--device", "cpu", "--max-ctx", "2048", "--port", "9000"))
    [args] = served
    assert (args.model, args.device, args.max_ctx, args.port) == ("my.gguf", "cpu", 2048, 9000)
    assert "--headless was given" in capsys.readouterr().err


def test_with_a_display_the_window_opens(monkeypatch):
    opened = []
    monkeypatch.setattr(studio, "no_display_reason", lambda: None)
    monkeypatch.setattr("app.ui.main.run_studio", lambda model, **kwargs: opened.append((model, kwargs)) or 0)
    assert studio.run(_args("--device", "cpu")) == 0
    assert opened == [(None, {"home": None, "engine_url": None, "device": "cpu", "max_model_len": None})]
    assert studio.run(_args("--engine", "http://gpu-box:8000/v1")) == 0  # a remote engine instead of the local one
    assert opened[-1][1]["engine_url"] == "http://gpu-box:8000/v1"
