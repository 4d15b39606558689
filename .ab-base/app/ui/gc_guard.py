"""Python's cycle collector runs on the GUI thread only, while Qt is up.

The collector runs in whichever thread happens to allocate past its threshold. When it
finalizes a PySide object from a worker thread, Qt's disconnect takes the signal-slot mutex
and then waits for the GIL, while the GUI thread, holding the GIL, waits for that same mutex
inside a connect: both hang. Seen in CI on 2026-11-30: a Studio task thread listing models
collected a closed window's widgets while the GUI thread built a new window. So automatic
collection is switched off and a timer on the GUI thread collects instead, generation by
generation with the interpreter's own thresholds, as the automatic collector would.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 500


class GuiThreadCollector(QObject):
    """Create on the GUI thread; `stop()` gives collection back to the interpreter."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS) -> None:
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect)
        self._timer.start(interval_ms)

    def collect(self) -> None:
        """What the automatic collector would have done by now: each generation whose count passed
        its threshold (a collection of one generation advances the next one's count)."""
        for generation in range(3):
            if gc.get_count()[generation] > self._thresholds[generation]:
                gc.collect(generation)

    def stop(self) -> None:
        self._timer.stop()
        if self._was_enabled:
            gc.enable()
