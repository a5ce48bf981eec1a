"""An agent reads the reference as its AGENTS.md block and the skill tell it
to: the command they print, then each part's closing order, run as printed in
`sh` with curl against a real `stash serve`, each answer at most 20,000 bytes,
until the last part, which says the reference is whole."""

from __future__ import annotations

import subprocess

from tests.support.docs.printed import orders
from tests.support.server import CLI_TIMEOUT, Http

PART_BYTES = 20_000


def test_the_block_and_the_skill_lead_through_every_part(http: Http, base_url: str, has_curl: bool) -> None:
    assert has_curl, "this test runs the printed commands with curl"
    block = http.post("/init", json={"url": base_url}).json()["prompt"]
    skill = http.get("/skill").text
    first = """curl -sS -H "Accept: text/plain" "$STASH_URL/reference" -d '{"part": 1}'"""
    assert f"    {first}\n" in block and f"    {first}\n" in skill
    env = {"PATH": "/usr/bin:/bin", "STASH_URL": base_url, "STASH_TOKEN": ""}
    command, seen = first, 0
    while True:
        done = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert len(done.stdout.encode()) <= PART_BYTES
        seen += 1
        assert done.stdout.startswith(f"Part {seen} of ")
        if done.stdout.endswith("That is the whole reference.\n"):
            break
        command = orders(done.stdout)[-1]  # the order that ends the part (the reference quotes others)
    assert seen > 5 and http.get("/reference").text.count("\n## ") > 10  # and the whole stays whole
