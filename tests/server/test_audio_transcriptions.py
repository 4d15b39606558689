"""/v1/audio/transcriptions with the official openai SDK against a live server and the embedded Whisper tiny.en.

The clip (tests/fixtures/audio/speech.wav, made by make_speech.sh) says "The quick brown fox
jumps over the lazy dog. Please water the garden."; tiny.en hears "jump", so only the words it
gets right are checked. No chat model is involved: the engine is the scripted fake.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.engine.server.app import create_app
from app.engine.server.launch import ServerHandle
from app.engine.server.serving_audio import MAX_AUDIO_BODY_BYTES
from app.engine.server.settings import ServerSettings
from app.engine.tasks.audio import Transcriber, Transcript, TranscriptionCancelled

from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT

SPEECH = Path(__file__).parents[1] / "fixtures" / "audio" / "speech.wav"
SPOKEN_WORDS = ["the", "quick", "brown", "fox", "over", "lazy", "dog", "please", "water", "garden"]
DURATION = 82096 / 16000  # soxi's sample count
# Below the clip's size (~160 KB): the clip only gets through on the audio route's own, larger cap.
JSON_BODY_CAP = 64 * 1024


@contextmanager
def audio_server(transcriber: Any, **settings: Any) -> Iterator[ServerHandle]:
    def factory(engine: Any, embedder: Any, server_settings: ServerSettings) -> Any:
        return create_app(engine, embedder=embedder, settings=server_settings, transcriber=transcriber)

    handle = ServerHandle(FakeEngine(), settings=ServerSettings(port=0, **settings), app_factory=factory)
    with handle:
        yield handle


@pytest.fixture(scope="module")
def whisper() -> Transcriber:
    return Transcriber(device="cpu")  # not loaded: the first request loads it


@pytest.fixture(scope="module")
def server(whisper: Transcriber) -> Iterator[ServerHandle]:
    with audio_server(whisper, max_body_bytes=JSON_BODY_CAP) as handle:
        yield handle


@pytest.fixture
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT)


def transcribe(client: openai.OpenAI, **options: Any) -> Any:
    with SPEECH.open("rb") as audio:
        return client.audio.transcriptions.create(file=audio, **{"model": "whisper-1", **options})


def heard(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def test_json_is_the_default_and_holds_the_spoken_words(client: openai.OpenAI) -> None:
    result = transcribe(client)
    assert result.text.startswith("The quick brown fox")
    assert set(SPOKEN_WORDS) <= set(heard(result.text))
    assert result.usage.type == "duration" and result.usage.seconds == 6  # whole seconds, rounded up


def test_text_srt_and_vtt_come_back_as_plain_text(client: openai.OpenAI) -> None:
    text = transcribe(client, response_format="text", language="en", prompt="The quick brown fox.")
    assert isinstance(text, str) and text.endswith("\n") and set(SPOKEN_WORDS) <= set(heard(text))
    srt = transcribe(client, response_format="srt")
    assert re.match(r"1\n00:00:00,\d{3} --> 00:00:0\d,\d{3}\nThe quick brown fox", srt)
    vtt = transcribe(client, response_format="vtt")
    assert re.match(r"WEBVTT\n\n00:00:00\.\d{3} --> 00:00:0\d\.\d{3}\nThe quick brown fox", vtt)
    raw = client.audio.transcriptions.with_raw_response.create(
        file=SPEECH.read_bytes(), model="whisper-1", response_format="vtt"
    )
    assert raw.headers["content-type"].startswith("text/plain")


def test_verbose_json_gives_monotonic_word_and_segment_timestamps(client: openai.OpenAI) -> None:
    result = transcribe(
        client, response_format="verbose_json", timestamp_granularities=["word", "segment"], temperature=0.0
    )
    assert result.language == "english" and result.duration == pytest.approx(DURATION, abs=0.01)
    assert set(SPOKEN_WORDS) <= {w.lower() for word in result.words for w in heard(word.word)}
    times = [t for word in result.words for t in (word.start, word.end)]
    assert times == sorted(times) and times[-1] <= DURATION + 0.05
    assert [segment.id for segment in result.segments] == list(range(len(result.segments)))
    assert result.segments[0].start == 0.0 and result.segments[-1].end <= DURATION + 0.05


def test_verbose_json_leaves_out_what_was_not_asked_for(client: openai.OpenAI) -> None:
    only_words = transcribe(client, response_format="verbose_json", timestamp_granularities=["word"])
    assert only_words.words and only_words.segments is None
    default = transcribe(client, response_format="verbose_json")
    assert default.segments and default.words is None


@pytest.mark.parametrize(
    ("options", "param", "words"),
    [
        ({"response_format": "mp3"}, "response_format", "json, text, srt, verbose_json, vtt"),
        (
            {"response_format": "json", "timestamp_granularities": ["word"]},
            "timestamp_granularities",
            "verbose_json",
        ),
        ({"language": "klingon"}, "language", "klingon"),
        ({"temperature": 1.5}, "temperature", "1"),
        ({"stream": True}, "stream", "not supported"),
    ],
)
def test_bad_options_are_refused_before_the_model_runs(
    client: openai.OpenAI, options: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        transcribe(client, **options)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param and words in caught.value.body["message"]


@pytest.mark.parametrize(
    ("content", "problem"), [(b"", "empty (0 bytes)"), (b"this is not audio at all " * 40, "cannot decode")]
)
def test_empty_or_undecodable_audio_is_a_400_naming_the_file(
    client: openai.OpenAI, content: bytes, problem: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(file=("meeting.mp3", content), model="whisper-1")
    message = caught.value.body["message"]
    assert message.startswith("meeting.mp3: ") and problem in message
    assert caught.value.body["param"] == "file"


def test_a_missing_file_or_unknown_model_is_refused(server: ServerHandle, client: openai.OpenAI) -> None:
    response = httpx.post(f"{server.base_url}/v1/audio/transcriptions", data={"model": "whisper-1"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "file"
    with pytest.raises(openai.NotFoundError) as caught:
        transcribe(client, model="gpt-4o-transcribe")
    assert "whisper-1" in caught.value.body["message"]


def test_audio_has_its_own_body_cap_above_the_json_one(server: ServerHandle) -> None:
    assert SPEECH.stat().st_size > JSON_BODY_CAP
    big_json = {"model": "fake-model", "prompt": "x" * JSON_BODY_CAP}
    assert httpx.post(f"{server.base_url}/v1/completions", json=big_json).status_code == 413
    # the clip itself got through in every test above; past the audio cap it is 413 too
    status, body = _post_declaring_length(server, MAX_AUDIO_BODY_BYTES + 1)
    assert status == 413 and str(MAX_AUDIO_BODY_BYTES) in body


def _post_declaring_length(server: ServerHandle, length: int) -> tuple[int, str]:
    """Only the headers: the cap is checked against Content-Length before the body is read."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=CLIENT_TIMEOUT) as sock:
        head = (
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
            f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {length}\r\n\r\n"
        )
        sock.sendall(head.encode())
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    status_line, _, rest = reply.decode().partition("\r\n")
    return int(status_line.split()[1]), rest


