"""``stash mcp``: a Model Context Protocol server over stdio whose tools are
the agent's verbs — wake, note, nap, recall, zoom, forget — against the Stash
server named by ``STASH_URL`` and ``STASH_TOKEN``.

It is a thin skin over the library (:class:`stash.client.Stash`): its calls,
and the same text the ``stash`` client prints of their answers, except that
every next step is named as a tool call instead of a shell command. The ``mcp`` package is an optional
extra, imported by this module only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Annotated

from .. import __version__, client
from ..core.blocks import BATCH_MAX
from ..core.recall import MAX_PATTERN_BYTES

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field


def _load_mcp() -> bool:
    """Import the optional extra into this module, or False when it is
    absent. Done by :func:`main` only once the variables are known to be
    set: the imports take about a second and a half, and a host that starts
    the server without its variables should hear so at once. The tools'
    annotations name these globals, read when :func:`build` registers them."""
    global MCPServer, CallToolResult, TextContent, ToolAnnotations, Field
    try:
        from mcp.server import MCPServer
        from mcp.types import CallToolResult, TextContent, ToolAnnotations
        from pydantic import Field
    except ImportError:  # main() says how to add it
        return False
    return True

# The mcp extra's own requirement (pyproject.toml), so the line works as printed whatever way Stash was
# installed: the package is not on the public index.
INSTALL = "pip install 'mcp>=2.3,<3'"

INSTRUCTIONS = """\
Stash is your permanent memory across sessions. In every session, call wake \
before any other tool and read it to the end (call wake again for each part it \
names, until it says "You are awake."). Whenever something of lasting effect \
happens, note one line. Answer every due nap (a compression prompt) before your \
next action. Before deciding something that may have been decided before, \
recall. A subagent never calls Stash: tell each one "You are a subagent. Don't \
call Stash."\
"""

# Tool descriptions carry the protocol (skill/SKILL.md) in brief: a host shows
# the model these, not the skill.
WAKE = """\
Read your memory: one bounded document of your whole past, coarse for long ago, \
word for word near the present. Call it first in every session, before any other \
tool, and read every line. The document comes in parts: until an answer ends with \
"You are awake.", call wake with the part and T that answer names. If the last \
part carries a compression prompt (a nap), answer it with nap before anything \
else. "#i YYYY-MM-DD text" is note #i; "#lo-hi text" is your own summary of \
notes lo to hi (open it with zoom). A refusal saying a summary is needed \
carries the nap to answer; answer it (and those that follow), then wake again.\
"""
NOTE = """\
Record one note: one line of at most 280 bytes of UTF-8 (fewer if the memory's \
ENTRY_CHARS is set lower) about something of \
lasting effect — a decision, a fact the user taught you, something learned about \
their life or preferences, a task worth real effort and how it ended, an approach \
that failed and why. Make it stand alone (who, what, why). No line breaks, no \
secrets, nothing already recorded (recall first when unsure). Nothing edits a \
note: a correction is a new note. The answer gives the note's number and, \
when one is due, a nap: answer it before your next action.\
"""
NAP = """\
Compress your memory. With block and text, saves text as the one-line summary \
of the due block; with neither, shows what is due. A nap arrives after note, at \
the end of wake, or in a refusal: answer every due nap before your next action, \
until none is left. Write one line of at most the bytes the \
prompt names that keeps what has lasting effect (decisions, facts, names, \
numbers, outcomes), drops what does not, and invents nothing. Blocks settle in \
order: another block than the due one is refused with the one that is due. \
When many are due (the prompt says so), take them as a batch: with batch=K it \
lists up to K blocks that can be written at once (by you, or by parallel \
subagents that only write lines and never call Stash); answer them all with \
summaries=[{"block": ..., "text": ...}, ...] in the order listed, all or nothing.\
"""
RECALL = """\
Search every note, word for word (never the summaries), with a case-insensitive \
regular expression (RE2 syntax, no backreferences or lookaround). Use it before \
deciding something that may have been decided before, or when the user refers \
to something your wake does not show. Answers the newest matching notes, \
oldest first, then the count ("15 matches."); when more matched than it shows, \
it names the call that fetches the older ones (before=ID), or narrow the pattern. \
Or, instead of q, give words: the words you remember, or the whole question \
("when did Priya move the Harbor review?"). Each word matches as the prefix of \
a word of a note, whatever its case or accents ("cafe" finds "Café", "dep" \
finds "deployed"); notes holding every word come first, rare words weigh \
most; answers the best matches, best first, with their scores. Use words to \
find something by what it was about; use q when you know the exact text or \
need every match in order.\
"""
ZOOM = """\
Open a block of the wake — a summary line "#lo-hi text" — into its two halves: \
each a summary or, at the bottom, a note. Zoom again into a half to go \
further down.\
"""
FORGET = """\
Drop a summary that is wrong or misleading. With it go the summary of the \
block containing it at each larger size and every later summary of each of \
those sizes (each size's summaries stay a dense prefix). The notes \
themselves are untouched; the answer carries the first nap that writes the \
dropped summaries again from their source.\
"""


class ToolCalls(client.Steps):
    """Names each next step as a call of this server's tools, its arguments
    as JSON values: ``Call: nap(block="0-1", text="<your line>")``. Built,
    as the client's commands are, from the server's step objects."""

    lead = "Call: "

    def wake(self, part: int | None = None, T: int | None = None) -> str:
        return "wake()" if part is None else f"wake(part={part}, T={T})"

    def nap(self, block: str | None = None) -> str:
        return "nap()" if block is None else f"nap(block={_json(block)}, text={_json('<your line>')})"

    def note(self) -> str:
        return f"note(text={_json('<one line>')})"

    def nap_batch(self, k: int) -> str:
        return f"nap(batch={k})"

    def nap_summaries(self, blocks: list[str]) -> str:
        items = ", ".join(f'{{"block": {_json(b)}, "text": {_json(f"<your line for {b}>")}}}' for b in blocks)
        return f"nap(summaries=[{items}])"

    def zoom(self, block: str | None = None) -> str:
        return f"zoom(block={_json('<lo-hi>' if block is None else block)})"

    def recall(self, before: int | None = None) -> str:
        if before is None:
            return f"recall(q={_json('<regex>')})"
        return f"recall(q={_json('<the same regex>')}, before={before})"

    def recall_words(self, before: str | None = None) -> str:
        if before is None:
            return f"recall(words={_json('<words>')})"
        return f"recall(words={_json('<the same words>')}, before={_json(before)})"


def _json(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _result(text: str, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)


STEPS = ToolCalls()


def _answer(run, *args) -> CallToolResult:
    """The verb's text as the tool's result, its next steps named as tool
    calls. A refusal is a tool error whose text is the server's message (and
    the nap it carries, if any): never a traceback, and never the token,
    which no message contains."""
    try:
        lines = run(*args, steps=STEPS)
    except client.StashError as e:
        f = client.refused(e, STEPS)
        return _result(f.message + (f"\n\n{f.extra}" if f.extra else ""), error=True)
    return _result("\n".join(lines))


def build(mem: client.Stash) -> MCPServer:
    """The MCP server whose six tools call the library's ``mem``."""
    server = MCPServer("stash", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def wake(
        part: Annotated[int | None, Field(description="Which part to read, from 1; omit for the first.")] = None,
        T: Annotated[int | None, Field(description=(
            "The snapshot T that the previous answer named; give it with every part after the first "
            "so the parts fit together."))] = None,
    ) -> CallToolResult:
        return _answer(client.wake_lines, mem, part, T)

    def note(
        text: Annotated[str, Field(description="The note: one line of at most 280 bytes, standing alone.")],
    ) -> CallToolResult:
        return _answer(client.note_lines, mem, text)

    def nap(
        block: Annotated[str | None, Field(description=(
            'The due block, like "0-1", exactly as the prompt names it; omit it and text to see what is due.'))]
        = None,
        text: Annotated[str | None, Field(description=(
            "The one-line summary of the block's source lines; required with block."))] = None,
        batch: Annotated[int | None, Field(description=(
            f"List up to this many (1 to {BATCH_MAX}) due blocks that can be written at once; alone."), ge=1,
            le=BATCH_MAX)]
        = None,
        summaries: Annotated[list[dict[str, str]] | None, Field(description=(
            'A batch\'s answer: [{"block": "0-1", "text": "..."}, ...] in the order the batch listed; alone. '
            "All or nothing."))] = None,
    ) -> CallToolResult:
        if batch is not None or summaries is not None:
            if block is not None or text is not None or (batch is not None and summaries is not None):
                return _result("Give one of: nap(), nap(block=..., text=...), nap(batch=K), nap(summaries=[...]).",
                               error=True)
            if batch is not None:
                return _answer(client.batch_lines, mem, batch)
            return _answer(client.summaries_lines, mem, summaries)
        if block is not None and text is None:
            shown = block if client.is_block(block) else "<lo-hi>"
            return _result(f"nap {shown} needs text, the one-line summary:\n{STEPS.lead}{STEPS.nap(shown)}",
                           error=True)
        return _answer(client.nap_lines, mem, block, text)

    def recall(
        q: Annotated[str | None, Field(
            description=f'The pattern, 1 to {MAX_PATTERN_BYTES} bytes, like "deploy|rollback".')] = None,
        before: Annotated[int | str | None, Field(description=(
            "Only notes before this id: the next older page, as the previous answer names it (for words: "
            "the cursor it names)."))] = None,
        words: Annotated[str | None, Field(description=(
            'Instead of q: words, or a whole question, like "priya harbor review"; best matches first.'))] = None,
    ) -> CallToolResult:
        if (q is None) == (words is None):
            return _result("Give one of q (a regex) or words.", error=True)
        if words is not None:
            if before is not None and not isinstance(before, str):
                return _result("With words, before is the cursor the previous answer named.", error=True)
            return _answer(client.recall_words_lines, mem, words, before)
        if before is not None and (isinstance(before, str) or before < 0):
            return _result("With q, before is a note id, as the previous answer named it.", error=True)
        return _answer(client.recall_lines, mem, q, before)

    def zoom(
        block: Annotated[str, Field(description='The block to open, like "64-127", from a "#64-127" line.')],
    ) -> CallToolResult:
        return _answer(client.zoom_lines, mem, block)

    def forget(
        block: Annotated[str, Field(description='The summary\'s block, like "64-127".')],
    ) -> CallToolResult:
        return _answer(client.forget_lines, mem, block)

    tools = (
        (wake, WAKE, reading),
        (note, NOTE, ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                     open_world_hint=False)),
        # Answering a settled block again writes nothing, so a repeated nap is harmless.
        (nap, NAP, ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                                   open_world_hint=False)),
        (recall, RECALL, reading),
        (zoom, ZOOM, reading),
        (forget, FORGET, ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                         open_world_hint=False)),
    )
    for fn, description, hints in tools:
        server.add_tool(fn, description=description, annotations=hints, structured_output=False)
    return server


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="stash mcp",
        description="Serve wake, note, nap, recall, zoom and forget as Model Context Protocol tools over stdio, "
                    "against the Stash server named by STASH_URL, with the capability in STASH_TOKEN.",
        epilog=f"Needs the mcp extra: {INSTALL}",
    )


def main(argv: list[str]) -> int:
    parser().parse_args(argv)
    try:
        # Read once, as the client reads them, so a host that starts us without them fails at once.
        mem = client.command_memory(client.server_url(), client.token(), "STASH_URL")
    except client.Failure as f:
        print(f.message, file=sys.stderr)
        return f.code
    if not _load_mcp():
        print(f"stash mcp: the mcp package is not installed; install it with: {INSTALL}", file=sys.stderr)
        return 2
    build(mem).run("stdio")
    return 0
