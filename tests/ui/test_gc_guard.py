"""app/ui/gc_guard.py: while the Studio runs, reference cycles are collected on the GUI thread,
never in a worker thread (where finalizing a Qt object can deadlock against the GUI thread)."""

from __future__ import annotations

import gc
import threading


def test_cycles_made_in_a_worker_are_collected_on_the_gui_thread(qtbot, _gui_thread_collector) -> None:
    finalized: list[str] = []
    kept: list[list] = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            finalized.append(threading.current_thread().name)

    def work() -> None:
        Cycle()
        # well past the first generation's threshold: the automatic collector would run here
        kept.extend([] for _ in range(10 * gc.get_threshold()[0]))

    assert not gc.isenabled()
    worker = threading.Thread(target=work, name="studio-task-test")
    worker.start()
    worker.join()
    assert finalized == []  # nothing was collected in the worker
    qtbot.waitUntil(lambda: bool(finalized), timeout=5000)
    assert finalized == [threading.main_thread().name]
