"""The chat transcript: each turn as a header with its actions, answers rendered as Markdown (or raw).

The whole conversation is rendered as one HTML document (app/studio/markdown.py makes the
answers' HTML). While an answer streams, `append_delta` collects the deltas and at most
every STREAM_RENDER_MS renders the answer so far as Markdown in place of its previous
rendering, leaving the turns above untouched (an unclosed code fence renders as a code
block to the end, as CommonMark reads it); the view follows the end unless the user has
scrolled up, and then stays where they are. The pane renders all again when the answer ends.
Actions are links (Copy, Edit, Delete, the versions ‹ 1/2 ›, a code block's Copy) whose
scheme carries a random name made per view, so a link in a model's answer cannot trigger
one; clicking one emits `action` (or copies the code block itself). A question's images show as
thumbnails under its file names, served to the document by `loadResource` from the view's own
cache under the same per-view scheme; an image that cannot be decoded is named with a note instead.
"""

from __future__ import annotations

import html
import secrets
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QImage, QTextCursor, QTextDocument
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.studio.chat import AnswerStats
from app.studio.history import Attachment, Conversation, Message
from app.studio.markdown import render_markdown
from app.ui.widgets.thumbnails import BROKEN_NOTE, thumbnail

STATUS_NOTES = {
    "stopped": "stopped",
    "interrupted": "interrupted: the Studio closed while this answer was streaming",
    "error": "failed",
}
NOTE_STYLE = "color:#808080; font-style:italic"
ACTION_STYLE = "color:#707070; font-weight:normal; font-size:small"
STREAM_RENDER_MS = 100  # the streaming answer is rendered again at most this often
FOLLOW_SLACK_PX = 4  # a scroll bar this close to the bottom counts as following the end
STREAM_LEAD = "<p>\u200b</p>"  # see render_stream
KIND_MARKS = {"image": "Image:", "document": "File:"}  # words: emoji fonts are missing on many desktops
ERROR_STYLE = "color:#c0392b"


