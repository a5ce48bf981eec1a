"""Reading what a surface printed as an agent reads it: each order is a
``Run:`` (or ``Call:``) line of its own, and a command that sends lines
continues with its quoted here-document, through the closing delimiter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

DELIMITER = "STASH_END"


def commands(
    lines: list[str], opens: Callable[[str], str | None], body: Callable[[str], str] = lambda line: line
) -> list[str]:
    """Every command some line of ``lines`` opens (``opens`` gives its first
    line, or None for a line that opens none), whole, in order: a command
    whose first line ends in a quoted here-document continues with its lines
    (each through ``body``) through the closing delimiter."""
    out: list[str] = []
    k = 0
    while k < len(lines):
        first = opens(lines[k])
        k += 1
        if first is None:
            continue
        command = [first]
        if first.endswith(f"<<'{DELIMITER}'"):
            while k < len(lines) and command[-1] != DELIMITER:
                command.append(body(lines[k]))
                k += 1
            assert command[-1] == DELIMITER, command
        out.append("\n".join(command))
    return out


def orders(output: str, lead: str = "Run: ") -> list[str]:
    """Every command handed over in ``output``, whole, in order."""
    return commands(output.splitlines(), lambda line: line.removeprefix(lead) if line.startswith(lead) else None)


def fill(command: str, placeholder: str, text: str) -> str:
    """``command`` with ``placeholder`` replaced by ``text``: plain string
    replacement, as an agent does."""
    assert placeholder in command, (placeholder, command)
    return command.replace(placeholder, text)


def answer_naps(
    answer: str,
    run: Callable[..., str],
    line: str = "it is summed up",
    check: Callable[[str], None] = lambda answer: None,
) -> str:
    """Answer every nap ``answer`` hands over, as an agent does, taking the
    batch whenever one is offered (each ``<your line for X>`` filled with
    ``what X holds``, a single nap's ``<your line>`` with ``line``);
    ``run(command, **fill)`` runs one printed command. ``check`` sees each
    batch's answer. The last answer is returned."""
    import re

    for _ in range(200):
        naps = [c for c in orders(answer) if '"$STASH_URL/nap"' in c]
        if not naps:
            return answer
        offer = [c for c in naps if '{"batch": ' in c]
        if offer:
            listed = run(offer[0])
            command = orders(listed)[-1]
            for block in re.findall(r"^#(\d+-\d+):$", listed, re.M):
                command = command.replace(f"<your line for {block}>", f"what {block} holds")
            answer = run(command)
            check(answer)
        elif any("<your line>" in c for c in naps):
            answer = run(next(c for c in naps if "<your line>" in c), **{"<your line>": line})
        else:
            answer = run(naps[0])
    raise AssertionError("the naps did not come to an end")


def run_printed(command: str, env: dict[str, str], cwd: Path, **fill: str) -> str:
    """Run one printed command in ``sh`` as an agent does: each placeholder
    replaced by plain string replacement, none left over; it must succeed
    and print nothing on stderr. Its standard output is returned."""
    import re
    import subprocess

    from tests.support.server import CLI_TIMEOUT

    for placeholder, text in fill.items():
        assert placeholder in command, (placeholder, command)
        command = command.replace(placeholder, text)
    assert re.search(r"<[a-z][a-z -]*[a-z0-9]>", command) is None, command
    done = subprocess.run(
        ["/bin/sh", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    assert done.returncode == 0 and done.stderr == "", (command, done.stderr)
    return done.stdout


def tail_command(output: str) -> str:
    """The last command handed over: a batch's answer is a here-document
    that spans several lines."""
    return orders(output)[-1]
