"""`paddock check-display`: can the Studio open its window here? If not, which system packages it needs.

`make run` calls it before it starts the Studio. Where there is no display at all (CI, ssh) there
is nothing to check: `paddock` serves the API headless, and this exits 0. Where there is one but
Qt's X11 plugin lacks shared libraries, it names them, the packages that provide them on this
distribution and the install command, and exits 1, before `paddock` would fall back to headless.
"""

from __future__ import annotations

import argparse
import os
import sys

HELP = "check that the Studio's window can open here; name the system packages Qt lacks, with the install command"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="print nothing when all is well")


def run(args: argparse.Namespace) -> int:
    from app.studio.qt_libraries import install_advice, read_os_release

    missing = missing_for_window(os.environ)
    if missing is None:
        return 0  # no display, or not the X11 plugin: nothing to check here
    if missing:
        print(f"paddock: the Studio's window cannot open.\n{install_advice(missing, read_os_release())}",
              file=sys.stderr)
        return 1
    if not args.quiet:
        print("Qt's X11 plugin has every library it needs.")
    return 0


def uses_xcb(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether Qt would open the window through its X11 (xcb) plugin here."""
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return sys.platform.startswith("linux") and bool(environ.get("DISPLAY")) and not environ.get("WAYLAND_DISPLAY")


def missing_for_window(environ: dict[str, str] | os._Environ[str]) -> list[str] | None:
    """The libraries the xcb plugin lacks (empty: none), or None when there is nothing to check or ldd cannot."""
    if not uses_xcb(environ):
        return None
    from app.studio.qt_libraries import missing_xcb_libraries

    return missing_xcb_libraries()
