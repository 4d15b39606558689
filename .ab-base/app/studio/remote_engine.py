"""A remote engine: any OpenAI-compatible server (vLLM, SGLang, another Paddock) in place of the local one.

When one GPU is not enough, the Studio's Chat, Documents and Transcribe panes can talk to a
serving cluster instead (Settings → Remote engine, or `paddock studio --engine URL`). The
protocol is the OpenAI one every such server speaks:

- chat: `POST /v1/chat/completions` streamed (server-sent events, usage in the last chunk);
- documents: `POST /v1/embeddings` for the document set, the answer as a chat;
- transcription: `POST /v1/audio/transcriptions` with word timestamps (verbose_json).

The prompt is built by the server from the messages (its own chat template), so nothing here
tokenizes; the server checks the context and its error comes back in words. `RemoteEngine.model`
describes the server for the status bar ("remote: host:port"), as a local engine's does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np

from app.engine import ModelInfo
from app.engine.tasks.audio import Segment, Transcript, Word

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 300.0  # a long answer on a busy cluster
EMBEDDING_HINTS = ("embed", "minilm", "bge", "e5-", "gte", "nomic")  # how embedding models are named
SPEECH_HINTS = ("whisper", "transcri")
EMBED_WINDOW = 256  # tokens per excerpt when the server does not say (all-MiniLM-L6-v2's window)
BYTES_PER_TOKEN = 3  # a conservative count for chunking: real tokenizers average about 4 bytes of English


class RemoteEngineError(Exception):
    """The remote engine cannot do what was asked; the message is meant for the user."""


@dataclass(frozen=True)
class RemoteOutput:
    """One streamed piece of an answer, with the fields ChatService reads from the local engine's outputs."""

    new_text: str
    num_prompt_tokens: int | None
    num_output_tokens: int
    finish_reason: str | None


def with_v1(base_url: str) -> str:
    """"http://host:8080" -> "http://host:8080/v1"; a URL with a path is kept as it is."""
    url = base_url.strip().rstrip("/")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise RemoteEngineError(f"{base_url!r} is not an http(s) URL of an OpenAI-compatible server")
    return url + "/v1" if parsed.path in ("", "/") else url


