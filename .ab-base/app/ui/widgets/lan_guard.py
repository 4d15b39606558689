"""The one question asked before the API is opened to the network without a key.

Both the Settings dialog and the Server pane can switch "Listen on" to LAN; both ask here,
so the wording and the offer to generate a key are the same everywhere.
"""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.ui.widgets.dialogs import Dialogs

GENERATE, KEEP_OPEN = "Generate a key", "Allow without a key"
LAN_WARNING = ("With “Local network”, every machine on your network can use the model through the API, "
               "and no API key is required yet. Generate a key that clients must send?")


def ask_lan_without_key(dialogs: Dialogs, parent: QWidget) -> str | None:
    """GENERATE, KEEP_OPEN, or None: the user backed out and the change should not be made."""
    answer = dialogs.choose(parent, "Open the API to your network?", LAN_WARNING, [GENERATE, KEEP_OPEN])
    return answer if answer in (GENERATE, KEEP_OPEN) else None
