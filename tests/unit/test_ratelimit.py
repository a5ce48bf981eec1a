"""The per-client limiter: windows slide, IPv6 clients count per /64, and a
flood of addresses does not grow its memory without bound."""

from __future__ import annotations

from stash.web import ratelimit
from stash.web.ratelimit import RateLimiter, client_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_window_slides():
    clock = Clock()
    rl = RateLimiter(clock)
    for _ in range(3):
        rl.hit("auth", "192.0.2.1")
    assert rl.blocked_for("auth", "192.0.2.1", 3) == 60
    assert rl.blocked_for("auth", "192.0.2.2", 3) == 0
    assert rl.blocked_for("init", "192.0.2.1", 3) == 0
    clock.now += 59.5
    assert rl.blocked_for("auth", "192.0.2.1", 3) == 1
    clock.now += 0.5
    assert rl.blocked_for("auth", "192.0.2.1", 3) == 0


def test_ipv6_clients_count_per_64():
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_key("192.0.2.7") == "192.0.2.7"
    assert client_key("testclient") == "testclient"
    rl = RateLimiter(Clock())
    for k in range(5):
        rl.hit("auth", f"2001:db8:1:2::{k + 1:x}")
    assert rl.blocked_for("auth", "2001:db8:1:2::99", 5) > 0


def test_idle_clients_are_swept(monkeypatch):
    monkeypatch.setattr(ratelimit, "SWEEP_ABOVE", 100)
    clock = Clock()
    rl = RateLimiter(clock)
    for k in range(500):
        rl.hit("auth", f"198.51.100.{k % 250}-{k}")
    assert len(rl._hits) == 500
    clock.now += 61
    rl.hit("auth", "203.0.113.1")
    assert len(rl._hits) == 1
