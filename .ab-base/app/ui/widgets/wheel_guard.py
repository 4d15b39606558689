"""Number fields, drop-downs and sliders take the mouse wheel only once the user has clicked into them.

Scrolling a form moves the pointer across its fields; a wheel-focus spin box or combo box
under the pointer would change its value on the way ("Listen on" switched to LAN while
scrolling the Settings dialog). `guard_wheel(root)` gives every such field under `root`
click/tab focus only and ignores wheel events until it has focus; an ignored wheel event
goes on to the parent, so the scroll area still scrolls.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QComboBox, QWidget

GUARDED = (QAbstractSpinBox, QComboBox, QAbstractSlider)


class _WheelGuard(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            event.ignore()  # not accepted: Qt offers it to the parent (the scroll area)
            return True
        return False


_GUARD = _WheelGuard()  # one filter object shared by every guarded field


def guard_wheel(root: QWidget) -> None:
    """Guard `root` itself when it is such a field, and every such field below it (call again for new ones)."""
    fields = [root] if isinstance(root, GUARDED) else []
    fields += [w for kind in GUARDED for w in root.findChildren(kind)]
    for field in fields:
        if field.property("wheelGuarded"):
            continue
        field.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # WheelFocus would let the wheel give it focus
        field.installEventFilter(_GUARD)
        field.setProperty("wheelGuarded", True)
