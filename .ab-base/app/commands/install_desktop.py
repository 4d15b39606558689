"""`paddock install-desktop`: put Paddock Studio in the Linux application menu.

Writes `paddock-studio.desktop` to $XDG_DATA_HOME/applications and the icon to
$XDG_DATA_HOME/icons/hicolor/{scalable,256x256}/apps (XDG_DATA_HOME defaults to
~/.local/share), with Exec pointing at this installation's own `paddock`, so the menu
entry works whichever virtual environment the Studio lives in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HELP = "add Paddock Studio to the Linux application menu (a .desktop entry and its icon)"

DESKTOP_FILE = "paddock-studio.desktop"
ICON_NAME = "paddock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uninstall", action="store_true", help="remove the entry and the icons")
    parser.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")


def run(args: argparse.Namespace) -> int:
    targets = install_paths()
    if args.uninstall:
        for path in targets.values():
            if path.exists():
                path.unlink()
                print(f"removed {path}")
        _refresh_caches(targets)
        return 0
    try:
        entry = desktop_entry(launcher_command())
        sources = {"svg": resources_dir() / "icons" / f"{ICON_NAME}.svg",
                   "png": resources_dir() / "icons" / f"{ICON_NAME}.png"}
        missing = [str(p) for p in sources.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"icon files missing from this installation: {', '.join(missing)}")
    except (FileNotFoundError, OSError) as exc:
        print(f"paddock install-desktop: {exc}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"would write {targets['desktop']}:\n{entry}")
        for kind in ("svg", "png"):
            print(f"would copy {sources[kind]} -> {targets[kind]}")
        return 0
    targets["desktop"].parent.mkdir(parents=True, exist_ok=True)
    targets["desktop"].write_text(entry, encoding="utf-8")
    targets["desktop"].chmod(0o755)  # some desktops only launch entries marked executable
    for kind in ("svg", "png"):
        targets[kind].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources[kind], targets[kind])
    _refresh_caches(targets)
    for path in targets.values():
        print(f"installed {path}")
    return 0


def install_paths() -> dict[str, Path]:
    data_home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    icons = data_home / "icons" / "hicolor"
    return {
        "desktop": data_home / "applications" / DESKTOP_FILE,
        "svg": icons / "scalable" / "apps" / f"{ICON_NAME}.svg",
        "png": icons / "256x256" / "apps" / f"{ICON_NAME}.png",
    }


def resources_dir() -> Path:
    """`resources/` of this installation: beside the source tree, or inside a PyInstaller bundle."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle is not None:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


def launcher_command() -> str:
    """How to start the Studio from a menu: this environment's `paddock`, else its Python."""
    if getattr(sys, "frozen", False):
        return _quote(sys.executable)
    script = Path(sys.executable).with_name("paddock")
    if script.is_file():
        return f"{_quote(str(script))} studio"
    found = shutil.which("paddock")
    if found:
        return f"{_quote(found)} studio"
    return f"{_quote(sys.executable)} -m app studio"


def desktop_entry(exec_command: str) -> str:
    """The shipped template with Exec pointing at `exec_command`."""
    template = (resources_dir() / DESKTOP_FILE).read_text(encoding="utf-8")
    lines = [f"Exec={exec_command}" if line.startswith("Exec=") else line for line in template.splitlines()]
    return "\n".join(lines) + "\n"


def _quote(path: str) -> str:
    """Quote an Exec argument as the Desktop Entry spec asks (double quotes, escaped specials)."""
    if not any(c in path for c in ' \t"\'\\><~|&;$*?#()`'):
        return path
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    return f'"{escaped}"'


def _refresh_caches(targets: dict[str, Path]) -> None:
    """Tell the desktop about the change where the tools exist; harmless to skip otherwise."""
    commands = [
        ["update-desktop-database", str(targets["desktop"].parent)],
        ["gtk-update-icon-cache", "-f", "-t", str(targets["svg"].parents[2])],
    ]
    for command in commands:
        if shutil.which(command[0]):
            subprocess.run(command, check=False, capture_output=True)
