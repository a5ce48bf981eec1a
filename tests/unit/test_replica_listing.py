"""Reading ``litestream ltx -json``'s listing of a file's transactions,
whatever Litestream logs on the same stream before it."""

from __future__ import annotations

import datetime as dt
import json

from stash.service.ops.replica import listed_moments

WHEN = [dt.datetime(2026, 12, 2, 1, 26, 45, tzinfo=dt.UTC), dt.datetime(2026, 12, 2, 1, 26, 47, tzinfo=dt.UTC)]
ROWS = [
    {
        "level": 0,
        "min_txid": f"{n:016x}",
        "max_txid": f"{n:016x}",
        "size": 191,
        "timestamp": w.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    for n, w in enumerate(WHEN, 1)
]
# What Litestream 0.5 prints first on stdout for an SFTP replica whose host key is not pinned.
SFTP_WARNING = 'time=2026-12-02T01:27:27.935Z level=WARN msg="sftp host key not verified" host=127.0.0.1:33233\n'


def test_a_plain_listing_reads():
    assert listed_moments(json.dumps(ROWS, indent=2)) == WHEN


def test_a_warning_before_the_listing_is_skipped():
    assert listed_moments(SFTP_WARNING + json.dumps(ROWS, indent=2) + "\n") == WHEN


def test_a_warning_after_the_listing_is_ignored():
    assert listed_moments(json.dumps(ROWS, indent=2) + "\n" + SFTP_WARNING) == WHEN


def test_no_listing_is_no_moments():
    assert listed_moments(SFTP_WARNING) == []
    assert listed_moments("") == []
    assert listed_moments('[\n  {"level": 0}\n]\n') == []  # rows without a timestamp
    assert listed_moments("[ not json\n") == []
