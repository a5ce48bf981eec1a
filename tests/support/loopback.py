"""httpx for the servers the tests start on 127.0.0.1, over plain HTTP.

httpx builds a TLS context for every client it makes, loading the CA bundle:
about 30 ms of CPU each, paid even by a client that never speaks TLS, and by
every ``httpx.get``. The suite makes thousands (one per server start, per
:class:`~tests.support.server.Http`, per one-shot request), so here they share
one context. Each call still makes its own client, and so opens its own
connections, as ``httpx.get`` does: a test that needs new connections gets them.

No proxy from the environment applies (``trust_env=False``): a request to a
server of the test goes to it straight."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def client(**kw: Any) -> httpx.Client:
    """``httpx.Client(**kw)``, with the shared TLS context and no proxy."""
    return httpx.Client(**{"verify": _tls(), "trust_env": False, **kw})


def request(method: str, url: str, *, timeout: float = 5.0, **kw: Any) -> httpx.Response:
    """One request on a client of its own, as ``httpx.request`` makes it (and with its default timeout)."""
    with client(timeout=timeout) as c:
        return c.request(method, url, **kw)


def get(url: str, **kw: Any) -> httpx.Response:
    return request("GET", url, **kw)


def post(url: str, **kw: Any) -> httpx.Response:
    return request("POST", url, **kw)


def delete(url: str, **kw: Any) -> httpx.Response:
    return request("DELETE", url, **kw)
