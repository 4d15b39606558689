"""uvicorn's HTTP/1.1 protocol (httptools) with a deadline on request headers.

uvicorn times out only the wait between two requests of a kept-alive connection. A client that opens a
connection and sends nothing, or sends its headers a byte at a time, keeps it (and a file descriptor)
for as long as it likes: issue 40 found an idle upload still open after 150 s. Here the request line and
headers must arrive whole within `header_timeout` seconds of the connection opening (or of the
request's first byte, on a kept-alive connection); past it the client gets 408 and the connection
closes. The body's own deadline is `admission.BodyDeadlineMiddleware`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_LATE = b"The request headers did not arrive in time."
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_LATE), _LATE)
)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose request headers must arrive within `header_timeout` seconds."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:  # a kept-alive connection's next request
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.write(_TIMED_OUT)
            self.transport.close()


def http_protocol(header_timeout: float) -> Callable[..., HeaderDeadlineProtocol]:
    """What uvicorn's `http=` takes: a protocol factory with this header deadline."""
    return partial(HeaderDeadlineProtocol, header_timeout=header_timeout)
