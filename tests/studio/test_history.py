"""Conversation history: saved as it streams, kept across reopen, migrated by version."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from app.studio.history import MIGRATIONS, SCHEMA_VERSION, History, HistoryError


def test_conversation_survives_reopen(tmp_path):
    path = tmp_path / "history.sqlite3"
    with History(path) as history:
        chat = history.create_conversation(model="gemma", system_prompt="Be brief.", settings={"temperature": 0.2})
        history.add_message(chat.id, "user", "What is the capital of France?")
        answer = history.start_message(chat.id, model="gemma")
        for delta in ["Par", "is", "."]:
            history.append(answer.id, delta)
        history.finish_message(answer.id, finish_reason="stop", prompt_tokens=12, completion_tokens=3,
                               ttft_s=0.05, tokens_per_s=40.0)

    with History(path) as history:
        [listed] = history.conversations()
        assert listed.title == "What is the capital of France?"
        loaded = history.conversation(listed.id)
        assert loaded.system_prompt == "Be brief." and loaded.settings == {"temperature": 0.2}
        assert [(m.role, m.content, m.status) for m in loaded.messages] == [
            ("user", "What is the capital of France?", "complete"),
            ("assistant", "Paris.", "complete"),
        ]
        stats = loaded.messages[1]
        assert (stats.prompt_tokens, stats.completion_tokens, stats.finish_reason) == (12, 3, "stop")


def test_a_crash_mid_stream_keeps_every_delta_already_shown(tmp_path):
    path = tmp_path / "history.sqlite3"
    script = textwrap.dedent(f"""
        import os
        from app.studio.history import History
        h = History({str(path)!r})
        c = h.create_conversation()
        h.add_message(c.id, "user", "Count to three")
        m = h.start_message(c.id)
        h.append(m.id, "one, ")
        h.append(m.id, "two, ")
        os._exit(1)  # die without closing anything
    """)
    subprocess.run([sys.executable, "-c", script], check=False)
    with History(path) as history:
        [chat] = history.conversations()
        answer = history.conversation(chat.id).messages[-1]
        assert answer.content == "one, two, "
        assert answer.status == "interrupted"


def test_regenerate_drops_the_answer_and_what_follows(tmp_path):
    with History(tmp_path / "h.sqlite3") as history:
        chat = history.create_conversation(title="kept title")
        question = history.add_message(chat.id, "user", "hi")
        first = history.add_message(chat.id, "assistant", "hello")
        history.add_message(chat.id, "user", "again")
        history.delete_messages_from(first.id)
        loaded = history.conversation(chat.id)
        assert [m.id for m in loaded.messages] == [question.id]
        assert loaded.title == "kept title"  # a set title is not replaced by the first question


def test_search_rename_delete(tmp_path):
    with History(tmp_path / "h.sqlite3") as history:
        a = history.create_conversation()
        history.add_message(a.id, "user", "tell me about penguins")
        b = history.create_conversation(title="Rust lifetimes")
        assert [c.id for c in history.conversations(search="penguin")] == [a.id]
        assert [c.id for c in history.conversations(search="rust")] == [b.id]
        history.update_conversation(a.id, title="Birds")
        assert history.conversation(a.id).title == "Birds"
        history.delete_conversation(a.id)
        assert [c.id for c in history.conversations()] == [b.id]


def test_bad_input_is_a_clear_error(tmp_path):
    with History(tmp_path / "h.sqlite3") as history:
        with pytest.raises(HistoryError, match="no conversation"):
            history.add_message(999, "user", "hi")
        chat = history.create_conversation()
        with pytest.raises(HistoryError, match="role must be"):
            history.add_message(chat.id, "robot", "hi")


def test_old_schema_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
    db.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (1, 'user', 'hi', 1)")
    db.commit()
    db.close()
    with History(path) as history:
        assert history.schema_version == SCHEMA_VERSION
        [message] = history.conversation(1).messages
        assert (message.content, message.status) == ("hi", "complete")


def test_newer_schema_is_refused_untouched(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match="newer Paddock Studio"):
        History(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    db.close()


def test_answer_versions_are_kept_one_shown_and_deleting_one_shows_another(tmp_path):
    from app.studio.history import History

    with History(tmp_path / "h.sqlite3") as history:
        conversation = history.create_conversation()
        history.add_message(conversation.id, "user", "q")
        first = history.add_message(conversation.id, "assistant", "a1")
        second = history.start_message(conversation.id, replacing=first.id)
        history.append(second.id, "a2")
        third = history.start_message(conversation.id, replacing=second.id)
        assert [m.content for m in history.conversation(conversation.id).messages] == ["q", ""]
        assert [v.id for v in history.versions(first.id)] == [first.id, second.id, third.id]
        history.show_version(second.id)
        assert [m.content for m in history.conversation(conversation.id).messages] == ["q", "a2"]
        history.delete_message(second.id)  # the shown one: the newest remaining is shown instead
        assert [m.id for m in history.conversation(conversation.id).messages][1] == third.id
        history.delete_message(first.id)  # the group's head: the rest stay one group
        assert [v.id for v in history.versions(third.id)] == [third.id]
