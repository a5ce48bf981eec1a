"""Static things the server hands out: the client file and the landing page."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent


@cache
def client_source() -> str:
    return (_PKG / "client.py").read_text(encoding="utf-8")


@cache
def landing_html() -> str:
    return (_PKG / "web" / "landing.html").read_text(encoding="utf-8")
