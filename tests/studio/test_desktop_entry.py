"""The menu entry passes `desktop-file-validate` (run when installed; else the rules it broke are checked here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.commands.install_desktop import DESKTOP_FILE, desktop_entry, resources_dir

# desktop-file-utils 0.26 (Debian 12) knows these versions of the Desktop Entry spec; 1.5 is refused
KNOWN_VERSIONS = {"1.0", "1.1", "1.2", "1.3", "1.4"}
# the spec's main categories: an entry with two shows in the menu twice
MAIN_CATEGORIES = {"AudioVideo", "Audio", "Video", "Development", "Education", "Game", "Graphics", "Network",
                   "Office", "Science", "Settings", "System", "Utility"}


def _entries(tmp_path: Path) -> list[Path]:
    """The shipped template and what `paddock install-desktop` writes from it (Exec quoted for a spaced path)."""
    written = tmp_path / DESKTOP_FILE
    written.write_text(desktop_entry('"/opt/my tools/venv/bin/paddock" studio'), encoding="utf-8")
    return [resources_dir() / DESKTOP_FILE, written]


def _keys(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if line and not line.startswith("#"))


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils is not installed")
def test_desktop_file_validate_finds_nothing(tmp_path):
    for path in _entries(tmp_path):
        run = subprocess.run(["desktop-file-validate", str(path)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout + run.stderr == "", f"{path}: {run.stdout}{run.stderr}"


def test_the_entry_keeps_the_rules_desktop_file_validate_checked(tmp_path):
    for path in _entries(tmp_path):
        keys = _keys(path)
        assert keys["Type"] == "Application" and keys["Version"] in KNOWN_VERSIONS
        categories = [c for c in keys["Categories"].split(";") if c]
        assert keys["Categories"].endswith(";") and len(set(categories) & MAIN_CATEGORIES) == 1, categories
        if "ArtificialIntelligence" in categories:  # an additional category that needs Science or Education
            assert {"Science", "Education"} & set(categories)
        assert keys["Keywords"].endswith(";") and keys["Exec"] and keys["Icon"] == "paddock"
