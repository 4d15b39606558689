"""`paddock`: the Studio by default, and the engine's command-line tools.

Each subcommand lives in `app/commands/<name>.py` with `HELP`, `add_arguments(parser)`
and `run(args) -> int`; those modules import their heavy dependencies inside `run`, so
`paddock --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = [
    "studio",
    "serve",
    "generate",
    "models",
    "fit",
    "extract",
    "transcribe",
    "bench",
    "mcp",
    "install_desktop",
    "check_display",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paddock", description="Paddock Studio: local LLMs on your GPU.")
    parser.add_argument("--version", action=VersionAction,
                        help="print the version, the engine backend this machine gets and the CUDA/CuPy versions")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"app.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"app.commands.{name}":
                raise
            continue  # command not built yet
        command = sub.add_parser(name.replace("_", "-"), help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return parser


class VersionAction(argparse.Action):
    """`--version`: the report, then exit (CuPy is probed only here, not when the parser is built)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print("\n".join(version_lines()))
        parser.exit()


def version_lines() -> list[str]:
    from app import __version__
    from app.studio.gpu_support import gpu_support

    frozen = " (installed bundle)" if getattr(sys, "frozen", False) else ""
    return [f"Paddock Studio {__version__}{frozen}", f"Python {sys.version.split()[0]}", *gpu_support().lines()]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = parser.parse_args(["studio"])
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: the command has already stopped cleanly (uvicorn re-raises it after)
        return 130  # the shell's status for "ended by SIGINT", without a traceback


if __name__ == "__main__":
    sys.exit(main())
