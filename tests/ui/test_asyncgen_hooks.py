"""Abandoned async generators (an HTTP stream left by a `break`) are closed on the Qt loop, and a close
that fails is logged instead of surfacing later as "Task exception was never retrieved"."""

from __future__ import annotations

import asyncio
import gc
import logging

from app.ui.workers import install_asyncgen_hooks


async def stream(closed: list[str], fail_on_close: bool = False):
    try:
        for n in range(100):
            yield n
            await asyncio.sleep(0)
    finally:
        closed.append("in a task" if asyncio.current_task() is not None else "outside any task")
        if fail_on_close:
            raise RuntimeError("the transport was already gone")


async def take_one(closed: list[str], fail_on_close: bool = False) -> int:
    async for n in stream(closed, fail_on_close):
        return n  # abandons the generator mid-stream
    raise AssertionError("the stream was empty")


def test_an_abandoned_stream_is_closed_inside_a_task_on_the_loop(qtbot, qloop):
    closed: list[str] = []
    task = qloop.create_task(take_one(closed))
    qtbot.waitUntil(task.done)
    gc.collect()
    qtbot.waitUntil(lambda: closed == ["in a task"])


def test_a_stream_that_fails_to_close_is_logged_and_leaves_no_loop_error(qtbot, qloop, caplog):
    closed: list[str] = []
    with caplog.at_level(logging.WARNING, logger="app.ui.workers"):
        task = qloop.create_task(take_one(closed, fail_on_close=True))
        qtbot.waitUntil(task.done)
        gc.collect()
        qtbot.waitUntil(lambda: "failed to close" in caplog.text)
    assert closed == ["in a task"]
    assert "the transport was already gone" in caplog.text
    gc.collect()  # the finished close task is freed here; qloop's teardown fails the test on a loop error


def test_restore_puts_back_the_hooks_that_were_there(qloop):
    import sys

    before = sys.get_asyncgen_hooks()
    hooks = install_asyncgen_hooks(qloop)
    assert sys.get_asyncgen_hooks().finalizer is not before.finalizer
    hooks.restore()
    assert sys.get_asyncgen_hooks() == before
