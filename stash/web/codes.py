"""Every error code the server answers, with its one status and what it
means: what the reference's error-code table, OpenAPI and the routes' own code
lists (:mod:`stash.web.routes`) document. An answer's status is not read from
here but from the error raised (``err.status`` in :mod:`stash.web.errors`: its
class's in :mod:`stash.core.errors`, or the 404 and 405 :mod:`stash.web.app`
sets); tests/api/test_openapi.py reads every raise in the package and holds
each code to the one status listed here, so a code is never documented with one
status and answered with another."""

from __future__ import annotations

from typing import NamedTuple

from ..service.ops.replication_status import ERROR_WINDOW_S, MAX_LAG_S


class Code(NamedTuple):
    status: int
    meaning: str  # Markdown, one cell of API-REFERENCE.md's error-code table


CODES: dict[str, Code] = {
    "request.malformed": Code(
        400,
        "`Content-Length` is not a number; a text/plain body that is not UTF-8, or sent "
        "to a route that takes JSON only",
    ),
    "request.bad_json": Code(400, "not valid JSON, or not a JSON object"),
    "request.empty_body": Code(400, "the body is empty but fields are required"),
    "request.unknown_field": Code(400, "a field the route does not take"),
    "request.missing_field": Code(400, "a required field is absent"),
    "request.duplicate_field": Code(400, "a query parameter given twice"),
    "request.bad_value": Code(
        422,
        "`part`, `T`, `lines`, `before` or `ready` is not a whole number; `ready` is "
        "not 0 or 1; `invite` is not a string",
    ),
    "request.bad_plain": Code(400, "a text/plain body whose lines are not the route's plain form"),
    "request.too_large": Code(
        413,
        "over the body cap: `--max-body`, 64 KiB by default (`--max-import-body`, 16 "
        "MiB, for import; at least 256 KiB for nap)",
    ),
    "auth.token_in_query": Code(400, "a token (or token-named parameter) in the query string"),
    "auth.invalid": Code(401, "missing, malformed, unknown or revoked token"),
    "auth.scope": Code(403, "the token's scope is too low"),
    "auth.operator": Code(403, "not loopback, or not the metrics token"),
    "text.type": Code(422, "the text is not a string"),
    "text.multiline": Code(422, "a line break in the text"),
    "text.control": Code(422, "a control character (tab included)"),
    "text.bidi": Code(422, "a bidirectional control (U+202E and its kin)"),
    "text.invisible": Code(422, "an invisible format character (U+200B, U+FEFF, tag characters, …)"),
    "text.empty": Code(422, "empty after stripping spaces"),
    "text.reserved": Code(422, "exactly `STASH_END`, the delimiter of printed here-documents"),
    "text.placeholder": Code(
        422,
        "a note or summary that is exactly a placeholder of a printed command, like "
        "`<one line>`: the command was run without the agent's own line",
    ),
    "text.too_long": Code(422, "over `ENTRY_CHARS` bytes"),
    "block.invalid": Code(422, "not a string, or not an aligned power-of-two block"),
    "block.beyond_log": Code(422, "the block is not complete (nap, forget), or starts at or past `T` (zoom)"),
    "nap.missing_block": Code(422, "`text` without `block`"),
    "nap.missing_text": Code(422, "`block` without `text`"),
    "nap.wrong_block": Code(409, "not the due block; carries `due`, `nap` (and `index` in a batch)"),
    "nap.mixed": Code(422, "more than one of `block`/`text`, `batch`, `summaries`"),
    "nap.bad_batch": Code(422, "`batch` is not a whole number from 1 to 256"),
    "nap.bad_summaries": Code(422, '`summaries` is not a list of 1 to 256 `{"block", "text"}`'),
    "wake.needs_nap": Code(409, "the document needs a summary not written yet; carries `needs`, `nap`"),
    "wake.bad_t": Code(422, "`T` larger than the log"),
    "wake.no_part": Code(422, "no such part"),
    "reference.no_part": Code(422, "no such part of the reference; the message says how many there are"),
    "recall.bad_pattern": Code(422, "not a string, empty, too long, bad or unsupported syntax, too large"),
    "recall.too_slow": Code(422, "the scan passed its time bound (5 s plus 10 µs per note); nothing is returned"),
    "recall.bad_words": Code(
        422,
        "`words` not a string, over 512 bytes, no word or more than 16 different words; "
        "or `before` not the `more` of a page of this words search",
    ),
    "recall.q_and_words": Code(422, "both `q` and `words`: send one"),
    "forget.no_summary": Code(404, "the block has no summary"),
    "config.empty": Code(422, "`{}`"),
    "config.out_of_range": Code(422, "not a whole number within the size's range"),
    "config.unknown_name": Code(422, "a name in the body is not a size"),
    "import.empty": Code(422, "`entries` is not a non-empty list"),
    "import.bad_entry": Code(422, "an entry is not `{date, text}`; carries `index`"),
    "import.bad_date": Code(422, "not a real date, or in the future; carries `index`"),
    "import.out_of_order": Code(422, "earlier than the entry before it; carries `index`"),
    "import.before_log": Code(422, "earlier than the newest note; carries `index` (0)"),
    "init.disabled": Code(403, "the server does not mint identities"),
    "init.invite_required": Code(403, "invitation only; invite missing or wrong"),
    "init.bad_url": Code(422, "`url` is not an http(s) address of at most 2000 characters"),
    "grants.bad_scope": Code(422, "scope is not `read` or `full`"),
    "grants.bad_label": Code(422, "label is not 1 to 64 bytes of printable text"),
    "grants.bad_expires": Code(422, "expires is not an RFC 3339 UTC time after now"),
    "grants.bad_url": Code(422, "`url` is not an http(s) address of at most 2000 characters"),
    "memory.unknown": Code(404, "no such memory for this capability: the same answer whether the name exists or not"),
    "memory.bad_name": Code(
        422, "a memory name is 1 to 64 of `a-z 0-9 . _ -`, starting with a letter or digit (not `erase`)"
    ),
    "memory.exists": Code(409, "a memory of that name exists already"),
    "memory.too_many": Code(409, "the identity holds `--max-memories` memories already"),
    "memory.main": Code(409, "memory `main` goes only with the identity (`DELETE /store`)"),
    "memory.bad_at": Code(
        422, "a fork's `at` is not a whole number from 0 to the source's T (the notes its log holds)"
    ),
    "memory.bad_query": Code(
        422,
        "an erasure across memories needs exactly one of `q` (a recall regex) or `words`; "
        "`memories` a list of names; `dry_run` a boolean",
    ),
    "memory.too_many_matches": Code(422, "more than 10,000 notes match an erasure across memories"),
    "append.not_ready": Code(409, "the memory's keys changed and no read-capable request has opened it since"),
    "grants.unknown": Code(404, "no such capability"),
    "grants.owner": Code(409, "the owner capability is not revoked but rotated (`POST /rotate`)"),
    "grants.busy": Code(
        409, "another revocation or rotation moved the key epoch while this request ran, and nothing changed; retry"
    ),
    "erase.bad_ids": Code(422, "`ids` is not a list of 1–10,000 whole numbers"),
    "erase.unknown_id": Code(422, "an id is not a note of the log (at or past `T`)"),
    "undo.bad_range": Code(
        422,
        "`first` or `last` is not a note id, `last` is before `first`, or neither "
        "`grant` nor `last` was sent; nothing was erased",
    ),
    "idempotency.bad_key": Code(
        400,
        "the `Idempotency-Key` header is empty, over 255 characters, has a "
        "character outside visible ASCII (space included), or was sent twice",
    ),
    "idempotency.key_reused": Code(
        409,
        "the key was used in the last 24 hours for a different request (another "
        "body, or another of note, nap and import); nothing was written",
    ),
    "shape.out_of_range": Code(422, "`T` over 10^15 or `lines` outside 1–1000"),
    "mcp.bad_request": Code(
        400,
        "/mcp: not `Content-Type: application/json`, or not one JSON-RPC message the "
        "transport takes (the JSON-RPC error's own code says which)",
    ),
    "mcp.bad_origin": Code(403, "/mcp: an `Origin` that is neither loopback nor `--url`'s"),
    "mcp.not_acceptable": Code(406, "/mcp: `Accept` does not take `application/json` and `text/event-stream`"),
    "mcp.bad_host": Code(
        421,
        "/mcp: a `Host` that is neither loopback, nor `--url`'s host, nor the address the "
        "server listens on (the MCP SDK's guard against DNS rebinding)",
    ),
    "fleet.elsewhere": Code(
        421,
        "a host of a fleet (`--placement`) that does not hold this user's shard now, or, for `/init`, that holds "
        "no shard: send the request through the fleet's router",
    ),
    "fleet.moving": Code(
        503,
        "this user's shard is moving to another host of the fleet (`stash fleet move`), or has just come to this "
        "host and this user is not restored yet (`stash fleet failover`); nothing was done: send the request again "
        "after `Retry-After` seconds",
    ),
    "oauth.invalid_request": Code(400, "OAuth: a parameter missing or malformed (PKCE S256 is required)"),
    "oauth.invalid_client": Code(
        401,
        "OAuth: an unknown client, or one whose metadata document cannot be had "
        "(not https, on a private or loopback address, over 5 KiB, over 3 s, or not "
        "a document naming its own URL)",
    ),
    "oauth.invalid_redirect_uri": Code(
        400, "OAuth: a redirect URI the client did not register, or one not https (nor http on loopback)"
    ),
    "oauth.invalid_client_metadata": Code(
        400, "OAuth: a registration this server cannot give (a name over 200 characters, no authorization_code grant)"
    ),
    "oauth.invalid_grant": Code(
        400,
        "OAuth: a code unknown, expired, redeemed before, or sent with another "
        "client, redirect URI or a wrong verifier (its capability is then withdrawn)",
    ),
    "oauth.unsupported_grant_type": Code(400, "OAuth: a grant type other than authorization_code"),
    "consent.expired": Code(400, "the consent form's nonce is unknown, used or over 10 minutes old"),
    "consent.bad_origin": Code(403, "the consent form was posted from another origin than this server's"),
    "consent.bad_choice": Code(422, "the consent form's memory, scope or duration is not one it offers"),
    "fleet.unreachable": Code(
        503,
        "a host of the fleet that keeps this OAuth step's client, consent form, or user and code is not answering",
    ),
    "fleet.bad_hop": Code(
        400,
        "`fleet_request` sent by other than a host of the fleet (without the marker only hosts set), or malformed",
    ),
    "route.unknown": Code(404, "no such route"),
    "method_not_allowed": Code(405, "the route does not take that method"),
    "rate_limited": Code(429, "too many failures or mints from this address; see `Retry-After`"),
    "quota.memories": Code(
        403,
        "the notes of the identity's memories together would pass `--quota-memories` (default "
        "1,000,000; erased ones count for nothing); nothing was written",
    ),
    "quota.bytes": Code(
        403, "the identity's folders already take `--quota-bytes` (default 1 GiB); nothing was written"
    ),
    "quota.import_request": Code(
        403,
        "a full capability's import has more entries than `--import-per-request` (default 10,000); nothing was written",
    ),
    "quota.import_day": Code(
        403,
        "the full capability's imports today (UTC) would pass `--import-per-day` "
        "(default 100,000); nothing was written",
    ),
    "quota.identities": Code(
        429, "this address minted `--init-per-day` (default 50) identities in the last 24 hours; see `Retry-After`"
    ),
    "busy.user": Code(
        429,
        "this memory already has `--user-concurrency` (default 4) requests in progress on "
        "this server process; retry after `Retry-After` (1 s) and send fewer at once",
    ),
    "busy.slow": Code(
        429,
        "this memory already has `--user-slow` (default 1) slow request in progress; retry "
        "after `Retry-After` (2 s), one at a time",
    ),
    "busy.server": Code(
        429,
        "the process's `--slow-slots` (default 2) slow requests are all taken by other "
        "memories; retry after `Retry-After` (2 s). Other routes are not affected",
    ),
    "store.damaged": Code(
        500,
        "stored bytes failed their integrity check (a sealed value, a SQLCipher page, "
        "the last row against the recorded head), or a summary the tree needs is "
        "missing; not served",
    ),
    "store.rolled_back": Code(
        500,
        "the log is shorter than its recorded head, or the memory file is behind (or "
        "on another history from) the key ring's copy of the head, or the key ring "
        "is older than the memory file's key epoch: a file was cut short or an older "
        "copy was put back. Not served; run `stash verify` and restore from a backup",
    ),
    "store.pin_mismatch": Code(
        409, "the log does not continue the head sent in `Stash-Pin`; nothing was served or written"
    ),
    "store.rekeyed": Code(
        409,
        "a revocation moved the key epoch between reading the key ring and opening the memory; nothing was done, retry",
    ),
    "request.bad_pin": Code(400, "`Stash-Pin` is not `count:digest:state` (or `count:digest`)"),
    "store.missing": Code(
        503, "the user's key ring or memory file is not in the data folder (never replaced by an empty one); restore it"
    ),
    "store.unreadable": Code(503, "a user file cannot be opened or read (an I/O error)"),
    "store.read_only": Code(503, "the data folder is read-only: nothing can be written (reads still work)"),
    "store.full": Code(507, "the disk is full: nothing was written"),
    "internal": Code(500, "an unexpected failure"),
    "ready.unwritable": Code(
        503, "asked with `ready=1`: the data folder cannot be written (full, read-only, missing or replaced)"
    ),
    "ready.replication": Code(
        503,
        "asked with `ready=1` on a host that replicates: the replication supervisor or "
        "Litestream is down, Litestream reported an error in the last "
        f"{ERROR_WINDOW_S:.0f} s (a full, unwritable or unreachable replica, or keys it refuses), "
        f"or the replica is over {MAX_LAG_S:.0f} s behind",
    ),
    "server.stopping": Code(
        503,
        "the server was stopping and cut this request before it finished; resend it with "
        "the same `Idempotency-Key` once the server is back (a write sent without one may "
        "have been done)",
    ),
}

# Codes no route answers: they are for a path no route has, or a method its path does not take.
OUTSIDE_ROUTES = ("route.unknown", "method_not_allowed")
