"""An agent's four sessions replayed on what the server prints alone (issue
30, "Done means"): curl and a shell, in text mode, with a small part size
so every wake and every batch comes in parts. Each session wakes (every part,
following its ``Run:`` order), answers each nap it is handed (taking the
batch when offered), notes what lasts, and recalls or zooms. Every command
run is the /init block's or a printed order, with only its placeholders
replaced by plain string replacement; nothing printed is ever longer than a
part, and no answer needs a JSON decoder."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.docs.commands import indented_commands
from tests.support.docs.printed import answer_naps, orders, run_printed
from tests.support.server import Http

PART = 1_500  # PART_CHARS: small, so wakes and batches are cut into parts


class Shell:
    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd, self.ran = env, cwd, 0

    def run(self, command: str, **fill: str) -> str:
        out = run_printed(command, self.env, self.cwd, **fill)
        assert len(out.encode()) <= PART + 2_000, len(out)  # a part, and its nap prompt
        self.ran += 1
        return out

    def naps(self, answer: str) -> str:
        """Answer every nap handed over, the batch whenever one is offered."""
        return answer_naps(answer, self.run)

    def wake(self, command: str) -> list[str]:
        """Every part, in order; the lines of the wake."""
        seen: list[str] = []
        answer = self.naps(self.run(command))
        for _ in range(50):
            if "You are awake." in answer:
                return seen + [x for x in answer.splitlines() if x.startswith("#")]
            assert re.match(r"Your memory, part \d+ of \d+", answer), answer
            seen += [x for x in answer.splitlines() if x.startswith("#")]
            answer = self.naps(self.run(orders(answer)[-1]))
        raise AssertionError("the wake did not end")


def test_four_sessions_live_on_what_the_server_prints(base_url: str, http: Http, tmp_path: Path) -> None:
    minted = http.init()
    token = minted["token"]
    http.ok("POST", "/config", token, json={"PART_CHARS": PART, "WAKE_LINES": 12})  # the owner's choice
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    agent = Shell(
        {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "STASH_URL": base_url,
            "STASH_TOKEN": token,
        },
        cwd,
    )
    block = indented_commands(minted["prompt"])
    wake = next(c for c in block if c.endswith('"$STASH_URL/wake"'))
    note = next(c for c in block if '"$STASH_URL/note"' in c)
    recall = next(c for c in block if '"$STASH_URL/recall"' in c)
    zoom = next(c for c in block if '"$STASH_URL/zoom"' in c)
    noted: list[str] = []
    for session in range(1, 5):
        lines = agent.wake(wake)
        assert len(lines) == len([x for x in lines if x.startswith("#")])
        if noted:
            assert noted[-1] in lines[-1]  # the newest memory is shown word for word
        for k in range(6):
            text = f"session {session} fact {k}: it's what we'll keep " + "x" * 60
            noted.append(text)
            agent.naps(agent.run(note, **{"<one line>": text}))
        if session >= 2:
            found = agent.run(recall, **{"<regex>": f"session {session - 1} fact 0"})
            assert f"session {session - 1} fact 0" in found
        summary = next((x for x in agent.wake(wake) if re.match(r"#\d+-\d+ ", x)), None)
        if summary is not None:
            opened = agent.run(zoom, **{"<lo-hi>": summary.split()[0][1:]})
            assert opened.count("\n#") + opened.startswith("#") >= 1
    final = agent.wake(wake)
    assert noted[-1] in final[-1] and http.ok("GET", "/wake", token)["T"] == 24
    print("commands run:", agent.ran)
