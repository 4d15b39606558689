"""Small previews of attached images, for the composer's tray and the transcript.

Made from the image's bytes (as read from its file) by QImageReader with a scaled size, so a
large JPEG is decoded at the small size rather than whole. Bytes that are not an image Qt can
decode give None: the caller shows the name with an error instead (never a crash).
"""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt
from PySide6.QtGui import QImage, QImageReader

THUMB_PX = 64  # the longest edge of a preview
BROKEN_NOTE = "cannot be shown: not a readable image"


def thumbnail(data: bytes, edge: int = THUMB_PX) -> QImage | None:
    """The image scaled to fit `edge` x `edge` (aspect kept, never enlarged), or None when it cannot be decoded."""
    buffer = QBuffer()
    buffer.setData(QByteArray(data))
    buffer.open(QIODevice.OpenModeFlag.ReadOnly)
    reader = QImageReader(buffer)
    size = reader.size()
    if size.isValid() and (size.width() > edge or size.height() > edge):
        reader.setScaledSize(size.scaled(QSize(edge, edge), Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        return None
    if image.width() > edge or image.height() > edge:  # a format that ignores the scaled size
        image = image.scaled(edge, edge, Qt.AspectRatioMode.KeepAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
    return image