class TranscriptView(QTextBrowser):
    action = Signal(str, int, int)  # what ("copy" | "edit" | "delete" | "version"), message id, version number

    def __init__(self, copy_text: Callable[[str], None] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._copy = copy_text or (lambda text: None)
        self._scheme = "paddock" + secrets.token_hex(6)  # unguessable: links in answers cannot act
        self.raw = False  # True: answers as the model wrote them, Markdown unrendered
        self.code_blocks: list[str] = []
        self.thumbnails: dict[str, QImage | None] = {}  # "scheme:thumb/<message>/<n>": the preview, None if broken
        self._shown: tuple[Conversation | None, dict[int, list[Message]], str] = (None, {}, "")
        self.streaming_text = ""  # the answer streaming at the end of the document, as received so far
        self._stream_at: int | None = None  # where its rendering starts in the document; None: nothing streams
        self._stream_blocks = 0  # how many code blocks the turns above it hold
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(STREAM_RENDER_MS)
        self._render_timer.timeout.connect(self.render_stream)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_link)
        self.setPlaceholderText("Ask something below. Answers stream in here and are saved as they arrive.")

    def show_conversation(self, conversation: Conversation | None, model_label: str = "",
                          versions: dict[int, list[Message]] | None = None) -> None:
        """Render every turn; a message still streaming ends the document, ready for `append_delta`.
        `versions`: for answers with more than one version, all of them (oldest first)."""
        bar = self.verticalScrollBar()
        same = conversation is not None and self._shown[0] is not None and self._shown[0].id == conversation.id
        kept = bar.value() if same and bar.value() < bar.maximum() - FOLLOW_SLACK_PX else None  # scrolled up
        if not same:
            self.thumbnails.clear()  # another conversation's previews are decoded again when it is shown
        self._shown = (conversation, versions or {}, model_label)
        self.code_blocks = []
        self._render_timer.stop()
        self._stream_at, self.streaming_text = None, ""
        if conversation is None:
            self.clear()
            return
        turns = [m for m in conversation.messages if m.role in ("user", "assistant")]
        streaming = turns[-1] if turns and turns[-1].status == "streaming" else None
        self.setHtml("".join(self._turn(m, model_label, (versions or {}).get(m.id, []),
                                        conversation.attachments.get(m.id, ())) for m in turns))
        if streaming is not None:  # its text so far goes after its header, re-rendered as it grows
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            self._stream_at, self._stream_blocks = cursor.position(), len(self.code_blocks)
            self.streaming_text = streaming.content
            self.render_stream(follow=True)
        if kept is None:
            self._scroll_to_end()
        else:  # the same conversation drawn again (an answer ended): the reader stays where they were
            bar.setValue(kept)

    def set_raw(self, raw: bool) -> None:
        self.raw = raw
        conversation, versions, label = self._shown
        streamed = self.streaming_text  # newer than the conversation as it was last shown
        self.show_conversation(conversation, label, versions)
        if self._stream_at is not None:
            self.streaming_text = streamed
            self.render_stream(follow=True)

    def append_delta(self, text: str) -> None:
        """More of the streaming answer; it is rendered within STREAM_RENDER_MS."""
        self.streaming_text += text
        if self._stream_at is None:  # no streaming turn is shown (the pane renders the conversation first)
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(text)
            return
        if not self._render_timer.isActive():
            self._render_timer.start()

    def render_stream(self, follow: bool | None = None) -> None:
        """Render the streaming answer so far in place of its last rendering (the timer calls this)."""
        if self._stream_at is None:
            return
        bar = self.verticalScrollBar()
        at, following = bar.value(), bar.value() >= bar.maximum() - FOLLOW_SLACK_PX if follow is None else follow
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._stream_at)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        del self.code_blocks[self._stream_blocks:]
        if self.raw:
            body = f'<p style="white-space:pre-wrap">{html.escape(self.streaming_text)}</p>'
        else:
            rendered = render_markdown(self.streaming_text, lambda n: self._href("code", 0, n), self._stream_blocks)
            self.code_blocks.extend(rendered.code_blocks)
            body = rendered.html
        # insertHtml merges its first block into the one at the cursor (the header), losing that block's
        # heading or list format: an invisible first paragraph takes the merge instead
        cursor.insertHtml(STREAM_LEAD + body)
        if following:
            self._scroll_to_end()
        else:  # the user scrolled up to read: the growing answer below does not move them
            bar.setValue(at)

    def copy_code(self, number: int) -> None:
        self._copy(self.code_blocks[number])

    # -- rendering ------------------------------------------------------------------------
    def _href(self, what: str, message_id: int, n: int = 0) -> str:
        return f"{self._scheme}:{what}/{message_id}/{n}"

    def _turn(self, message: Message, model_label: str, versions: list[Message],
              attachments: tuple[Attachment, ...] = ()) -> str:
        user = message.role == "user"
        who = "You" if user else (message.model or model_label or "Assistant")
        links = []
        if len(versions) > 1:
            at = next((i for i, v in enumerate(versions) if v.id == message.id), 0)
            if at > 0:
                links.append(f'<a href="{self._href("version", versions[at - 1].id)}">‹</a>')
            links.append(f"{at + 1}/{len(versions)}")
            if at < len(versions) - 1:
                links.append(f'<a href="{self._href("version", versions[at + 1].id)}">›</a>')
        streaming = message.status == "streaming"
        if not streaming:
            links.append(f'<a href="{self._href("copy", message.id)}">Copy</a>')
            if user:
                links.append(f'<a href="{self._href("edit", message.id)}">Edit</a>')
            links.append(f'<a href="{self._href("delete", message.id)}">Delete</a>')
        head = (f'<p style="margin-top:14px"><b>{html.escape(who)}</b>&nbsp;&nbsp;'
                f'<span style="{ACTION_STYLE}">{" · ".join(links)}</span></p>')
        if streaming:  # its body is rendered by render_stream, after this header
            return head
        body = self._body(message, markdown=not user and not self.raw)
        return head + self._files(message.id, attachments) + body + self._note(message)

    def _files(self, message_id: int, attachments: tuple[Attachment, ...]) -> str:
        """The question's file names, then its images' thumbnails (a broken image: its name says so)."""
        if not attachments:
            return ""
        names, pictures = [], []
        for n, attachment in enumerate(attachments):
            name = f"{KIND_MARKS.get(attachment.kind, '')} {html.escape(attachment.name)}"
            if attachment.kind == "image":
                url = self._href("thumb", message_id, n)
                if url not in self.thumbnails:  # decoded once per view, not at every render
                    self.thumbnails[url] = thumbnail(attachment.data)
                image = self.thumbnails[url]
                if image is None:
                    name += f' <span style="{ERROR_STYLE}">({BROKEN_NOTE})</span>'
                else:
                    pictures.append(f'<img src="{url}" width="{image.width()}" height="{image.height()}" '
                                    f'alt="{html.escape(attachment.name)}">')
            names.append(name)
        files = f'<p style="{ACTION_STYLE}">{" · ".join(names)}</p>'
        return files + (f"<p>{'&nbsp;'.join(pictures)}</p>" if pictures else "")

    def loadResource(self, kind: int, name: QUrl) -> Any:
        """A question's thumbnail from the cache (under this view's scheme); anything else as QTextBrowser loads it."""
        if name.scheme() == self._scheme:
            image = getattr(kind, "value", kind) == QTextDocument.ResourceType.ImageResource.value
            return self.thumbnails.get(name.toString()) if image else None
        return super().loadResource(kind, name)

    def _body(self, message: Message, markdown: bool) -> str:
        if not markdown:  # what was typed, or an answer still arriving: as it is
            return f'<p style="white-space:pre-wrap">{html.escape(message.content)}</p>'
        rendered = render_markdown(message.content, lambda n: self._href("code", 0, n), len(self.code_blocks))
        self.code_blocks.extend(rendered.code_blocks)
        return rendered.html

    def _note(self, message: Message) -> str:
        if message.role != "assistant" or message.status == "streaming":
            return ""
        note = AnswerStats.from_message(message).describe()
        if message.status in STATUS_NOTES:
            note = f"({STATUS_NOTES[message.status]}) {note}".strip()
        return f'<p style="{NOTE_STYLE}">{html.escape(note)}</p>' if note else ""

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() != self._scheme:
            if url.scheme() in ("http", "https", "mailto"):
                QDesktopServices.openUrl(url)
            return
        what, message_id, n = [*url.path().split("/"), "0", "0"][:3]
        if what == "code":
            self.copy_code(int(n))
        else:
            self.action.emit(what, int(message_id), int(n))

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
