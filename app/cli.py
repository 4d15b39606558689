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
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paddock", description="Paddock Studio: local LLMs on your GPU.")
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = parser.parse_args(["studio"])
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
