"""Conversations in SQLite, saved as they stream.

An answer is a row created when generation starts (status "streaming"); every delta
is appended and committed at once, so a crash loses nothing the user already saw.
On the next open, answers still marked "streaming" become "interrupted".

The schema is versioned with `PRAGMA user_version`: `MIGRATIONS[i]` takes a database
from version i to i + 1, each inside one transaction. A database from a newer Studio
is refused rather than touched.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
ATTACHMENT_KINDS = ("image", "document")
STATUSES = ("streaming", "complete", "stopped", "interrupted", "error")
TITLE_LENGTH = 60

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: conversations and their messages
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        system_prompt TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # 1 -> 2: streaming state and per-answer statistics; per-conversation sampling settings
    """
    ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'complete';
    ALTER TABLE messages ADD COLUMN model TEXT NOT NULL DEFAULT '';
    ALTER TABLE messages ADD COLUMN finish_reason TEXT;
    ALTER TABLE messages ADD COLUMN prompt_tokens INTEGER;
    ALTER TABLE messages ADD COLUMN completion_tokens INTEGER;
    ALTER TABLE messages ADD COLUMN ttft_s REAL;
    ALTER TABLE messages ADD COLUMN tokens_per_s REAL;
    ALTER TABLE conversations ADD COLUMN settings_json TEXT NOT NULL DEFAULT '{}';
    """,
    # 2 -> 3: answer versions (Regenerate keeps the earlier answers; one of each group is shown)
    """
    ALTER TABLE messages ADD COLUMN version_of INTEGER;
    ALTER TABLE messages ADD COLUMN active INTEGER NOT NULL DEFAULT 1;
    """,
    # 3 -> 4: files attached to a question (images as their bytes, documents as their extracted text)
    """
    CREATE TABLE attachments (
        id INTEGER PRIMARY KEY,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX attachments_by_message ON attachments(message_id, id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(Exception):
    """The history database cannot be used as asked; the message says why."""


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    created_at: float
    status: str = "complete"
    model: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    version_of: int | None = None  # the first answer of this one's version group; None: it is the first
    active: int = 1  # 1: the version shown and sent to the model; 0: an earlier (or later) alternative

    @property
    def group(self) -> int:
        return self.version_of or self.id


@dataclass(frozen=True)
class Attachment:
    """A file sent with a question: an image's bytes, or a document's extracted text (UTF-8)."""

    kind: str  # "image" | "document"
    name: str  # the file's name, shown under the question
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    system_prompt: str
    created_at: float
    updated_at: float
    settings: dict[str, Any] = field(default_factory=dict)
    messages: tuple[Message, ...] = ()  # empty in listings; filled by History.conversation()
    attachments: dict[int, tuple[Attachment, ...]] = field(default_factory=dict)  # message id -> its files


class History:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()  # one connection shared by the UI and streaming threads
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open the history database {self.path}: {exc}") from exc
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")  # readers never block the streaming writer
            self._db.execute("PRAGMA synchronous=NORMAL")  # committed rows survive an app crash
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except (sqlite3.Error, HistoryError) as exc:
            self._db.close()
            if isinstance(exc, HistoryError):
                raise
            raise HistoryError(f"cannot open the history database {self.path}: {exc}") from exc
        with self._write() as db:
            db.execute("UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"{self.path} was written by a newer Paddock Studio (schema {version}; this one knows up to "
                f"{SCHEMA_VERSION}). It was left untouched: update the Studio to open it."
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            script = MIGRATIONS[target - 1]
            statements = [s.strip() for s in script.split(";") if s.strip()]
            with self._write() as db:
                for statement in statements:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction (rolled back if the body raises)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # --- conversations -----------------------------------------------------------------

    def create_conversation(self, title: str = "", model: str = "", system_prompt: str = "",
                            settings: dict[str, Any] | None = None) -> Conversation:
        now = time.time()
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, model, system_prompt, settings_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (title, model, system_prompt, json.dumps(settings or {}), now, now),
            )
        return self.conversation(int(cursor.lastrowid or 0), with_messages=False)

    def conversations(self, search: str | None = None) -> list[Conversation]:
        """All conversations, most recently active first; `search` matches titles and message text."""
        sql = "SELECT * FROM conversations"
        args: tuple[Any, ...] = ()
        if search:
            sql += (" WHERE title LIKE ?1 OR id IN (SELECT conversation_id FROM messages WHERE content LIKE ?1)")
            args = (f"%{search}%",)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY updated_at DESC, id DESC", args).fetchall()
        return [_conversation(row) for row in rows]

    def conversation(self, conversation_id: int, with_messages: bool = True) -> Conversation:
        with self._lock:
            row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no conversation with id {conversation_id}")
            messages = (
                self._db.execute("SELECT * FROM messages WHERE conversation_id = ? AND active = 1 ORDER BY id",
                                 (conversation_id,)).fetchall()
                if with_messages else []
            )
            files = (
                self._db.execute("SELECT a.* FROM attachments a JOIN messages m ON m.id = a.message_id "
                                 "WHERE m.conversation_id = ? AND m.active = 1 ORDER BY a.id",
                                 (conversation_id,)).fetchall()
                if with_messages else []
            )
        attachments: dict[int, tuple[Attachment, ...]] = {}
        for file in files:
            attachments[file["message_id"]] = (*attachments.get(file["message_id"], ()),
                                               Attachment(file["kind"], file["name"], bytes(file["data"])))
        return replace(_conversation(row, tuple(_message(m) for m in messages)), attachments=attachments)

    def update_conversation(self, conversation_id: int, *, title: str | None = None, model: str | None = None,
                            system_prompt: str | None = None, settings: dict[str, Any] | None = None) -> None:
        changes = {"title": title, "model": model, "system_prompt": system_prompt,
                   "settings_json": None if settings is None else json.dumps(settings)}
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return
        assignments = ", ".join(f"{column} = ?" for column in changes)
        with self._write() as db:
            cursor = db.execute(f"UPDATE conversations SET {assignments}, updated_at = ? WHERE id = ?",
                                (*changes.values(), time.time(), conversation_id))
            if cursor.rowcount == 0:
                raise HistoryError(f"no conversation with id {conversation_id}")

    def delete_conversation(self, conversation_id: int) -> None:
        with self._write() as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # --- messages ------------------------------------------------------------------------

    def add_message(self, conversation_id: int, role: str, content: str, model: str = "") -> Message:
        """A finished message (the user's, or a complete answer)."""
        return self._insert(conversation_id, role, content, model, "complete")

    def add_attachments(self, message_id: int, attachments: tuple[Attachment, ...] | list[Attachment]) -> None:
        """Keep the files sent with a question (deleted with it)."""
        for attachment in attachments:
            if attachment.kind not in ATTACHMENT_KINDS:
                raise HistoryError(f"an attachment's kind must be one of {', '.join(ATTACHMENT_KINDS)}, "
                                   f"not {attachment.kind!r}")
        with self._write() as db:
            try:
                db.executemany("INSERT INTO attachments (message_id, kind, name, data) VALUES (?, ?, ?, ?)",
                               [(message_id, a.kind, a.name, a.data) for a in attachments])
            except sqlite3.IntegrityError:
                raise HistoryError(f"no message with id {message_id}") from None

    def start_message(self, conversation_id: int, role: str = "assistant", model: str = "",
                      replacing: int | None = None) -> Message:
        """An answer about to stream in: append deltas with `append`, end with `finish_message`.

        `replacing`: the answer this one is a new version of; it is kept, hidden, as version 1/2/…"""
        message = self._insert(conversation_id, role, "", model, "streaming")
        if replacing is not None:
            group = self.message(replacing).group
            with self._write() as db:
                db.execute("UPDATE messages SET active = 0 WHERE id = ?1 OR version_of = ?1", (group,))
                db.execute("UPDATE messages SET version_of = ? WHERE id = ?", (group, message.id))
            message = self.message(message.id)
        return message

    def versions(self, message_id: int) -> list[Message]:
        """Every version of this answer, oldest first (one entry when it was never regenerated)."""
        group = self.message(message_id).group
        with self._lock:
            rows = self._db.execute("SELECT * FROM messages WHERE id = ?1 OR version_of = ?1 ORDER BY id",
                                    (group,)).fetchall()
        return [_message(row) for row in rows]

    def show_version(self, message_id: int) -> None:
        """Make this version the one shown and sent; its siblings are hidden."""
        group = self.message(message_id).group
        with self._write() as db:
            db.execute("UPDATE messages SET active = (id = ?2) WHERE id = ?1 OR version_of = ?1", (group, message_id))

    def delete_message(self, message_id: int) -> None:
        """Delete one message; when it was the version shown, the newest remaining version is shown instead."""
        message = self.message(message_id)
        siblings = [m for m in self.versions(message_id) if m.id != message_id]
        with self._write() as db:
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            if siblings:
                first = siblings[0].id  # the oldest remaining heads the group now
                db.execute("UPDATE messages SET version_of = CASE WHEN id = ?1 THEN NULL ELSE ?1 END "
                           "WHERE id = ?2 OR version_of = ?2", (first, message.group))
                if message.active:
                    db.execute("UPDATE messages SET active = 1 WHERE id = ?", (siblings[-1].id,))

    def append(self, message_id: int, text: str) -> None:
        """Add a streamed delta, committed at once."""
        if not text:
            return
        with self._write() as db:
            cursor = db.execute("UPDATE messages SET content = content || ? WHERE id = ?", (text, message_id))
            if cursor.rowcount == 0:
                raise HistoryError(f"no message with id {message_id}")

    def finish_message(self, message_id: int, status: str = "complete", finish_reason: str | None = None,
                       prompt_tokens: int | None = None, completion_tokens: int | None = None,
                       ttft_s: float | None = None, tokens_per_s: float | None = None) -> Message:
        if status not in STATUSES or status == "streaming":
            raise HistoryError(f"a finished message's status must be one of {', '.join(STATUSES[1:])}")
        with self._write() as db:
            db.execute(
                "UPDATE messages SET status = ?, finish_reason = ?, prompt_tokens = ?, completion_tokens = ?, "
                "ttft_s = ?, tokens_per_s = ? WHERE id = ?",
                (status, finish_reason, prompt_tokens, completion_tokens, ttft_s, tokens_per_s, message_id),
            )
        return self.message(message_id)

    def message(self, message_id: int) -> Message:
        with self._lock:
            row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no message with id {message_id}")
        return _message(row)

    def delete_messages_from(self, message_id: int) -> None:
        """Drop this message and every later one in its conversation (regenerate, edit and resend)."""
        message = self.message(message_id)
        with self._write() as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                       (message.conversation_id, message_id))

    def _insert(self, conversation_id: int, role: str, content: str, model: str, status: str) -> Message:
        if role not in ROLES:
            raise HistoryError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        now = time.time()
        with self._write() as db:
            try:
                cursor = db.execute(
                    "INSERT INTO messages (conversation_id, role, content, created_at, status, model) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (conversation_id, role, content, now, status, model),
                )
            except sqlite3.IntegrityError:
                raise HistoryError(f"no conversation with id {conversation_id}") from None
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            if role == "user":  # name an untitled conversation after its first question
                db.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = ''",
                           (_title_from(content), conversation_id))
        return self.message(int(cursor.lastrowid or 0))


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


def _conversation(row: sqlite3.Row, messages: tuple[Message, ...] = ()) -> Conversation:
    return Conversation(
        id=row["id"], title=row["title"], model=row["model"], system_prompt=row["system_prompt"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        settings=json.loads(row["settings_json"] or "{}"), messages=messages,
    )


def _message(row: sqlite3.Row) -> Message:
    return Message(**{key: row[key] for key in row.keys()})  # noqa: SIM118 - sqlite3.Row has no iteration
