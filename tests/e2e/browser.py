"""A headless Chromium driven over the DevTools protocol on a pipe.

Chromium's ``--remote-debugging-pipe`` reads NUL-terminated JSON commands on
fd 3 and writes answers and events on fd 4: no port, no websocket, no driver
binary, and no version of a driver library to keep in step with the browser.
One page (a flat session) is all the landing-page test needs.

Every wait is bounded: a browser that hangs fails the test, never stalls it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CALL_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def desktop_page(profile: Path, *, network: bool = True) -> Iterator[Chromium]:
    """A headless Chromium at 1280 x 900 with one page open (and the
    Network domain on, to read responses' headers), closed on the way out."""
    binary = chromium_path()
    assert binary, "this test needs Debian's chromium package: apt-get install --no-install-recommends chromium"
    browser = Chromium(binary, profile, width=1280, height=900)
    try:
        browser.open_page()
        if network:
            browser.call("Network.enable")
        yield browser
    finally:
        browser.close()


class BrowserError(RuntimeError):
    pass


@dataclass
class Console:
    """What the page said: console messages, uncaught exceptions and the
    browser's own log (failed loads, CSP refusals)."""

    messages: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    exceptions: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        return [f"{level}: {text}" for level, text in self.messages if level in ("error", "assert")] + [
            f"exception: {text}" for text in self.exceptions
        ]


class Chromium:
    def __init__(
        self, binary: str, profile: Path, width: int = 1000, height: int = 900, flags: tuple[str, ...] = ()
    ) -> None:
        to_chrome, self._to_chrome_w = os.pipe()
        self._from_chrome_r, from_chrome = os.pipe()
        # The child's ends go above 9 first, so moving them onto 3 and 4 (where
        # Chromium expects them) can never overwrite one with the other.
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome, from_chrome))
        os.close(to_chrome)
        os.close(from_chrome)
        argv = [
            "/bin/bash",
            "-c",
            f'exec "$0" "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-',
            binary,
            *FLAGS,
            *flags,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self.log = profile.parent / "chromium.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, pass_fds=(r, w), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        os.close(r)
        os.close(w)
        self._out = os.fdopen(self._to_chrome_w, "wb", buffering=0)
        self._next_id = 0
        self._answers: dict[int, dict] = {}
        self._events: list[dict] = []
        self._cond = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None
        self.base = ""  # the server the page came from, for the test's own requests
        self.console = Console()

    # ------------------------------------------------------------ protocol

    def _read(self) -> None:
        buf = b""
        with os.fdopen(self._from_chrome_r, "rb", buffering=0) as src:
            while chunk := src.read(65536):
                buf += chunk
                *messages, buf = buf.split(b"\0")
                for raw in messages:
                    self._take(json.loads(raw))
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _take(self, msg: dict) -> None:
        method = msg.get("method")
        params = msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.messages.append((params.get("type", "log"), text))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.console.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            text = f"{entry.get('text', '')} {entry.get('url', '')}"
            self.console.messages.append((entry.get("level", "info"), text))
        with self._cond:
            if "id" in msg:
                self._answers[msg["id"]] = msg
            else:
                self._events.append(msg)
            self._cond.notify_all()

    def call(
        self, method: str, params: dict | None = None, browser: bool = False, timeout: float = CALL_TIMEOUT
    ) -> dict:
        """Send one command to the page (or, with ``browser``, to the browser itself); its result."""
        with self._cond:
            self._next_id += 1
            ident = self._next_id
        msg: dict = {"id": ident, "method": method, "params": params or {}}
        if not browser and self.session:
            msg["sessionId"] = self.session
        self._out.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise BrowserError(f"no answer to {method} within {timeout} s")
                self._cond.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def wait_event(self, method: str, timeout: float = CALL_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for k, ev in enumerate(self._events):
                    if ev.get("method") == method:
                        del self._events[: k + 1]
                        return ev.get("params", {})
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise BrowserError(f"no {method} within {timeout} s")
                self._cond.wait(left)

    def seen(self, method: str) -> list[dict]:
        """The parameters of every event ``method`` received so far and not yet waited for."""
        with self._cond:
            return [ev.get("params", {}) for ev in self._events if ev.get("method") == method]

    def wait_console(self, text: str, timeout: float = CALL_TIMEOUT) -> str:
        """The first console error containing ``text``, once it has arrived."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.console.errors() if text in e]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise BrowserError(f"no console error with {text!r} within {timeout} s")
                self._cond.wait(left)

    # ------------------------------------------------------------ page

    def open_page(self) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, browser=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def goto(self, url: str) -> None:
        with self._cond:
            self._events.clear()
        answer = self.call("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"navigation to {url} failed: {answer['errorText']}")
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str):
        """The value of ``expression`` in the page (awaited if a promise)."""
        answer = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r} threw: {answer['exceptionDetails'].get('text')}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = CALL_TIMEOUT):
        """Poll until ``expression`` is truthy in the page; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression!r} still false after {timeout} s")
            time.sleep(0.05)

    def press(self, key: str, code: str, key_code: int) -> None:
        """A real key stroke, through the browser's input pipeline, to whatever has focus."""
        base = {"key": key, "code": code, "windowsVirtualKeyCode": key_code}
        self.call("Input.dispatchKeyEvent", {"type": "rawKeyDown", **base})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def enter(self) -> None:
        """The Enter key as a keyboard sends it, with its text, so that it activates a focused button or
        submits the form of a focused field (a raw key-down alone does neither)."""
        base = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **base})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def type_text(self, text: str) -> None:
        """Text typed into whatever has focus, as an input method would commit it."""
        self.call("Input.insertText", {"text": text})

    def click(self, x: float, y: float) -> None:
        """A real left click at page coordinates (CSS pixels of the viewport)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", browser=True, timeout=STOP_TIMEOUT)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)
        try:
            self._out.close()
        except OSError:
            pass
        self._reader.join(timeout=STOP_TIMEOUT)
