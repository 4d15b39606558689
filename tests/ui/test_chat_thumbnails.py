"""Attached images show as thumbnails: in the composer's tray (attached with the real Attach button) and in
the transcript's question once sent to the tiny random-weight Gemma 3 vision model. Each thumbnail is
the file's own picture scaled down (its pixels are checked); a file that is not a readable image shows
its name with a warning and a note, and nothing crashes."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QImage, QTextCursor, QTextDocument

from app.studio.history import Attachment
from app.ui.widgets.thumbnails import BROKEN_NOTE, THUMB_PX

from .test_chat_attach import _attach, _send, vision_engine  # noqa: F401 - the fixture, used by name

RED, BLUE = (255, 0, 0), (0, 0, 255)


def _two_colour_png(path: Path, width: int = 200, height: int = 100) -> Path:
    """Red on the left half, blue on the right: a thumbnail made from it must keep both, in place."""
    from PIL import Image

    image = Image.new("RGB", (width, height), RED)
    image.paste(Image.new("RGB", (width // 2, height), BLUE), (width // 2, 0))
    image.save(path, "PNG")
    return path


def _colour(image: QImage, x: int, y: int) -> tuple[int, int, int]:
    pixel = image.pixelColor(x, y)
    return pixel.red(), pixel.green(), pixel.blue()


def _assert_is_the_picture(image: QImage) -> None:
    """The 200 x 100 two-colour picture, scaled to fit THUMB_PX with its aspect kept."""
    assert (image.width(), image.height()) == (THUMB_PX, THUMB_PX // 2)
    assert _colour(image, 4, THUMB_PX // 4) == RED
    assert _colour(image, THUMB_PX - 5, THUMB_PX // 4) == BLUE


def _transcript_images(view) -> list[QImage]:
    """The images placed in the transcript's document, in order, as the document resolves them."""
    document, cursor, names = view.document(), QTextCursor(view.document()), []
    for position in range(1, document.characterCount()):
        cursor.setPosition(position)  # the format of the character just before the cursor
        char = cursor.charFormat()
        if char.isImageFormat() and char.toImageFormat().name() not in names:
            names.append(char.toImageFormat().name())
    return [document.resource(QTextDocument.ResourceType.ImageResource, QUrl(name)) for name in names]


def test_thumbnails_in_the_tray_and_the_transcript(qtbot, make_window, tmp_path, vision_engine):  # noqa: F811
    window = make_window(panes=("chat",), engine=vision_engine)
    pane = window.pane("chat")
    pane.sampling.boxes["max_tokens"].setValue(2)
    picture = _two_colour_png(tmp_path / "flag.png")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but the rest is not a picture")
    assert _attach(qtbot, pane, [picture, broken]).ok
    tiles = pane.tray.tiles
    assert tiles.count() == 2 and tiles.isVisibleTo(pane)
    shown = tiles.item(0).icon().pixmap(THUMB_PX, THUMB_PX).toImage()
    _assert_is_the_picture(shown)
    assert tiles.item(0).text() == "flag.png" and tiles.item(0).data(Qt.ItemDataRole.UserRole) is True
    bad = tiles.item(1)
    assert bad.text() == "broken.png" and bad.data(Qt.ItemDataRole.UserRole) is False
    assert not bad.icon().isNull() and BROKEN_NOTE in bad.toolTip()  # the warning icon, and why
    assert f"broken.png ({BROKEN_NOTE})" in pane.tray.label.text()

    qtbot.mouseClick(pane.tray.remove_button, Qt.MouseButton.LeftButton)
    assert pane.tray.tiles.count() == 0
    assert _attach(qtbot, pane, [picture]).ok
    assert _send(qtbot, pane, "Which colours?").ok
    [image] = _transcript_images(pane.transcript)
    _assert_is_the_picture(image)
    assert "Image: flag.png" in pane.transcript.toPlainText()
    pane.raw_view.setChecked(True)  # rendered again: the thumbnail stays
    assert len(_transcript_images(pane.transcript)) == 1


def test_a_saved_image_that_cannot_be_decoded_is_named_in_the_transcript(qtbot, make_window):
    window = make_window(panes=("chat",))
    pane, history = window.pane("chat"), window.context.history
    conversation = history.create_conversation("Old photos")
    question = history.add_message(conversation.id, "user", "What is in it?")
    history.add_attachments(question.id, [Attachment("image", "scan.jpg", b"\xff\xd8\xff truncated"),
                                          Attachment("document", "notes.txt", b"Lunch is at noon.")])
    history.add_message(conversation.id, "assistant", "I cannot tell.")
    pane.refresh_conversations()
    pane.open_conversation(conversation.id)
    text = pane.transcript.toPlainText()
    assert f"Image: scan.jpg ({BROKEN_NOTE}) · File: notes.txt" in text and "I cannot tell." in text
    assert _transcript_images(pane.transcript) == []
