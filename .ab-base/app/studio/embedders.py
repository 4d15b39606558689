"""The Studio's embedding model: loaded where it is first needed, then shared.

The Documents pane (and documents dropped on the Chat) load the embedding model on first use;
the local API serves `/v1/embeddings` with the same model once it is loaded (`ServerControl.
follow_embedder` restarts a running API to take it on). Nothing loads it just for the API:
a Studio that never reads a document never pays for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.studio.retrieval import Embedder

EmbedderSource = Callable[[], Embedder]
log = logging.getLogger(__name__)


def default_embedder() -> Embedder:
    """The shipped all-MiniLM-L6-v2 (the engine keeps one copy per process)."""
    from app.engine.embeddings import load_default_embedder

    return load_default_embedder()


class EmbedderHost:
    """One embedding model, loaded once on first `get()`; listeners hear when it is loaded, on that thread."""

    def __init__(self, source: EmbedderSource = default_embedder) -> None:
        self._source = source
        self._embedder: Embedder | None = None
        self._lock = threading.Lock()  # two first uses on two threads load the model once
        self._listeners: list[Callable[[Embedder], None]] = []

    @property
    def loaded(self) -> Embedder | None:
        """The model if something has loaded it, else None (never loads)."""
        return self._embedder

    def get(self) -> Embedder:
        """The model, loaded now if nothing has loaded it yet."""
        with self._lock:
            if self._embedder is not None:
                return self._embedder
            embedder = self._embedder = self._source()
        for listener in list(self._listeners):
            try:
                listener(embedder)
            except Exception:  # the API failing to take it on must not fail the documents that loaded it
                log.exception("a listener of the embedding model failed")
        return embedder

    def subscribe(self, listener: Callable[[Embedder], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)
