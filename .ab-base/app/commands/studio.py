"""`paddock` / `paddock studio`: open the Studio window on the embedded default model.

Without a display (Linux with neither DISPLAY nor WAYLAND_DISPLAY, or Qt unable to start
its platform plugin) there is no window to open: the command says so and serves the API
headless on 127.0.0.1:11660 instead, exactly as `paddock serve` does.

Qt aborts the whole process when its platform plugin cannot start (a missing xcb
library, an unreachable X server), so whether it can is asked first: `ldd` on the xcb
plugin for the shared libraries it lacks (named with their packages and the install
command, app/studio/qt_libraries.py), then a short-lived child process that starts Qt with
`QT_DEBUG_PLUGINS=1` (whose output names a library `ldd` could not check); only then is the
window opened in this one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HELP = "open the Paddock Studio window (the default command); without a display, serve the API headless"

QT_PROBE = (
    "import sys\n"
    "from PySide6.QtGui import QGuiApplication\n"
    "app = QGuiApplication(sys.argv[:1])\n"
    "print(app.platformName())\n"
)
QT_PROBE_TIMEOUT_S = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from app.commands.common import add_model_arguments
    from app.engine.server.settings import DEFAULT_PORT

    add_model_arguments(parser)
    parser.add_argument("--home", default=None,
                        help="keep settings, history and models under this folder (default: $PADDOCK_HOME or "
                             "the platform's user folders)")
    parser.add_argument("--headless", action="store_true", help="do not open a window: serve the API only")
    parser.add_argument("--engine", default=None, metavar="URL",
                        help="answer Chat, Documents and Transcribe with this OpenAI-compatible server (vLLM, "
                             "SGLang, another Paddock) instead of the engine inside the Studio")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port of the headless API (default {DEFAULT_PORT})")


def run(args: argparse.Namespace) -> int:
    reason = "--headless was given" if args.headless else no_display_reason()
    if reason is not None:
        headless = f"serving the API headless on http://127.0.0.1:{args.port} instead (Ctrl-C stops it)."
        if "\n" in reason:  # the system packages Qt lacks, with the install command
            print(f"paddock: the window cannot open.\n{reason}\nFor now, {headless}", file=sys.stderr)
        else:
            print(f"paddock: no display ({reason}); {headless}", file=sys.stderr)
        return serve_headless(args)
    from app.ui.main import run_studio

    model = args.model if args.model != "default" else None  # None: the start-up model from the settings
    return run_studio(model, home=args.home, engine_url=args.engine,
                      device=None if args.device == "auto" else args.device, max_model_len=args.max_ctx)


def no_display_reason(environ: dict[str, str] | None = None, probe: bool = True) -> str | None:
    """Why no window can open here, or None when one can."""
    env = os.environ if environ is None else environ
    platform = env.get("QT_QPA_PLATFORM", "")
    if sys.platform.startswith("linux") and not platform:
        if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
            return "neither DISPLAY nor WAYLAND_DISPLAY is set"
    if not probe:
        return None
    from app.commands.check_display import missing_for_window
    from app.studio.qt_libraries import install_advice, read_os_release

    missing = missing_for_window(env)
    if missing:
        return install_advice(missing, read_os_release())
    return qt_start_problem(env)


def qt_start_problem(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Start Qt's GUI layer in a child process; the reason it failed, or None when it started."""
    from app.studio.qt_libraries import install_advice, missing_from_qt_debug, read_os_release

    try:
        child = subprocess.run([sys.executable, "-c", QT_PROBE], env={**environ, "QT_DEBUG_PLUGINS": "1"},
                               capture_output=True, text=True, timeout=QT_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Qt did not start: {exc}"
    if child.returncode == 0:
        return None
    missing = missing_from_qt_debug(child.stderr)
    if missing:
        return install_advice(missing, read_os_release())
    lines = [line.strip() for line in child.stderr.splitlines() if line.strip()]
    detail = next((line for line in lines if "platform plugin" in line or "cannot" in line.lower()),
                  lines[-1] if lines else f"exit status {child.returncode}")
    return f"Qt could not start: {detail}"


def serve_headless(args: argparse.Namespace) -> int:
    """`paddock serve` on the loopback address with this command's model arguments."""
    from app.commands import serve

    parser = argparse.ArgumentParser(prog="paddock serve")
    serve.add_arguments(parser)
    argv = ["--model", args.model, "--device", args.device, "--host", "127.0.0.1", "--port", str(args.port)]
    if args.max_ctx is not None:
        argv += ["--max-ctx", str(args.max_ctx)]
    return serve.run(parser.parse_args(argv))
