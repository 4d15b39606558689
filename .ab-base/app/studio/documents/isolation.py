"""Run PDFium in a child process with a memory and a time limit.

PDFium aborts its process on some files (a 0.96 MB Flate bomb did: SIGABRT), and Python cannot catch
that. In a child process an abort, a memory-limit failure or a hang is a `DocumentError` naming the
file, and the Studio lives on. The child is spawned (never forked: the parent has threads, and a fork
could inherit a lock held by one of them); it imports only the document readers.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.studio.documents.model import DocumentError, ExtractionCancelled

MEMORY_LIMIT_BYTES = 768 * 1024**2  # the child's address space: extracting text needs a few hundred MB
TIME_LIMIT_SECONDS = 120.0
_POLL_SECONDS = 0.05


def run_isolated(
    path: Path,
    target: Callable[..., Any],
    *args: Any,
    cancel: Callable[[], bool] | None = None,
    seconds: float | None = None,
    memory_bytes: int | None = None,
) -> Any:
    """`target(*args)` (a module-level function, picklable arguments and result) in a child process.
    Its DocumentError comes back as one; a crash or a time-out ends the child and raises DocumentError,
    and `cancel()` turning true ends it and raises ExtractionCancelled."""
    seconds = TIME_LIMIT_SECONDS if seconds is None else seconds
    memory_bytes = MEMORY_LIMIT_BYTES if memory_bytes is None else memory_bytes
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(sender, memory_bytes, target, args), daemon=True)
    child.start()
    sender.close()
    try:
        waited = 0.0
        while not receiver.poll(_POLL_SECONDS):
            waited += _POLL_SECONDS
            if cancel is not None and cancel():
                raise ExtractionCancelled(f"reading {path.name} was cancelled")
            if not child.is_alive() and not receiver.poll(0):
                raise DocumentError(path, _crash_message(child.exitcode))
            if waited > seconds:
                raise DocumentError(
                    path, f"reading it took longer than {seconds:.0f} s (a decompression bomb?)"
                )
        try:
            kind, value = receiver.recv()
        except EOFError:  # the child died while sending
            child.join(1)
            raise DocumentError(path, _crash_message(child.exitcode)) from None
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if kind == "document_error":
        raise DocumentError(path, value)
    if kind == "memory":
        raise DocumentError(
            path, f"reading it needs more than {memory_bytes // 2**20} MiB (a decompression bomb?)"
        )
    if kind == "error":
        raise DocumentError(path, f"the file is corrupt or unreadable ({value})")
    return value


def _crash_message(exitcode: int | None) -> str:
    return (
        f"the PDF reader crashed on this file (exit code {exitcode}): a decompression bomb or a corrupt file"
    )


def _child(sender: Any, memory_bytes: int, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    _limit_memory(memory_bytes)
    try:
        sender.send(("ok", target(*args)))
    except DocumentError as exc:
        sender.send(("document_error", exc.problem))
    except MemoryError:
        sender.send(("memory", None))
    except Exception as exc:  # everything else comes back as a value: the parent words the error
        sender.send(("error", repr(exc)))
    finally:
        sender.close()


def _limit_memory(memory_bytes: int) -> None:
    try:
        import resource
    except ImportError:  # Windows: the time limit and the process boundary still hold
        return
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
