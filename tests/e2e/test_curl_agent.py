"""An agent with only curl and a shell lives on what the server prints, in
text mode (``Accept: text/plain``): it mints a memory, wakes, notes lines
with apostrophes and quotes, imports and takes the batches offered, has a
memory erased and answers what that makes due, recalls, zooms, and hands a
read grant to a second agent. Every command it runs is one the server
printed — a ``Run:`` order of an answer, or a command of the /init block or
the served skill — with only its placeholders replaced, by plain string
replacement; the two owner actions no answer hands over (erase, mint a
grant) are the reference's own examples. Nothing it runs touches its
folder, and no answer it reads needs a JSON decoder."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from tests.support.docs.commands import indented_commands
from tests.support.docs.printed import answer_naps, orders, run_printed
from tests.support.server import Http

NOTES = [
    "Priya's review is due Friday",
    "don't use the v2 API; it's deprecated",
    'she said "ship it"',
    "the build box is C:\\ci\\runner\\",
    "100% of %s and !! stay as typed",
]


class Agent:
    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.ran = 0

    def run(self, command: str, **fill: str) -> str:
        out = run_printed(command, self.env, self.cwd, **fill)
        assert list(self.cwd.iterdir()) == []
        self.ran += 1
        return out

    def naps(self, answer: str) -> str:
        """Answer every nap an answer hands over, taking the batch whenever
        one is offered; return the last answer."""

        def whole(answer: str) -> None:
            # After an erasure this needs the batch to fill its holes (issue 18: h18a's fix).
            assert "nothing was written" not in answer.split("\n", 1)[0], answer

        return answer_naps(answer, self.run, "one summary, it's done", whole)


def test_a_curl_agent_lives_on_what_the_server_prints(base_url: str, http: Http, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "STASH_URL": base_url}
    person = Agent(dict(base), cwd)

    # init, in text: the export line and the block, nothing to decode.
    minted = person.run('curl -sS -H "Accept: text/plain" "$STASH_URL/init" -d \'{}\'')
    export = next(line for line in minted.splitlines() if line.startswith("export STASH_TOKEN="))
    token = person.run(f'{export}\nprintf %s "$STASH_TOKEN"')
    block = minted[minted.index("## Memory") :]
    agent = Agent({**base, "STASH_TOKEN": token}, cwd)
    commands = indented_commands(block)
    wake = next(c for c in commands if c.endswith('"$STASH_URL/wake"'))
    note = next(c for c in commands if '"$STASH_URL/note"' in c)
    recall = next(c for c in commands if '"$STASH_URL/recall"' in c)
    zoom = next(c for c in commands if '"$STASH_URL/zoom"' in c)
    skill = agent.run(next(c for c in commands if c.endswith('"$STASH_URL/skill"')))
    importing = next(c for c in indented_commands(skill) if c.startswith("curl ") and '"$STASH_URL/import"' in c)

    # An empty memory hands over the note that records the first one; then notes with apostrophes.
    first = agent.run(wake)
    assert first.splitlines()[:2] == ["No memories yet; the order below records the first one.", "You are awake."]
    assert agent.run(orders(first)[0], **{"<one line>": NOTES[0]}) == "Saved as #0.\n"
    for text in NOTES[1:]:
        agent.naps(agent.run(note, **{"<one line>": text}))

    # A batch after an import: the import hands over the nap, whose prompt offers the batch.
    today = dt.datetime.now(dt.UTC).date().isoformat()
    lines = "\n".join(f'{today} imported fact {k}: it\'s "kept" as typed' for k in range(40))
    imported = agent.run(importing, **{"YYYY-MM-DD <one line>": lines})
    assert imported.startswith("Imported 40 notes, #5 to #44.")
    assert agent.naps(imported).endswith("Nothing left to compress.\n")

    # The owner sets a small wake (the reference's example of POST /config), so it shows summaries.
    person.run(f'curl -sS -H "Authorization: Bearer {token}" "$STASH_URL/config" -d \'{{"WAKE_LINES": 8}}\'')

    # The owner erases a memory; the wake then hands over what that made due, as a batch.
    erased = person.run(
        f'curl -sS -H "Authorization: Bearer {token}" -H "Accept: text/plain" "$STASH_URL/erase" -d \'{{"ids": [7]}}\''
    )
    assert "erased: [7]" in erased
    woke = agent.run(wake)
    settled = agent.naps(woke)
    assert "nothing was written" not in settled, settled  # the erasure's holes were filled
    woke = agent.run(wake)
    assert "You are awake." in woke and not orders(woke)
    wake_lines = [line for line in woke.splitlines() if line.startswith("#")]
    assert len(wake_lines) == 8 and wake_lines[-1] == f'#44 {today} imported fact 39: it\'s "kept" as typed'

    # recall, word for word, with an apostrophe in the regex; zoom into a line of the wake.
    found = agent.run(recall, **{"<regex>": "priya's|don't"})
    assert found.splitlines()[-1] == "2 matches."
    assert [line.split(" ", 2)[2] for line in found.splitlines()[:2]] == NOTES[:2]
    summary = next(line for line in wake_lines if re.match(r"#\d+-\d+ ", line))
    opened = agent.run(zoom, **{"<lo-hi>": summary.split()[0][1:]})
    assert len(opened.splitlines()) == 2

    # A read grant, handed to a second agent: it wakes to the same lines and cannot write.
    granted = person.run(
        f'curl -sS -H "Authorization: Bearer {token}" -H "Accept: text/plain" '
        '"$STASH_URL/grants" -d \'{"scope": "read"}\''
    )
    reader_token = next(line.split(": ", 1)[1] for line in granted.splitlines() if line.startswith("token: "))
    reader = Agent({**base, "STASH_TOKEN": reader_token}, cwd)
    read_wake = reader.run(wake).splitlines()
    assert [line for line in read_wake if line.startswith("#")] == [
        line for line in woke.splitlines() if line.startswith("#")
    ]
    # Its wake says what it is: read-only, what to do instead of noting, then awake.
    assert read_wake[-2].startswith("This capability is read-only") and read_wake[-1] == "You are awake."
    refused = reader.run(note, **{"<one line>": "a reader's note"})
    assert "scope" in refused.lower() and http.ok("GET", "/wake", token)["T"] == 45
    assert agent.ran > 10
