"""``stash grants`` mints with a label and an expiry, and lists both with the
day each capability was last used."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support.server import Cli, Http


@pytest.mark.slow
def test_grants_mint_with_label_and_expiry_and_list_them(cli: Cli, http: Http, token: str) -> None:
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = cli.ok("grants", "read", "--label", "phone → backup", "--expires", until)
    new_token = out.splitlines()[-1]
    assert http.get("/wake", new_token).status_code == 200
    listing = cli.ok("grants").splitlines()
    row = next(line for line in listing if line.startswith("#2 "))
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert (
        row == f'#2  read  "phone → backup"  created {row.split("created ")[1].split()[0]}  expires {until}  '
        f"last used {today}  live"
    )
    bad = cli.run("grants", "read", "--expires", "yesterday")
    assert bad.returncode == 1 and "RFC 3339" in bad.stderr
