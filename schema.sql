-- Stash storage schema. The server loads this file as it is; nothing here is
-- copied into code. It holds the schemas of the files, in sections each
-- introduced by a "-- @name" line.
--
-- Layout on disk, one folder per user:
--   DATA/users/<user_id>/keyring.db  plain SQLite: the grants and the master
--                                    key wrapped once per grant. It must be
--                                    readable before the master key is known.
--   DATA/users/<user_id>/memory.db   SQLCipher (raw key derived from the master
--                                    key) where sqlcipher3 imports, else plain
--                                    SQLite; every value in it is also sealed.
--   DATA/users/<user_id>/recall.db   plain SQLite, made by the first recall of
--                                    a log of 4,096 memories or more: the
--                                    recall cache (section scan_cache). Every
--                                    value sealed; deletable; not backed up.
--
--   DATA/users/<user_id>/m/<name>/   another memory of the same identity: the
--                                    same three files (docs/DESIGN.md, "Memories"),
--                                    its key ring in 2 KiB pages (4 pages, 8 KiB).
--
-- Pages (since the 4 KiB layout): both files are made in 4 KiB pages, and
-- each holds only the tables every store uses from its first request; the
-- others (sections "keyring_on_use", "memory_on_use", "keyring_memories" and
-- "idempotency") are made, empty, by the first write of one of their rows —
-- the log, its triggers and key chunks by the first note, the summaries by
-- the first nap. Every table and every index is at least one page, so that
-- is what an empty identity is made of:
--   keyring.db  4 pages: 1 the schema (sqlite_master), 2 keyring_meta,
--               3 grants, 4 the UNIQUE index on grants.tag
--   memory.db   2 pages: 1 the schema, 2 meta
-- = 6 pages of 4,096 bytes = 24,576 bytes (`python bench/disk.py --empty`).
-- A table missing from a file reads as an empty one, which is what it
-- would hold; the heads cover rows, not whether a table exists (the log head
-- its count, the state head each summary level's frontier and the log's
-- triggers; a memory's key missing is damage), so dropping a table that held
-- rows is refused like deleting the rows.
-- Files written by earlier releases (16 KiB pages, every table made with the
-- file, meta tables with rowids) are served as they are and never converted.
-- SQLite records a plain file's page size in its header, but SQLCipher
-- encrypts that header too, so the key ring's keyring_meta
-- 'memory_page_bytes' says which page size memory.db is read with (absent:
-- 16384, a file from before this). It is read before any key is known, and
-- editing it only makes memory.db fail to open (the first page fails its
-- HMAC), reported as damage: it protects nothing and can leak nothing.
--
-- Sealing: every stored memory, summary, config value and memory key is
-- XChaCha20-Poly1305 with a fresh 24-byte nonce, as nonce||ciphertext||tag,
-- with associated data "stash/v1|<user_id>|<table>|<position>", so a value
-- moved to another row, table or user's file fails to open.
--
-- Designed for what comes next:
-- * Erasing one memory for good without rewriting the log. Each memory is
--   sealed under its OWN random 32-byte key, not under the master key. Those
--   keys live in memory_keys, 128 to a row, the row sealed under the rows key.
--   Erasing memory i re-seals its chunk with key i zeroed (secure_delete
--   overwrites the freed page). The log row is never touched, yet nobody
--   holding every token and every file can open it again. Recall stays one
--   chunk open per 128 memories plus one open per memory.
-- * An authenticated running digest of the log, so truncation or replay of
--   an older copy is detectable. Log rows are immutable — erasure destroys
--   keys, never ciphertext — so a hash chain over (id, sealed) of every log
--   row, keyed by a master-derived key (stash/crypto/chain.py), stays valid
--   forever and is extended with each append. Its head is the meta row
--   'log_head' ("T prev_digest digest", written in the same transaction as
--   the rows), copied as keyring_meta 'log_head' ("T:digest") outside this
--   file. Format 2; a format-1 file gets its chain on first open.

-- @keyring
PRAGMA secure_delete = ON;

-- WITHOUT ROWID: the name is the key, so the table is one B-tree (one page
-- while small) instead of a rowid table and an index on name (two).
CREATE TABLE IF NOT EXISTS keyring_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- One row per capability, live or revoked (format 2; format 1 had no pub/box
-- and `wrapped` held the store's key, see stash/storage/keyring/__init__.py). A
-- grant's power is the box: the current epoch's key sealed to `pub`, whose
-- private key only the token's secret derives. `wrapped` certifies `pub`
-- under the secret's KEK with user, grant id and scope as associated data, so
-- editing `scope` or `pub` makes it fail to open rather than widen it.
-- Revoking sets `wrapped`, `kdf`, `tag`, `pub` and `box` to NULL; the row
-- stays as a record. keyring_meta 'epoch' is the current epoch number and
-- 'epoch_keys' the older epochs' keys sealed under the current one.
CREATE TABLE IF NOT EXISTS grants (
    id       INTEGER PRIMARY KEY,
    tag      BLOB UNIQUE,              -- keyed BLAKE2b of the secret: finds the grant without argon2
    scope    TEXT NOT NULL CHECK (scope IN ('read', 'full', 'owner')),
    created  TEXT NOT NULL,            -- UTC ISO-8601
    revoked  TEXT,                     -- UTC ISO-8601, NULL while live
    kdf      TEXT,                     -- JSON argon2id parameters and salt
    wrapped  BLOB,                     -- the certificate: pub sealed under the KEK
    pub      BLOB,                     -- X25519 public key derived from the KEK
    box      BLOB                      -- the current epoch's number and key, sealed to pub
);

-- @keyring_on_use
-- Made by the first write of a row (Keyring._ensure_table): a store that
-- never labels a grant or records an event has neither.

-- What an owner says a capability is for, and how it is used (one row per
-- grant minted with a label or an expiry, or used since they existed). An
-- expiry is also bound into the grant's wrap (associated data), so editing or
-- deleting it here makes the wrap fail to open rather than extend the grant.
-- The label and last_used (the UTC day of the last authenticated request,
-- written at most once a day per server process) are sealed to the owner key
-- (stash/crypto/owner_seal.py; keyring_meta 'owner_pub', 'owner_box'), bound
-- to user and grant id, so only the owner capability opens them. Key rings
-- from before hold labels under the epoch's label key and days in clear until
-- the owner's first request to an owner route seals them; a new store has
-- its owner key from the start.
CREATE TABLE IF NOT EXISTS grant_notes (
    grant_id   INTEGER PRIMARY KEY,
    label      BLOB,                   -- sealed label, NULL when none
    expires    TEXT,                   -- UTC RFC 3339 "YYYY-MM-DDTHH:MM:SSZ", NULL when none (in clear)
    last_used  TEXT                    -- "sealed:" + hex of the sealed day, NULL until used
);

-- The audit trail (GET /audit): who did what, never what it was about. One
-- row per owner-visible event, sealed whole to the owner key: at = '',
-- grant_id = 0, event = 'sealed', detail = hex of the sealed JSON
-- {at, grant, event, detail} (numbers, block ids and size names only, never
-- memory text, a label or a secret). Rows from before the owner key are in
-- clear until the owner's first request to an owner route seals them.
CREATE TABLE IF NOT EXISTS audit (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL,           -- UTC RFC 3339
    grant_id  INTEGER NOT NULL,        -- the capability that did it
    event     TEXT NOT NULL,           -- mint, revoke, rotate, erase, export, config, forget, import
    detail    TEXT NOT NULL            -- JSON object
);

-- @memory
-- WITHOUT ROWID for the reason given at keyring_meta.
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- @memory_on_use
-- Made by the first write of a row (MemoryFile._ensure_table), each table
-- with its triggers: a memory never written to has none of them, one never
-- napped has no summaries, one that never sets a size or erases a memory has
-- no config, erased or erasures.

-- The append-only log. Memory #i is the row id = i; ids are dense from 0.
-- Plaintext: 2-byte length, "YYYY-MM-DD text", zeros, the writer's grant id
-- in the last 4, padded to the smallest multiple of 32 bytes that holds it
-- (at most 312), so a row's size shows its memory's length to within 32
-- bytes (formats.py, "rows in buckets"). Rows written by earlier releases are
-- all 312 or 320 bytes of plaintext and are read as they are, or stored
-- short by `stash compact` and rebuilt byte for byte when read
-- (formats.py, "rows stored short"; stash/storage/memfile/short_rows.py).
CREATE TABLE IF NOT EXISTS log (
    id      INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

CREATE TRIGGER IF NOT EXISTS log_no_update BEFORE UPDATE ON log
BEGIN SELECT RAISE(ABORT, 'log is append-only'); END;

CREATE TRIGGER IF NOT EXISTS log_no_delete BEFORE DELETE ON log
BEGIN SELECT RAISE(ABORT, 'log is append-only'); END;

-- INSERT OR REPLACE deletes without firing DELETE triggers; refuse it too.
CREATE TRIGGER IF NOT EXISTS log_no_replace BEFORE INSERT ON log
WHEN EXISTS (SELECT 1 FROM log WHERE id = NEW.id)
BEGIN SELECT RAISE(ABORT, 'log is append-only'); END;

-- Per-memory content keys, 128 per chunk: chunk c holds the keys of memories
-- 128c .. 128c+127, created whole when its first memory is written. A zeroed
-- slot is an erased memory.
CREATE TABLE IF NOT EXISTS memory_keys (
    chunk   INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- The summary tree, a cache over the log: block [idx*size, (idx+1)*size).
-- Each level holds a dense prefix idx = 0 .. n-1 (settled strictly in order,
-- forgotten from a point upward), so its count is MAX(idx)+1.
CREATE TABLE IF NOT EXISTS summaries (
    size    INTEGER NOT NULL,
    idx     INTEGER NOT NULL,
    sealed  BLOB NOT NULL,
    PRIMARY KEY (size, idx)
) WITHOUT ROWID;

-- Size overrides (docs/DESIGN.md, "Sizes"); a name absent here follows the default.
CREATE TABLE IF NOT EXISTS config (
    name    TEXT PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- The date of each erased memory, kept so it still renders as
-- "#i DATE [erased]" after its key is gone. Written by erasure only.
CREATE TABLE IF NOT EXISTS erased (
    id      INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- Erasure receipts: which memories were shredded, when, and how many
-- summaries went with them. Never any content.
CREATE TABLE IF NOT EXISTS erasures (
    id      INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- @memory_tails
-- Made by the first erasure of a memory whose row is stored short (a row of
-- a release before "rows in buckets", shortened by `stash compact`;
-- stash/storage/memfile/short_rows.py): the ciphertext the short row leaves
-- out, which is the key stream over its plaintext's zeros. With the key gone
-- it cannot be computed again, and the running digest covers the full row.
-- It holds nothing of the memory's text.
CREATE TABLE IF NOT EXISTS log_tails (
    id      INTEGER PRIMARY KEY,
    tail    BLOB NOT NULL
);

-- @memory_digests
-- Made by the first summary, erasure row or full key chunk of a file at
-- format mark 5 ("rows bound"; stash/storage/memfile/bound.py): the tree of
-- row digests. Each node is a row: a leaf holds the 16-byte digests of up to
-- 124 consecutive rows of one kind (key chunks, erased rows, one summary
-- level), a middle those of up to 124 leaves, the root one (middle, digest)
-- pair per middle. The state head covers the root, and the meta row
-- 'open_chunk' (the digest of the key chunk the newest memory's key is in,
-- which changes with every note and so stays out of the tree), so a row is
-- served only when it is the one the authenticated state holds. It holds
-- nothing of any text.
CREATE TABLE IF NOT EXISTS row_digests (
    node    INTEGER PRIMARY KEY,
    digests BLOB NOT NULL
);

-- @idempotency
-- Idempotency records, in both files: the memory file holds those of
-- POST /note, /nap and /import, the key ring those of POST /grants. One row
-- per keyed write that succeeded, inserted in the same transaction as the
-- write itself, and deleted once older than the retention window. Made by
-- the first write that passes through the idempotency layer (Records.ensure),
-- in files of every release; a new file does not have it.
-- Nothing in a row names the Idempotency-Key or opens without it:
CREATE TABLE IF NOT EXISTS idempotency (
    lookup       BLOB PRIMARY KEY,   -- keyed BLAKE2b of the Idempotency-Key (key: a master-derived subkey)
    fingerprint  BLOB NOT NULL,      -- keyed BLAKE2b of the route and the canonical JSON body
    created      INTEGER NOT NULL,   -- Unix seconds, for the retention window
    sealed       BLOB NOT NULL       -- the answer, padded, sealed under a key derived from the Idempotency-Key
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency(created);

-- @scan_cache
-- In recall.db. The recall cache (stash/storage/recallcache/rendered_log.py): the rendered lines of
-- memories [piece*4096, piece*4096+4095] joined by newlines, compressed (zlib),
-- padded to 4 KiB multiples and sealed as one value, bound to the user, the range and a digest of the nonces of the key
-- chunks that cover it. Rebuildable from the log at any time; an erasure
-- deletes the piece that held the memory. Created by the first recall that
-- writes a piece.
CREATE TABLE IF NOT EXISTS scan_cache (
    piece   INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- @keyring_memories
-- One owner, many memories (docs/DESIGN.md, "Memories"). Memory `main` is
-- the user's folder itself; memory <name> is the same three files in
-- DATA/users/<user_id>/m/<name>/, its own master key, epochs and grants.
-- These tables are made on use, by the first write of one of their rows.

-- In main's key ring only: the lookup tag of every live capability bound to
-- another memory, so a token finds its memory (and the tag index knows it)
-- with one lookup, however many memories the identity holds. A tag is a keyed
-- hash of a secret (never a key); a row left by a crash points at a grant
-- that is not there and opens nothing.
CREATE TABLE IF NOT EXISTS memory_tags (
    tag     BLOB PRIMARY KEY,
    memory  TEXT NOT NULL
);

-- In main's key ring only: the expiry of each capability of memory_tags that
-- has one (UTC RFC 3339, in clear, as in grant_notes), so the tag index
-- refuses an expired token before its request's body is read, as it refuses
-- a revoked one. Trusted only to refuse: the grant's own row still decides.
CREATE TABLE IF NOT EXISTS memory_tag_terms (
    tag      BLOB PRIMARY KEY,
    expires  TEXT NOT NULL
);

-- In each memory's key ring: the append capabilities bound to it. An append
-- capability holds no key at all: `tag` finds it, and `mac` (keyed by the
-- memory's epoch-0 key, which only read-capable holders reach) lets the
-- fold refuse a row nobody minted. Revoking sets `revoked`; tag and mac stay,
-- so the notes it wrote before still fold.
CREATE TABLE IF NOT EXISTS append_grants (
    id       INTEGER PRIMARY KEY,
    tag      BLOB UNIQUE,
    created  TEXT NOT NULL,
    revoked  TEXT,
    mac      BLOB
);

-- In each memory's key ring: notes an append capability wrote, each sealed
-- (libsodium sealed box) to the memory's current epoch public key, waiting
-- to be folded into the log by the next read-capable open. `claim` is the
-- log position its answer named.
CREATE TABLE IF NOT EXISTS inbox (
    seq       INTEGER PRIMARY KEY,
    grant_id  INTEGER NOT NULL,
    epoch     INTEGER NOT NULL,
    claim     INTEGER NOT NULL,
    sealed    BLOB NOT NULL
);

-- In main's key ring only: one row per memory other than main, its random
-- salt and its name (one table, so the first extra memory adds one page here,
-- not two). The owner is enrolled in memory n's key ring under a secret
-- derived from its token's secret and salt n, so deleting memory n (which
-- deletes its row here) leaves nothing of it that the owner token opens, even
-- from copies of its files kept from before. The name is written once the
-- memory is published (renamed to its name), NULL before: what `stash
-- restore` reads to know which memories to bring back from a replica (which
-- it cannot list), the memories main's key ring knew at the moment restored,
-- never one deleted before it nor one a crash cut before its rename. A name is
-- also its folder's name on disk, so it tells a thief nothing more.
CREATE TABLE IF NOT EXISTS memory_salts (
    number  INTEGER PRIMARY KEY,
    salt    BLOB NOT NULL,
    name    TEXT
);

-- @word_cache
-- In recall.db. The word index (stash/storage/recallcache/word_index.py): for memories
-- [piece*4096, piece*4096+4095], their folded words (sorted) and, per word, the
-- memories holding it, padded and sealed as one value, bound exactly as a
-- scan_cache piece is (user, range, key-chunk nonces, erased ids). Rebuildable
-- from the log at any time; an erasure deletes the piece that held the memory.
-- Created by the first word search that writes a piece.
CREATE TABLE IF NOT EXISTS word_cache (
    piece   INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- @word_tail
-- In recall.db. The word index of the memories after the last complete
-- word_cache piece, one piece per 512 memories [piece*512, piece*512+511], in
-- word_cache's format and bound, sealed and deleted exactly as word_cache.
CREATE TABLE IF NOT EXISTS word_tail (
    piece   INTEGER PRIMARY KEY,
    sealed  BLOB NOT NULL
);

-- @word_segs
-- In recall.db. The word index since its segments (stash/storage/recallcache/word_index.py):
-- each word_cache piece cut into sealed segments, seg 0 the lengths of its
-- memories, seg 1..16 the words (and their memories) whose first two characters
-- a keyed hash puts there, so a search opens only the segments its words can
-- match. Each segment padded and sealed as a word_cache piece is, bound also to
-- its seg; an erasure deletes every segment of the piece. Replaces word_cache
-- and word_tail, which the first write of a segment drops (a cache: rebuilt).
CREATE TABLE IF NOT EXISTS word_segs (
    piece   INTEGER NOT NULL,
    seg     INTEGER NOT NULL,
    sealed  BLOB NOT NULL,
    PRIMARY KEY (piece, seg)
);

-- @word_tail_segs
-- In recall.db. The word_tail pieces (512 memories) cut into segments exactly
-- as word_segs cuts a word_cache piece.
CREATE TABLE IF NOT EXISTS word_tail_segs (
    piece   INTEGER NOT NULL,
    seg     INTEGER NOT NULL,
    sealed  BLOB NOT NULL,
    PRIMARY KEY (piece, seg)
);

-- @oauth
-- DATA/oauth.db: one file for the whole server, which every worker opens
-- (stash/storage/oauth_state.py): what an MCP host's OAuth flow needs between
-- two of its requests (docs/DESIGN.md, "Remote MCP"). Times are Unix seconds.
-- No code and no consent nonce is kept, each row filed under a keyed hash of
-- its secret; a capability token only sealed under a key derived from its
-- code, for at most 60 seconds: redeeming the code deletes it, and an
-- unredeemed code's row goes with its grant at its expiry (secure_delete,
-- then the WAL folded into the file and emptied).
CREATE TABLE IF NOT EXISTS oauth_clients (
    client_id  TEXT PRIMARY KEY,   -- a client registered by Dynamic Client Registration (RFC 7591)
    metadata   TEXT NOT NULL,      -- its registration, as answered (JSON)
    created    INTEGER NOT NULL,
    used       INTEGER             -- when the owner first approved it; NULL: never, so it expires
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS oauth_requests (
    id         BLOB PRIMARY KEY,   -- keyed hash of the consent form's nonce
    request    TEXT NOT NULL,      -- the checked authorization request (JSON)
    expires    INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS oauth_codes (
    id         BLOB PRIMARY KEY,   -- keyed hash of the authorization code
    approval   TEXT NOT NULL,      -- JSON: client, redirect URI, PKCE challenge, resource, user, memory, grant
    sealed     BLOB,               -- the capability token sealed under the code; NULL once redeemed
    expires    INTEGER NOT NULL,   -- unredeemed: 60 s after the approval; redeemed: until a replay is moot
    redeemed   INTEGER
) WITHOUT ROWID;