def test_models_lists_whisper_without_loading_it() -> None:
    fresh = Transcriber(device="cpu")
    with audio_server(fresh) as handle:
        client = openai.OpenAI(base_url=f"{handle.base_url}/v1", api_key="unused", max_retries=0)
        ids = [model.id for model in client.models.list().data]
        assert {"whisper-1", fresh.model_name} <= set(ids)
        assert client.models.retrieve("whisper-1").id == "whisper-1"
    assert not fresh.loaded


def test_a_server_without_a_transcriber_says_so() -> None:
    with audio_server(None) as handle:
        client = openai.OpenAI(base_url=f"{handle.base_url}/v1", api_key="unused", max_retries=0)
        assert "whisper-1" not in [model.id for model in client.models.list().data]
        with pytest.raises(openai.NotFoundError) as caught:
            transcribe(client)
        assert "No transcription model" in caught.value.body["message"]


class BlockingTranscriber:
    """Holds each transcription until released or cancelled, to watch the server while one runs."""

    model_name = "blocking-whisper"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()

    def transcribe(self, audio: Any, *, cancel: Any, **options: Any) -> Transcript:
        self.started.set()
        while not self.release.wait(0.01):
            if cancel():
                self.cancelled.set()
                raise TranscriptionCancelled("cancelled")
        return Transcript(text="done", language="en", duration=1.0, segments=[])


def test_the_loop_keeps_serving_while_a_transcription_runs() -> None:
    blocking = BlockingTranscriber()
    with audio_server(blocking) as handle:
        result: dict[str, Any] = {}

        def upload() -> None:
            response = httpx.post(
                f"{handle.base_url}/v1/audio/transcriptions",
                files={"file": ("a.wav", SPEECH.read_bytes())},
                data={"model": "whisper-1"},
                timeout=CLIENT_TIMEOUT,
            )
            result["body"] = response.json()

        uploader = threading.Thread(target=upload)
        uploader.start()
        assert blocking.started.wait(30)
        assert httpx.get(f"{handle.base_url}/health", timeout=CLIENT_TIMEOUT).status_code == 200
        blocking.release.set()
        uploader.join(60)
    assert result["body"] == {"text": "done", "usage": {"type": "duration", "seconds": 1}}


def test_a_client_that_hangs_up_cancels_its_transcription() -> None:
    blocking = BlockingTranscriber()
    with audio_server(blocking) as handle:
        audio = SPEECH.read_bytes()
        boundary = "paddockboundary"
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                "Content-Type: audio/wav\r\n\r\n"
            ).encode()
            + audio
            + f"\r\n--{boundary}--\r\n".encode()
        )
        head = (
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", handle.port), timeout=CLIENT_TIMEOUT) as sock:
            sock.sendall(head.encode() + body)
            assert blocking.started.wait(30)
        assert blocking.cancelled.wait(30), "the transcription kept running after the client left"
