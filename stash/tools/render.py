"""A tool's answer as MCP results carry it: text blocks that are the
server's own words and next steps, and memory blocks that hold nothing but
text that came from a memory (lines, a nap's source, matches), marked as
data (:data:`MEMORY_META`); and the same answer as structured content, its
next steps as tool calls (``{"tool", "arguments"}``). Each is rendered
from the fields of a Stash answer, never from the server's printed prompts
or commands, so no memory text ever stands inside an instruction."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import client
from .texts import AS_DATA

MEMORY_META = {"stash/role": "memory"}
"""The ``_meta`` of a content block whose text came from a memory: data, never an instruction."""


@dataclass(frozen=True)
class Part:
    """One content block: the tool's own text, or (``memory``) text that came from a memory."""

    text: str
    memory: bool = False


@dataclass
class Result:
    """A tool's result: its content blocks in order, its structured content, and whether it is a refusal."""

    parts: list[Part] = field(default_factory=list)
    structured: dict[str, Any] | None = None
    error: bool = False

    def say(self, *lines: str) -> None:
        """Add the tool's own lines, joined to the text block before them when the last block is text."""
        if not any(lines) and (not lines or not self.parts or self.parts[-1].memory):
            return  # a blank line only ever separates two parts of one text block
        text = "\n".join(lines)
        if self.parts and not self.parts[-1].memory:
            self.parts[-1] = Part(self.parts[-1].text + "\n" + text)
        else:
            self.parts.append(Part(text))

    def data(self, lines: list[str]) -> None:
        """Add memory text as a block of its own (none when there is none)."""
        if lines:
            self.parts.append(Part("\n".join(lines), memory=True))

    @property
    def text(self) -> str:
        """Every block's text, in order (the plain-text rendering)."""
        return "\n".join(p.text for p in self.parts)


class CallText(str):
    """A tool call as printed (``nap(block="0-1", text="<your line>")``), carrying it as data."""

    call: dict[str, Any]

    def __new__(cls, tool: str, arguments: dict[str, Any]) -> CallText:
        shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
        made = super().__new__(cls, f"{tool}({shown})")
        made.call = {"tool": tool, "arguments": arguments}
        return made


class ToolCalls(client.Steps):
    """Names each of the server's next steps as a call of these tools, built,
    as the client's commands are, from the server's step objects (their
    numbers and block ids checked by :meth:`client.Steps.render`)."""

    lead = "Call: "

    def wake(self, part: int | None = None, T: int | None = None) -> str:
        return CallText("wake", {} if part is None else {"part": part, "T": T})

    def nap(self, block: str | None = None) -> str:
        return CallText("nap", {} if block is None else {"block": block, "text": "<your line>"})

    def note(self) -> str:
        return CallText("note", {"text": "<one line>"})

    def nap_batch(self, k: int) -> str:
        return CallText("nap", {"batch": k})

    def nap_summaries(self, blocks: list[str]) -> str:
        return CallText("nap", {"summaries": [{"block": b, "text": f"<your line for {b}>"} for b in blocks]})

    def zoom(self, block: str | None = None) -> str:
        return CallText("zoom", {"block": "<lo-hi>" if block is None else block})

    def recall(self, before: int | None = None) -> str:
        if before is None:
            return CallText("recall", {"q": "<regex>"})
        return CallText("recall", {"q": "<the same regex>", "before": before})

    def recall_words(self, before: str | None = None) -> str:
        if before is None:
            return CallText("recall", {"words": "<words>"})
        return CallText("recall", {"words": "<the same words>", "before": before})

    def calls(self, run: object) -> list[CallText]:
        """Each known step of ``run`` as a call (a newer server's unknown step is left out)."""
        steps = run if isinstance(run, list) else []
        return [c for c in (self.render(s) for s in steps) if isinstance(c, CallText)]


STEPS = ToolCalls()


def nap_object(nap: object) -> dict[str, Any] | None:
    """A nap's fields for structured content: its prompt (with its commands) left out."""
    if not isinstance(nap, dict) or not client.is_block(nap.get("block")):
        return None
    return {
        "block": nap["block"],
        "source": [x for x in nap.get("source") or [] if isinstance(x, str)],
        "remaining": nap.get("remaining", 0),
        "max_bytes": nap.get("max_bytes"),
    }


def add_nap(result: Result, nap: object, calls: list[dict[str, Any]]) -> None:
    """A nap as OptMem's prompt: its instruction, its source lines as a memory
    block, then the call that answers it (and the batch it offers)."""
    shown = nap_object(nap)
    if shown is None or not isinstance(nap, dict):
        return
    left = shown["remaining"] if isinstance(shown["remaining"], int) else 0
    limit = shown["max_bytes"] if isinstance(shown["max_bytes"], int) else 280
    result.say(
        f"Compress memories #{shown['block']} into one line of at most {limit} bytes.",
        "Keep what has lasting effect, drop what does not. Invent nothing. The lines to compress " + AS_DATA,
    )
    result.data(shown["source"])
    run = nap.get("run") if isinstance(nap.get("run"), list) else []
    named = [c for c in STEPS.calls(run) if set(c.call["arguments"]) == {"block", "text"}]
    answer = named[0] if named else STEPS.nap(shown["block"])
    lines = (
        []
        if not left
        else [("1 compression remains" if left == 1 else f"{left} compressions remain") + " after this one."]
    )
    lines += [STEPS.lead + answer]
    calls.append(_call(answer))
    for offer in STEPS.calls(run):
        if "batch" in offer.call["arguments"]:
            lines += [client.BATCH_OFFER.format(k=offer.call["arguments"]["batch"]), STEPS.lead + offer]
            calls.append(_call(offer))
    result.say(*lines)


def _call(text: str) -> dict[str, Any]:
    return text.call if isinstance(text, CallText) else {}


def orders(result: Result, run: object, calls: list[dict[str, Any]]) -> None:
    """Each next step of ``run`` as a ``Call:`` line, and as a call in ``calls``."""
    made = STEPS.calls(run)
    result.say(*(STEPS.lead + c for c in made))
    calls += [c.call for c in made]


def refusal(error: client.StashError) -> Result:
    """A refusal as a tool error: the server's message (never memory text, never a token), then what it
    carries to do next (the nap, the steps), named as tool calls."""
    out = Result(error=True)
    out.say(error.message)
    calls: list[dict[str, Any]] = []
    if error.code == "store.pin_mismatch":
        failure = client.refused(error, STEPS)
        out.say("", failure.extra or "")
        return out
    body = error.body or {}
    if body.get("nap"):
        out.say("")
    add_nap(out, body.get("nap"), calls)
    if STEPS.calls(body.get("run")):
        out.say("")
    orders(out, body.get("run"), calls)
    out.structured = {"error": error.code, "message": error.message, "nap": nap_object(body.get("nap")), "calls": calls}
    return out
