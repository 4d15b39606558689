"""The installed bundle's entry point: `paddock` as the command line installs it, plus two things a frozen
program needs that a Python interpreter gives for free.

- `multiprocessing.freeze_support()`: the documents service reads PDFs in a spawned child process,
  and a spawned child of a frozen program is this same executable started with special arguments.
- `paddock -c CODE`: `paddock studio` first asks a short-lived child `sys.executable -c ...` whether
  Qt's platform plugin can start (Qt aborts the whole process when it cannot). In the bundle
  `sys.executable` is this program, so it answers `-c` as the interpreter would.
"""

from __future__ import annotations

import multiprocessing
import sys


def main() -> int:
    multiprocessing.freeze_support()
    if len(sys.argv) >= 3 and sys.argv[1] == "-c":
        code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        return 0
    from app.cli import main as paddock

    return paddock()


if __name__ == "__main__":
    sys.exit(main())