class RemoteEngine:
    """The server at `base_url`; `connect()` reads its model list (call it off the UI thread)."""

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None) -> None:
        self.base_url = with_v1(base_url)
        self.host = urlparse(self.base_url).netloc
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._wanted = model or None
        self.model_ids: list[str] = []
        self.model = ModelInfo(name=model or "?", path=self.base_url, architecture="remote", quantization="",
                               parameters=0, context_length=0, device=f"remote: {self.host}")

    # -- connecting ---------------------------------------------------------------------------------
    def connect(self) -> RemoteEngine:
        """List the server's models and pick the chat model (the one asked for, else the first listed)."""
        data = self._get_json("/models").get("data") or []
        cards = {str(c["id"]): c for c in data if isinstance(c, dict) and c.get("id")}
        self.model_ids = list(cards)
        chat = [i for i in cards if not _named_like(i, EMBEDDING_HINTS + SPEECH_HINTS)]
        if self._wanted is not None and self._wanted not in cards:
            raise RemoteEngineError(f"{self.host} does not serve {self._wanted!r}; it serves "
                                    f"{', '.join(cards) or 'no models'}")
        name = self._wanted or (chat[0] if chat else None)
        if name is None:
            raise RemoteEngineError(f"{self.host} serves no chat model ({', '.join(cards) or 'its list is empty'})")
        card = cards[name]
        context = next((int(card[k]) for k in ("max_model_len", "context_length", "context_window")
                        if isinstance(card.get(k), int)), 0)
        self.model = ModelInfo(name=name, path=self.base_url, architecture="remote", quantization="",
                               parameters=0, context_length=context, device=f"remote: {self.host}")
        return self

    def model_for(self, hints: tuple[str, ...]) -> str | None:
        """The served model whose name says it does this job (embeddings, speech), if any."""
        return next((i for i in self.model_ids if _named_like(i, hints)), None)

    # -- chat ---------------------------------------------------------------------------------------
    async def stream_chat(self, messages: list[dict[str, Any]], max_tokens: int, temperature: float,
                          top_p: float = 1.0, seed: int | None = None) -> AsyncIterator[RemoteOutput]:
        """The answer to `messages`, streamed; errors from the server become RemoteEngineError in words."""
        body: dict[str, Any] = {"model": self.model.name, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
                                "temperature": temperature, "top_p": top_p}
        if seed is not None:
            body["seed"] = seed
        timeout = httpx.Timeout(ANSWER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        prompt_tokens, output_tokens, finish = None, 0, None
        try:
            async with (httpx.AsyncClient(timeout=timeout) as http,
                        http.stream("POST", self.base_url + "/chat/completions", json=body,
                                    headers=self._headers) as response):
                if response.status_code >= 400:
                    raise RemoteEngineError(self._http_error(response.status_code, await response.aread()))
                async for chunk in sse_chunks(response, f"the remote engine at {self.host}"):
                    text = "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or ())
                    finish = next((c["finish_reason"] for c in chunk.get("choices") or ()
                                   if c.get("finish_reason")), finish)
                    usage = chunk.get("usage") or {}
                    prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                    output_tokens = usage.get("completion_tokens", output_tokens + (1 if text else 0))
                    if text or usage or finish:
                        yield RemoteOutput(text, prompt_tokens, output_tokens, finish)
        except httpx.HTTPError as exc:
            raise RemoteEngineError(f"the remote engine at {self.host} did not answer: "
                                    f"{exc or type(exc).__name__}") from exc

    # -- the other jobs -----------------------------------------------------------------------------
    def embedder(self) -> RemoteEmbedder:
        name = self.model_for(EMBEDDING_HINTS)
        if name is None:
            raise RemoteEngineError(f"{self.host} serves no embedding model, which Documents needs "
                                    f"(it serves {', '.join(self.model_ids) or 'nothing'})")
        return RemoteEmbedder(self, name)

    def transcriber(self) -> RemoteTranscriber:
        return RemoteTranscriber(self, self.model_for(SPEECH_HINTS) or "whisper-1")

    def post_json(self, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = httpx.post(self.base_url + path, headers=self._headers,
                                  timeout=httpx.Timeout(ANSWER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteEngineError(f"the remote engine at {self.host} did not answer: {exc}") from exc
        return self._json(response)

    def _get_json(self, path: str) -> dict[str, Any]:
        try:
            response = httpx.get(self.base_url + path, headers=self._headers, timeout=CONNECT_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise RemoteEngineError(f"cannot reach the remote engine at {self.host}: "
                                    f"{exc or type(exc).__name__}") from exc
        return self._json(response)

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            raise RemoteEngineError(self._http_error(response.status_code, response.content))
        try:
            data = response.json()
        except ValueError:
            raise RemoteEngineError(f"{self.host} answered with something that is not JSON") from None
        if not isinstance(data, dict):
            raise RemoteEngineError(f"{self.host} answered with {type(data).__name__}, not a JSON object")
        return data

    def _http_error(self, status: int, body: bytes) -> str:
        try:
            detail = error_message(json.loads(body))
        except ValueError:
            detail = body.decode("utf-8", errors="replace").strip()[:200]
        if status in (401, 403):
            return f"the remote engine at {self.host} refused the API key (HTTP {status}): {detail}"
        return f"the remote engine at {self.host} answered HTTP {status}: {detail}"

    # -- what the Studio asks of any engine -----------------------------------------------------------
    def stats(self) -> None:
        return None  # the remote's memory is not this machine's

    async def abort(self, request_id: str) -> None:
        return None  # closing the stream ends the request on the server

    async def shutdown(self) -> None:
        return None

    def close(self) -> None:
        return None


class RemoteEmbedder:
    """The remote's embedding model as the document set's `Embedder` (tokens counted conservatively)."""

    def __init__(self, remote: RemoteEngine, model_name: str) -> None:
        self.remote, self.model_name = remote, model_name
        self.max_tokens = EMBED_WINDOW
        self.dimensions = int(self.embed(["dimensions"]).shape[1])

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(text.encode("utf-8")) // BYTES_PER_TOKEN + 1 for text in texts]

    def embed(self, texts: list[str]) -> np.ndarray:
        data = self.remote.post_json("/embeddings", json={"model": self.model_name, "input": list(texts)})
        rows = sorted(data.get("data") or [], key=lambda row: row.get("index", 0))
        if len(rows) != len(texts):
            raise RemoteEngineError(f"{self.remote.host} returned {len(rows)} embeddings for {len(texts)} texts")
        vectors = np.asarray([row["embedding"] for row in rows], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1.0)  # unit rows, as the Embedder contract promises


class RemoteTranscriber:
    """The remote's speech model as the Transcribe pane's transcriber (word timestamps from verbose_json)."""

    def __init__(self, remote: RemoteEngine, model_name: str) -> None:
        self.remote, self.model_name = remote, model_name

    def transcribe(self, path: str | Path, language: str | None = None, prompt: str | None = None,
                   word_timestamps: bool = True, progress: Any = None, cancel: Any = None) -> Transcript:
        fields: dict[str, Any] = {"model": self.model_name, "response_format": "verbose_json",
                                  "timestamp_granularities[]": ["segment", "word"] if word_timestamps else ["segment"]}
        fields |= {k: v for k, v in (("language", language), ("prompt", prompt)) if v}
        path = Path(path)
        with open(path, "rb") as audio:
            data = self.remote.post_json("/audio/transcriptions", data=fields,
                                         files={"file": (path.name, audio, "application/octet-stream")})
        if progress is not None:
            progress(1.0)
        return _transcript(data)


def _transcript(data: dict[str, Any]) -> Transcript:
    words = [Word(float(w["start"]), float(w["end"]), str(w["word"]).strip(), float(w.get("probability", 1.0)))
             for w in data.get("words") or ()]
    segments = []
    for n, s in enumerate(data.get("segments") or ()):
        start, end = float(s["start"]), float(s["end"])
        inside = [w for w in words if start <= w.start < end]
        segments.append(Segment(int(s.get("id", n)), start, end, str(s.get("text", "")), inside))
    return Transcript(str(data.get("text", "")), str(data.get("language") or ""), float(data.get("duration") or 0.0),
                      segments)


async def sse_chunks(response: httpx.Response, where: str,
                     error: type[Exception] = RemoteEngineError) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI server-sent event stream, up to [DONE]; a chunk that is not JSON or an
    error event raises `error` with a sentence naming `where` (the Compare pane shares this)."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise error(f"{where} sent something that is not JSON: {data[:80]!r}") from None
        if isinstance(chunk, dict) and chunk.get("error"):
            raise error(f"{where} reported an error: {error_message(chunk)}")
        yield chunk


def error_message(payload: Any) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), or the payload as text."""
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    return str(error.get("message") or error) if isinstance(error, dict) else str(error)


def _named_like(model_id: str, hints: tuple[str, ...]) -> bool:
    return any(hint in model_id.lower() for hint in hints)
