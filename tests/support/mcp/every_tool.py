"""Every tool of the agent's MCP server against the same memory's plain
HTTP answers, one script run over both transports that serve the one
definition of the tools (stash/tools/): ``stash mcp`` over stdio
(tests/e2e/test_mcp.py) and ``POST /mcp`` (tests/e2e/test_mcp_http.py).

Each answer is checked block by block: memory text (lines, a nap's
source, matches) only in blocks marked as memory, exactly the server's
lines, and the tool's own text around them; each next step a tool names
(``Call: nap(...)``) is called exactly as named."""

from __future__ import annotations

from mcp.types import CallToolResult

from tests.support.api import assert_error
from tests.support.mcp.session import Session, call_line, text_blocks
from tests.support.server import Http, settle_all

TOOLS = {
    "wake": {"part", "T"},
    "note": {"text"},
    "nap": {"block", "text", "batch", "summaries"},
    "recall": {"q", "before", "words"},
    "zoom": {"block"},
    "forget": {"block"},
}
REQUIRED = {"wake": set(), "note": {"text"}, "nap": set(), "recall": set(), "zoom": {"block"}, "forget": {"block"}}
MEMORY = {"stash/role": "memory"}


def memory_blocks(res: CallToolResult) -> list[list[str]]:
    """The lines of each block marked as memory text."""
    return [block.text.split("\n") for block in text_blocks(res) if (block.meta or {}) == MEMORY]


def own_text(res: CallToolResult) -> str:
    """The tool's own words: every block not marked as memory."""
    return "\n".join(block.text for block in text_blocks(res) if (block.meta or {}) != MEMORY)


def prompt_head(prompt: str) -> str:
    """A nap prompt's first line: "Compress memories #lo-hi into one line of at most N bytes."."""
    return prompt.splitlines()[0]


def nap_shown(res: CallToolResult, due: dict) -> None:
    """``res`` carries the due nap: its instruction in the tool's text, its source as the last memory block,
    the call that answers it, and the same nap as structured content."""
    assert prompt_head(due["prompt"]) in own_text(res).splitlines(), own_text(res)
    assert memory_blocks(res)[-1] == due["source"]
    assert call_line(own_text(res)) == ("nap", {"block": due["block"], "text": "<your line>"})
    nap = res.structured_content["nap"]
    assert {k: nap[k] for k in ("block", "source", "remaining")} == {
        k: due[k] for k in ("block", "source", "remaining")
    }


