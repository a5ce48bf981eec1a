"""uvicorn's HTTP protocol with a header timeout.

uvicorn closes a keep-alive connection idle between requests after
``timeout_keep_alive`` (``stash serve --idle-timeout``), but waits for ever
for the first bytes of a connection and for the rest of a request's head: a
client that opens connections and sends nothing, or sends its headers a byte
at a time, would hold them without end. Here every request's head — from the
connection's opening, or from its first byte on a kept-alive connection, to
the blank line that ends its headers — must arrive within the header timeout
(``--header-timeout``, default 10 s), else the connection is closed without
an answer.
"""

from __future__ import annotations

import asyncio
import functools

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .settings import Settings, from_env


@functools.cache
def header_timeout() -> float:
    """This worker's header timeout, from the settings its parent passed on."""
    try:
        return float(from_env().header_timeout)
    except (KeyError, ValueError, TypeError):
        return float(Settings.header_timeout)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    _head_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(header_timeout(), self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
