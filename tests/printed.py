"""Reading what a surface printed as an agent reads it: each order is a
``Run:`` (or ``Call:``) line of its own, and a command that sends lines
continues with its quoted here-document, through the closing delimiter."""

from __future__ import annotations

from collections.abc import Callable

DELIMITER = "STASH_END"


def commands(lines: list[str], opens: Callable[[str], str | None],
             body: Callable[[str], str] = lambda line: line) -> list[str]:
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
