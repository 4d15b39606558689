"""The one place threads meet Qt: results, progress and service events are delivered on the Qt thread.

Three kinds of work run outside a Qt slot:

- blocking jobs (hub search, downloads, fit probes, starting the API) go to an executor
  from app/studio/tasks.py through `Worker.submit`; their `on_done` and `on_progress`
  callbacks arrive on the Qt thread, the result (or error) as a `TaskResult` value;
- service events raised on other threads (the engine host's status, the API's request
  log) are wrapped with `Worker.threadsafe` by whoever subscribes;
- coroutines (chat streaming, compare) run on the qasync loop, which *is* the Qt
  thread; `Worker.spawn` keeps a reference to each task and reports its failure.

Every delivery is queued, even from the Qt thread itself, so a callback never runs
inside the call that scheduled it (a `SyncExecutor` in tests finishes a task before
`submit` returns). A callback whose `owner` widget has been destroyed is dropped. An
exception escaping a callback goes to `on_error` (the main window shows it as a
sentence) instead of printing a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import shiboken6
from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.studio.tasks import (
    CancelToken,
    DoneCallback,
    Progress,
    SyncExecutor,
    TaskFn,
    TaskHandle,
    TaskResult,
    ThreadExecutor,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
ErrorHandler = Callable[[BaseException], None]


class AsyncgenHooks:
    """Closes abandoned async generators on `loop`, as asyncio's own run_forever arranges and qasync does not.

    Without this, an HTTP stream left by a `break` is finalized by the garbage collector
    outside the loop and prints "async generator ignored GeneratorExit". Hooks are per
    thread: install on the Qt thread. A generator remembers the finalizer it first ran
    under, so one abandoned later (even from another thread) is still closed here.
    Closing is best effort: a stream that fails to close is logged, never left as a
    "Task exception was never retrieved" for whoever collects the task.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = sys.get_asyncgen_hooks()
        self._lock = threading.Lock()
        self._pending = 0  # finalized generators whose aclose has not finished yet
        self._tasks: set[asyncio.Future[Any]] = set()
        sys.set_asyncgen_hooks(firstiter=self._previous.firstiter, finalizer=self._finalize)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def restore(self) -> None:
        """Put back the hooks that were there before (generators already started keep this finalizer)."""
        sys.set_asyncgen_hooks(*self._previous)

    def _finalize(self, generator: Any) -> None:
        with self._lock:
            self._pending += 1
        try:
            self._loop.call_soon_threadsafe(self._close, generator)
        except RuntimeError:  # the loop is closed: nothing left to close the stream on
            self._done_one()

    def _close(self, generator: Any) -> None:
        task = self._loop.create_task(generator.aclose())
        self._tasks.add(task)
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        self._done_one()
        if not task.cancelled() and task.exception() is not None:
            log.warning("an abandoned async generator failed to close: %r", task.exception())

    def _done_one(self) -> None:
        with self._lock:
            self._pending -= 1


def install_asyncgen_hooks(loop: asyncio.AbstractEventLoop) -> AsyncgenHooks:
    """Close abandoned async generators on `loop` (see AsyncgenHooks); `.restore()` undoes it."""
    return AsyncgenHooks(loop)


class UiBridge(QObject):
    """Posts callables onto the thread this object lives on (create it on the Qt thread)."""

    _posted = Signal(object)

    def __init__(self, on_error: ErrorHandler | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.on_error = on_error
        self._posted.connect(self._run, Qt.ConnectionType.QueuedConnection)

    def post(self, fn: Callable[[], None], owner: QObject | None = None) -> None:
        """Run `fn()` on the Qt thread soon; skipped if `owner` is destroyed by then. Safe from any thread."""
        self._posted.emit((fn, owner))

    @Slot(object)
    def _run(self, item: tuple[Callable[[], None], QObject | None]) -> None:
        fn, owner = item
        if owner is not None and not shiboken6.isValid(owner):
            return
        try:
            fn()
        except Exception as exc:  # one failing callback must not take the window down
            self.report(exc)

    def report(self, exc: BaseException) -> None:
        if self.on_error is None:
            log.error("unhandled error in a UI callback", exc_info=exc)
            return
        self.on_error(exc)


class _LatestProgress:
    """Coalesces progress reports: at most one delivery queued, carrying the newest report."""

    def __init__(self, bridge: UiBridge, callback: Callable[[Progress], None], owner: QObject | None) -> None:
        self._bridge, self._callback, self._owner = bridge, callback, owner
        self._lock = threading.Lock()
        self._latest: Progress | None = None
        self._queued = False

    def push(self, progress: Progress) -> None:
        with self._lock:
            self._latest = progress
            if self._queued:
                return
            self._queued = True
        self._bridge.post(self._deliver, self._owner)

    def _deliver(self) -> None:
        with self._lock:
            progress, self._latest, self._queued = self._latest, None, False
        if progress is not None:
            self._callback(progress)


class Worker:
    """Runs background jobs and coroutines for the views, delivering their outcome on the Qt thread."""

    def __init__(self, bridge: UiBridge, executor: ThreadExecutor | SyncExecutor | None = None) -> None:
        self.bridge = bridge
        self.executor = executor or ThreadExecutor(max_workers=4)
        self._tasks: set[asyncio.Future[Any]] = set()

    def submit(self, fn: TaskFn[T], *, on_done: DoneCallback | None = None,
               on_progress: Callable[[Progress], None] | None = None, owner: QObject | None = None,
               token: CancelToken | None = None) -> TaskHandle[T]:
        """Run `fn(ctx)` on a worker thread; `on_done(TaskResult)` and `on_progress` arrive on the Qt thread."""
        progress = _LatestProgress(self.bridge, on_progress, owner).push if on_progress else None
        done = self.threadsafe(on_done, owner) if on_done else None
        return self.executor.submit(fn, on_progress=progress, on_done=done, token=token)

    def threadsafe(self, callback: Callable[..., None], owner: QObject | None = None) -> Callable[..., None]:
        """A function any thread may call; it runs `callback` with the same arguments on the Qt thread."""

        def relay(*args: Any) -> None:
            self.bridge.post(lambda: callback(*args), owner)

        return relay

    def spawn(self, coro: Coroutine[Any, Any, T], on_done: Callable[[TaskResult[T]], None] | None = None,
              owner: QObject | None = None) -> asyncio.Future[T]:
        """Run a coroutine on the Qt thread's event loop; its outcome comes back as a TaskResult."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def finished(done: asyncio.Future[T]) -> None:
            self._tasks.discard(done)
            if done.cancelled():
                result: TaskResult[T] = TaskResult(cancelled=True)
            elif done.exception() is not None:
                result = TaskResult(error=done.exception())
            else:
                result = TaskResult(value=done.result())
            if on_done is not None:
                self.bridge.post(lambda: on_done(result), owner)
            elif result.error is not None:
                self.bridge.report(result.error)

        task.add_done_callback(finished)
        return task

    def cancel_all(self) -> None:
        """Cancel the running coroutines (window closing)."""
        for task in list(self._tasks):
            task.cancel()

    def shutdown(self) -> None:
        self.cancel_all()
        self.executor.shutdown()
