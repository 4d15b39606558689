"""Issue 24's admission limits at the socket: a body over its cap is refused before it is read whole,
and the base URL answers probes without the API key, as /health does (vLLM and llama.cpp leave both
open; they tell only the server's name, version and model)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx

from app.engine.tasks.audio import Transcriber
from tests.engine.test_audio_limits import MALFORMED_AUDIO

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT
from .test_audio_transcriptions import SPEECH, BlockingTranscriber, audio_server

CAP = 64 * 1024


def refusal_for_partial_body(port: int, declared: int | None, sent: int) -> bytes:
    """Send the head of a POST and `sent` body bytes out of `declared` (None: chunked, never ended),
    then read what the server answers while the rest of the body is still owed."""
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
        length = f"Content-Length: {declared}" if declared is not None else "Transfer-Encoding: chunked"
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\n{length}\r\n\r\n"
        )
        sock.sendall(head.encode())
        if sent:
            body = b"[" * sent
            sock.sendall(body if declared is not None else f"{sent:x}\r\n".encode() + body + b"\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply


def test_a_declared_length_over_the_cap_is_refused_before_any_body_byte(engine):
    with running_server(engine, max_body_bytes=CAP) as server:
        reply = refusal_for_partial_body(server.port, declared=30 * 1024 * 1024, sent=0)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_a_chunked_body_is_refused_once_it_passes_the_cap_not_when_it_ends(engine):
    """The body never ends (no final chunk): the 413 can only come from counting as it arrives."""
    with running_server(engine, max_body_bytes=CAP) as server:
        reply = refusal_for_partial_body(server.port, declared=None, sent=2 * CAP)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert httpx.get(f"{server.base_url}/health", timeout=CLIENT_TIMEOUT).status_code == 200


def test_the_base_url_answers_get_and_head_without_the_key(engine, model_name):
    with running_server(engine, api_key="sekrit") as server, httpx.Client(base_url=server.base_url) as http:
        for method in ("GET", "HEAD"):
            assert http.request(method, "/").status_code == 200, method
        assert http.get("/").json()["model"] == model_name
        # only reading is open: another method on the root, and the API behind it, keep the key
        assert http.post("/", json={}).status_code == 401
        assert http.get("/v1/models").status_code == 401
        assert http.get("/v1/models", headers={"x-api-key": "sekrit"}).status_code == 200


# ---- audio: its own limits, each refused before Whisper runs ---------------------------------------


def upload(handle: Any, audio: bytes) -> httpx.Response:
    return httpx.post(
        f"{handle.base_url}/v1/audio/transcriptions",
        files={"file": ("a.wav", audio)},
        data={"model": "whisper-1"},
        timeout=CLIENT_TIMEOUT,
    )


def test_uploads_past_the_concurrent_limit_get_429_and_the_next_one_after_is_served():
    blocking = BlockingTranscriber()
    with audio_server(blocking, max_concurrent_uploads=1, retry_after_seconds=3) as handle:
        first: dict[str, httpx.Response] = {}
        holder = threading.Thread(target=lambda: first.setdefault("reply", upload(handle, SPEECH.read_bytes())))
        holder.start()
        assert blocking.started.wait(30)
        refused = upload(handle, SPEECH.read_bytes())
        assert refused.status_code == 429 and refused.headers["retry-after"] == "3", refused.text
        assert "limit is 1" in refused.json()["error"]["message"]
        blocking.release.set()
        holder.join(60)
        assert first["reply"].status_code == 200
        assert upload(handle, SPEECH.read_bytes()).status_code == 200  # the slot is free again


def test_audio_longer_than_the_limit_is_a_400_naming_it_before_whisper_loads():
    whisper = Transcriber(device="cpu")
    with audio_server(whisper, max_audio_seconds=2) as handle:
        refused = upload(handle, SPEECH.read_bytes())  # 5.1 s of speech
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "file" and "longer than the 2 s allowed" in error["message"]
    assert not whisper.loaded


def test_every_malformed_audio_file_is_a_400_naming_its_problem_never_a_500():
    """Issue 40: a 2 KB WAV declaring 2,147,483,647 Hz made PyAV raise a MemoryError subclass: a 500."""
    whisper = Transcriber(device="cpu")
    with audio_server(whisper) as handle:
        for name, data, words in MALFORMED_AUDIO:
            refused = upload(handle, data)
            assert refused.status_code == 400, (name, refused.text)
            error = refused.json()["error"]
            assert error["param"] == "file" and error["code"] == "invalid_audio", (name, error)
            assert error["message"].startswith("a.wav: ") and words in error["message"], (name, error)
    assert not whisper.loaded  # every one was refused while decoding, before the model
