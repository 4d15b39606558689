"""Background work for the Studio's services, without Qt: cancel tokens, progress, executors.

A task is a plain function `fn(ctx: TaskContext) -> T`. It checks `ctx.token` between
steps and reports with `ctx.report(done, total, message)`. The executor runs it and
hands back a `TaskResult` carrying the value, the error or the cancellation as a
value, so a UI never sees an exception thrown across a thread. `ThreadExecutor` runs
tasks on worker threads (callbacks arrive on that thread; app/ui/workers.py moves them
onto the Qt thread); `SyncExecutor` runs them at once on the caller's thread, which
makes tests deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class TaskCancelled(Exception):
    """Raised inside a task when its token is cancelled; reported as `TaskResult.cancelled`."""


class CancelToken:
    """Set once by whoever wants the work to stop; checked by the work between steps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise TaskCancelled("cancelled")

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run `callback` when cancelled (at once if already cancelled): e.g. close a socket."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds, waking early on cancel; True when cancelled."""
        return self._event.wait(timeout)


@dataclass(frozen=True)
class Progress:
    done: float
    total: float | None  # None: unknown (show a busy indicator)
    message: str = ""

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, max(0.0, self.done / self.total))


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class TaskResult(Generic[T]):
    value: T | None = None
    error: BaseException | None = None
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled

    @property
    def error_message(self) -> str | None:
        """What to show the user: the error's own message, never a traceback."""
        if self.cancelled:
            return "Cancelled."
        if self.error is None:
            return None
        return str(self.error) or type(self.error).__name__

    def unwrap(self) -> T:
        """The value, or raise the error (TaskCancelled when cancelled)."""
        if self.cancelled:
            raise TaskCancelled("cancelled")
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class TaskContext:
    """What a running task gets: its cancel token and a way to report progress."""

    def __init__(self, token: CancelToken, on_progress: ProgressCallback | None = None) -> None:
        self.token = token
        self._on_progress = on_progress

    def report(self, done: float, total: float | None = None, message: str = "") -> None:
        self.token.raise_if_cancelled()
        if self._on_progress is not None:
            self._on_progress(Progress(done, total, message))

    def progress_callback(self) -> ProgressCallback:
        """A callback for services that take `progress=`; it also honours the token."""

        def forward(progress: Progress) -> None:
            self.report(progress.done, progress.total, progress.message)

        return forward


TaskFn = Callable[[TaskContext], T]
DoneCallback = Callable[[TaskResult[Any]], None]


class TaskHandle(Generic[T]):
    def __init__(self, token: CancelToken, future: Future[TaskResult[T]]) -> None:
        self.token = token
        self._future = future

    def cancel(self) -> None:
        self.token.cancel()

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> TaskResult[T]:
        """Wait for the outcome (errors come back inside the TaskResult, not raised)."""
        return self._future.result(timeout)


def run_task(fn: TaskFn[T], ctx: TaskContext) -> TaskResult[T]:
    """Run `fn` and turn its outcome (value, error, cancellation) into a TaskResult."""
    try:
        value = fn(ctx)
    except TaskCancelled:
        return TaskResult(cancelled=True)
    except Exception as exc:  # delivered as a value; the UI shows exc's message
        if ctx.token.cancelled:
            return TaskResult(cancelled=True)  # e.g. a socket closed by the cancel callback
        return TaskResult(error=exc)
    return TaskResult(value=value)


class SyncExecutor:
    """Runs each task immediately on the calling thread: for tests and the command line."""

    def submit(
        self,
        fn: TaskFn[T],
        on_progress: ProgressCallback | None = None,
        on_done: DoneCallback | None = None,
        token: CancelToken | None = None,
    ) -> TaskHandle[T]:
        token = token or CancelToken()
        result = run_task(fn, TaskContext(token, on_progress))
        if on_done is not None:
            on_done(result)
        future: Future[TaskResult[T]] = Future()
        future.set_result(result)
        return TaskHandle(token, future)

    def shutdown(self) -> None:
        pass


class ThreadExecutor:
    """Runs tasks on a small thread pool. Callbacks are called on the worker thread."""

    def __init__(self, max_workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="studio-task")
        self._closed = False

    def submit(
        self,
        fn: TaskFn[T],
        on_progress: ProgressCallback | None = None,
        on_done: DoneCallback | None = None,
        token: CancelToken | None = None,
    ) -> TaskHandle[T]:
        token = token or CancelToken()

        def work() -> TaskResult[T]:
            result = run_task(fn, TaskContext(token, on_progress))
            if on_done is not None:
                on_done(result)
            return result

        try:
            return TaskHandle(token, self._pool.submit(work))
        except RuntimeError:
            if not self._closed:
                raise
        # Shut down: the Studio is closing, and a view's late event (a table's selection cleared as
        # it empties) asked for work. It gets a task that never runs, and no callback.
        token.cancel()
        never: Future[TaskResult[T]] = Future()
        never.set_result(TaskResult(cancelled=True))
        return TaskHandle(token, never)

    def shutdown(self, cancel_pending: bool = True) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=cancel_pending)
