"""Qt's missing system libraries: found from `ldd` (or Qt's debug output), named as packages per distribution."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from app.commands import check_display, studio
from app.studio import qt_libraries
from app.studio.qt_libraries import (
    family_from_os_release,
    install_advice,
    missing_from_ldd,
    missing_from_qt_debug,
    missing_xcb_libraries,
)

# what `ldd libqxcb.so` printed on a fresh Debian 12 with libxcb-cursor0 installed (trimmed)
LDD_OUTPUT = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x00007f1)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f2)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
"""
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nID=debian\n'
QT_DEBUG = """\
qt.core.library: "/venv/PySide6/Qt/plugins/platforms/libqxcb.so" cannot load: Cannot load library \
/venv/PySide6/Qt/plugins/platforms/libqxcb.so: (libxcb-icccm.so.4: cannot open shared object file: \
No such file or directory)
qt.qpa.plugin: From 6.5.0, xcb-cursor0 or libxcb-cursor0 is needed to load the Qt xcb platform plugin.
"""


def test_the_missing_libraries_are_read_from_ldd_and_from_qt_debug_output():
    assert missing_from_ldd(LDD_OUTPUT) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert missing_from_ldd("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") == []
    assert missing_from_qt_debug(QT_DEBUG) == ["libxcb-icccm.so.4"]  # not Qt's misleading xcb-cursor0 line


def test_debian_gets_the_two_packages_and_the_apt_command():
    advice = install_advice(missing_from_ldd(LDD_OUTPUT), DEBIAN)
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1 are missing" in advice
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in advice
    assert "dnf" not in advice and "pacman" not in advice


@pytest.mark.parametrize(("os_release", "command"), [
    ("ID=ubuntu\nID_LIKE=debian\n", "sudo apt-get install libxcb-icccm4 libxcb-keysyms1"),
    ('ID="fedora"\n', "sudo dnf install xcb-util-wm xcb-util-keysyms"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', "sudo dnf install xcb-util-wm xcb-util-keysyms"),
    ("ID=arch\n", "sudo pacman -S --needed xcb-util-wm xcb-util-keysyms"),
    ("ID=endeavouros\nID_LIKE=arch\n", "sudo pacman -S --needed xcb-util-wm xcb-util-keysyms"),
])
def test_each_distribution_gets_its_own_packages(os_release, command):
    assert command in install_advice(["libxcb-icccm.so.4", "libxcb-keysyms.so.1"], os_release)


def test_an_unknown_distribution_gets_every_family_and_an_unknown_library_is_said():
    assert family_from_os_release("ID=gentoo\n") is None
    advice = install_advice(["libxcb-keysyms.so.1", "libfoo.so.3"], "ID=gentoo\n")
    assert "sudo apt-get install libxcb-keysyms1" in advice and "sudo dnf install xcb-util-keysyms" in advice
    assert "sudo pacman -S --needed xcb-util-keysyms" in advice
    assert "No package is known here for libfoo.so.3" in advice


@pytest.fixture
def fake_ldd(tmp_path, monkeypatch) -> Path:
    """An `ldd` first on PATH that prints the Debian 12 output for any file, and a plugin file to ask about."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ldd = bin_dir / "ldd"
    (tmp_path / "ldd.txt").write_text(LDD_OUTPUT)
    ldd.write_text(f"#!/bin/sh\ncat {tmp_path / 'ldd.txt'}\n")
    ldd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    monkeypatch.setattr(qt_libraries, "xcb_plugin", lambda: plugin)
    monkeypatch.setattr(qt_libraries, "read_os_release", lambda path=None: DEBIAN)
    return plugin


def test_check_display_names_the_packages_and_fails_where_there_is_a_display(fake_ldd, monkeypatch, capsys):
    assert missing_xcb_libraries() == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    assert check_display.run(argparse.Namespace(quiet=True)) == 1
    err = capsys.readouterr().err
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1 are missing" in err
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in err
    # `paddock` itself, where the window cannot open, says the same before serving headless
    reason = studio.no_display_reason({"DISPLAY": ":0", "PATH": os.environ["PATH"]})
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in reason


def test_without_a_display_there_is_nothing_to_check(fake_ldd, monkeypatch, capsys):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    assert check_display.run(argparse.Namespace(quiet=True)) == 0  # `make run` goes on to serve headless
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    monkeypatch.setenv("DISPLAY", ":0")
    assert check_display.run(argparse.Namespace(quiet=True)) == 0
    assert capsys.readouterr().err == ""


def test_the_real_plugin_is_found_and_checked():
    plugin = qt_libraries.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    missing = missing_xcb_libraries(plugin)
    assert missing is None or all(name.startswith("lib") and ".so" in name for name in missing)
