"""Reading what a surface printed as an agent reads it: each order is a
``Run:`` (or ``Call:``) line of its own, and a command that sends lines
continues with its quoted here-document, through the closing delimiter."""

from __future__ import annotations

DELIMITER = "STASH_END"


def orders(output: str, lead: str = "Run: ") -> list[str]:
    """Every command handed over in ``output``, whole, in order."""
    out: list[str] = []
    lines = output.splitlines()
    k = 0
    while k < len(lines):
        line = lines[k]
        k += 1
        if not line.startswith(lead):
            continue
        command = [line.removeprefix(lead)]
        if command[0].endswith(f"<<'{DELIMITER}'"):
            while k < len(lines):
                command.append(lines[k])
                k += 1
                if command[-1] == DELIMITER:
                    break
            assert command[-1] == DELIMITER, output
        out.append("\n".join(command))
    return out


def fill(command: str, placeholder: str, text: str) -> str:
    """``command`` with ``placeholder`` replaced by ``text``: plain string
    replacement, as an agent does."""
    assert placeholder in command, (placeholder, command)
    return command.replace(placeholder, text)
