"""Fair shares (issue 11, item 2): the slot accounting of stash.web.fairshare,
alone. tests/e2e/test_fair_shares.py floods a real server."""

from __future__ import annotations

import contextlib

import pytest

from stash.core.errors import TooMany
from stash.web.fairshare import Shares


def refused(shares: Shares, user: str, slow: bool = False) -> TooMany:
    with pytest.raises(TooMany) as info:
        with shares.hold(user, slow):
            pass
    assert info.value.status == 429 and info.value.retry_after >= 1
    return info.value


def test_a_user_holds_at_most_its_slots_and_gets_them_back() -> None:
    shares = Shares(per_user=3, slow_per_user=1, slow_slots=2)
    with contextlib.ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(shares.hold("a"))
        err = refused(shares, "a")
        assert err.code == "busy.user" and "3 requests in progress" in err.message
        with shares.hold("b"):  # another user is not affected
            pass
    for _ in range(3):  # every slot came back
        with shares.hold("a"):
            pass
    assert shares._busy == {} and shares._slow == {} and shares._slow_total == 0


def test_slow_work_is_one_per_user_and_bounded_per_process() -> None:
    shares = Shares(per_user=4, slow_per_user=1, slow_slots=2)
    with shares.hold("a", slow=True):
        assert refused(shares, "a", slow=True).code == "busy.slow"
        with shares.hold("a"):  # a's fast requests still run
            pass
        with shares.hold("b", slow=True):
            assert refused(shares, "c", slow=True).code == "busy.server"
            with shares.hold("c"):  # and so do everyone's fast ones
                pass
    with shares.hold("c", slow=True):
        pass


def test_a_failing_request_gives_its_slot_back() -> None:
    shares = Shares(per_user=1, slow_per_user=1, slow_slots=1)
    with pytest.raises(ValueError):
        with shares.hold("a", slow=True):
            raise ValueError("the route failed")
    with shares.hold("a", slow=True):
        pass