async def every_tool(s: Session, http: Http, token: str, answers: list[str]) -> None:
    async def ok(tool: str, **args: object) -> str:
        text = await s.ok(tool, **args)
        answers.append(text)
        return text

    async def result(tool: str, **args: object) -> CallToolResult:
        res = await s.result(tool, **args)
        assert not res.is_error, (tool, args, res)
        answers.append("\n".join(block.text for block in text_blocks(res)))
        return res

    listed = await s.client.list_tools()
    assert {t.name: set(t.input_schema["properties"]) for t in listed.tools} == TOOLS
    assert {t.name: set(t.input_schema.get("required", [])) for t in listed.tools} == REQUIRED
    assert all(len(t.description or "") > 80 and t.output_schema for t in listed.tools)
    hints = {t.name: t.annotations.read_only_hint if t.annotations else None for t in listed.tools}
    assert all(hints[name] for name in ("wake", "recall", "zoom"))
    assert not any(hints[name] for name in ("note", "nap", "forget"))

    # An empty memory: awake at once, told how to note the first memory, as a tool call; no memory block.
    res = await result("wake")
    empty = own_text(res).splitlines()
    assert empty[1:] == ["You are awake.", 'Call: note(text="<one line>")'] and "curl" not in empty[0]
    assert memory_blocks(res) == [] and res.structured_content["calls"] == [
        {"tool": "note", "arguments": {"text": "<one line>"}}
    ]

    # note answers the id; the second carries the due nap, its instruction a call of nap.
    http.ok("POST", "/config", token, json={"WAKE_LINES": 1})
    assert await ok("note", text="first") == "Saved as #0."
    second = await result("note", text="second ünïcödé ✓")
    assert own_text(second).splitlines()[:2] == ["Saved as #1.", ""]
    due = http.ok("POST", "/nap", token, json={})["nap"]
    nap_shown(second, due)
    assert http.ok("POST", "/recall", token, json={"q": "second"})["matches"][0].endswith(" second ünïcödé ✓")

    # A wake that needs that summary is a tool error: the server's message, then the nap.
    res = await s.result("wake")
    refusal = assert_error(http.get("/wake", token), 409)
    assert res.is_error and own_text(res).split("\n\n", 1)[0] == refusal["message"]
    nap_shown(res, refusal["nap"])
    assert own_text(res).splitlines()[-1] == "Call: wake()" and "curl" not in own_text(res)

    saved = await s.follow(own_text(res), your_line="first and second")
    assert saved.splitlines() == ["0-1 saved.", "Nothing left to compress."]
    assert http.ok("GET", "/zoom", token, params={"block": "0-3"})["lines"] == ["#0-1 first and second"]
    res = await result("wake")
    assert memory_blocks(res) == [http.ok("GET", "/wake", token)["lines"]]
    assert own_text(res).splitlines()[-1] == "You are awake."
    http.ok("POST", "/config", token, json={"WAKE_LINES": None})

    # recall answers the server's matches, and says when it shows only the newest.
    for word in ("Teapot", "kettle", "TEAPOT again", "spoon", "teapot third"):
        await ok("note", text=word)
    settle_all(http, token)
    res = await result("recall", q="teapot")
    assert memory_blocks(res) == [http.ok("POST", "/recall", token, json={"q": "teapot"})["matches"]]
    assert own_text(res).splitlines()[-1] == "3 matches." and res.structured_content["total"] == 3
    assert await ok("recall", q="no such word") == "No match."
    http.ok("POST", "/config", token, json={"PART_CHARS": 60})
    cut = http.ok("POST", "/recall", token, json={"q": "teapot"})
    assert cut["total"] == 3 and len(cut["matches"]) < 3
    res = await result("recall", q="teapot")
    assert memory_blocks(res) == [cut["matches"]]
    assert own_text(res).splitlines()[-2:] == [
        f"3 matches. The newest {len(cut['matches'])} are shown; the call below fetches the older ones.",
        f'Call: recall(q="<the same regex>", before={cut["more"]})',
    ]
    # recall by words: best first, folded, and the call for the next page names the server's cursor.
    words = http.ok("POST", "/recall", token, json={"words": "TEAP"})
    assert words["total"] == 3 and words["more"] is not None
    res = await result("recall", words="TEAP")
    assert memory_blocks(res) == [words["matches"]]
    assert own_text(res).splitlines()[-1] == f'Call: recall(words="<the same words>", before="{words["more"]}")'
    assert (
        memory_blocks(await result("recall", words="TEAP", before=words["more"]))[0][0]
        == http.ok("POST", "/recall", token, json={"words": "teap", "before": words["more"]})["matches"][0]
    )
    http.ok("POST", "/config", token, json={"PART_CHARS": None})

    # zoom answers the halves the server names, as memory text.
    for block in ("0-3", "4-7", "0-1"):
        res = await result("zoom", block=block)
        assert memory_blocks(res) == [http.ok("GET", "/zoom", token, params={"block": block})["lines"]]

    # A wake in parts: each part names the call for the next, which reads it.
    whole = http.ok("GET", "/wake", token)["lines"]
    http.ok("POST", "/config", token, json={"PART_LINES": 2})
    got, res = [], await result("wake")
    for _ in range(len(whole)):
        got += [line for block in memory_blocks(res) for line in block]
        lines = own_text(res).splitlines()
        assert lines[0].startswith("Your memory, part ")
        if lines[-1] == "You are awake.":
            break
        assert lines[-2] == "Not awake yet." and lines[-1].startswith("Call: wake(part=")
        name, args = call_line(own_text(res))
        res = await result(name, **args)
    assert got == whole
    http.ok("POST", "/config", token, json={"PART_LINES": None})

    # forget drops the summary, the blocks containing it and every later summary of
    # their sizes (each size stays a dense prefix); the nap its answer carries starts
    # the rebuild, each answer naming the next.
    res = await result("forget", block="2-3")
    assert own_text(res).splitlines()[:2] == [
        "Dropped 3 summaries: 2-3, 4-5, 0-3. The log is untouched; the next naps write them again.",
        "",
    ]
    rebuilt = []
    while "Call: nap(block=" in own_text(res):
        due = http.ok("POST", "/nap", token, json={})["nap"]
        nap_shown(res, due)
        # The batch the prompt offers is named as a tool call too.
        offers = [step["fields"]["batch"] for step in due["run"][1:]]
        assert [line for line in own_text(res).splitlines() if line.startswith("Call: nap(batch=")] == [
            f"Call: nap(batch={k})" for k in offers
        ] and "curl" not in own_text(res)
        rebuilt.append(due["block"])
        name, args = call_line(own_text(res))
        res = await result(name, **{**args, "text": f"rebuilt {due['block']}"})
    assert rebuilt == ["2-3", "4-5", "0-3"]
    assert own_text(res).splitlines() == ["0-3 saved.", "Nothing left to compress."]
    assert http.ok("GET", "/zoom", token, params={"block": "0-7"})["lines"] == [
        "#0-3 rebuilt 0-3",
        "#4-7 not compressed yet",
    ]
    assert await ok("nap") == "Nothing left to compress."

    # A batch: its blocks' sources as memory text, answered all at once by the call it names.
    http.ok("POST", "/forget", token, json={"block": "0-1"})
    batch = http.ok("POST", "/nap", token, json={"batch": 8})["batch"]
    res = await result("nap", batch=8)
    assert memory_blocks(res) == [
        [line for item in batch for line in (f"#{item['block']}:", *("  " + x for x in item["source"]))]
    ]
    # The call is printed, and handed over as structured content: the one to make.
    (step,) = res.structured_content["calls"]
    assert f"Call: {step['tool']}(summaries=" in own_text(res)
    assert (step["tool"], [x["block"] for x in step["arguments"]["summaries"]]) == (
        "nap",
        [item["block"] for item in batch],
    )
    done = await result(
        step["tool"],
        summaries=[{"block": x["block"], "text": f"again {x['block']}"} for x in step["arguments"]["summaries"]],
    )
    assert (
        own_text(done).splitlines()[-1] == "Nothing left to compress."
        and not http.ok("POST", "/nap", token, json={})["nap"]
    )

    # Refusals are tool errors carrying the server's message and nothing else.
    http.ok("POST", "/forget", token, json={"block": "4-5"})
    for tool, args, status, method, path, kw in (
        ("zoom", {"block": "64-127"}, 422, "GET", "/zoom", {"params": {"block": "64-127"}}),
        ("forget", {"block": "4-5"}, 404, "POST", "/forget", {"json": {"block": "4-5"}}),
        ("note", {"text": "two\nlines"}, 422, "POST", "/note", {"json": {"text": "two\nlines"}}),
        ("recall", {"q": "("}, 422, "POST", "/recall", {"json": {"q": "("}}),
        ("nap", {"text": "no block"}, 422, "POST", "/nap", {"json": {"text": "no block"}}),
    ):
        text, error = await s.call(tool, **args)
        message = assert_error(http.request(method, path, token, **kw), status)["message"]
        # A refusal that hands over a next step (a zoom past the end: the zoom that opens) names it as a call.
        assert error and (text == message or text.startswith(message + "\n\nCall: ")), (tool, text)
        answers.append(text)
    settle_all(http, token)
    # A block without its summary is refused before the server is asked, naming the call to make.
    assert await s.call("nap", block="4-5") == (
        'nap 4-5 needs text, the one-line summary:\nCall: nap(block="4-5", text="<your line>")',
        True,
    )
    # So is an argument the tool does not take.
    text, error = await s.call("zoom", block="0-1", depth=2)
    assert error and "zoom takes no argument 'depth'" in text
