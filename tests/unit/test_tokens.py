"""Capability tokens (stash.crypto.tokens) against docs/DESIGN.md, "Tokens".

The format is rebuilt here from the design's text alone — its own base62, its own
CRC32 checksum, its own regex — so the module is checked against the contract
rather than against itself. Tokens are minted at run time; none is written in
this file.
"""

from __future__ import annotations

import random
import re
import string
import zlib

import pytest

from stash.crypto import tokens
from tests.support.api import matched, token_parts

B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase  # 0-9A-Za-z (docs/DESIGN.md, "Tokens")
SPEC_SHAPE = re.compile(r"stash1_[0-9a-f]{16}_[0-9A-Za-z]{43}[0-9A-Za-z]{6}")


def b62(n: int, width: int) -> str:
    """Big-endian base62, zero-padded to ``width`` digits."""
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(B62[r])
    assert n == 0, "value does not fit the width"
    return "".join(reversed(out))


def un_b62(digits: str) -> int:
    n = 0
    for c in digits:
        n = n * 62 + B62.index(c)
    return n


def spec_checksum(body: str) -> str:
    return b62(zlib.crc32(body.encode("ascii")), 6)


def forge(user_id: str, secret_digits: str) -> str:
    """A token text with a correct checksum for whatever parts it is given."""
    body = f"stash1_{user_id}_{secret_digits}"
    return body + spec_checksum(body)


@pytest.fixture
def minted() -> tuple[str, str, bytes]:
    user_id = tokens.new_user_id()
    text, secret = tokens.mint(user_id)
    return user_id, text, secret


def test_minted_token_has_the_spec_shape(minted):
    user_id, text, secret = minted
    assert SPEC_SHAPE.fullmatch(text)
    assert re.fullmatch(tokens.TOKEN_PATTERN, text)
    assert text.startswith(f"stash1_{user_id}_")
    assert len(secret) == 32
    # The 43 digits carry the secret itself, big-endian.
    assert un_b62(text[24:67]) == int.from_bytes(secret, "big")


def test_checksum_is_base62_crc32_of_everything_before_it(minted):
    _, text, _ = minted
    assert text[-6:] == spec_checksum(text[:-6])


def test_published_pattern_finds_a_token_inside_other_text(minted):
    # Secret scanners search logs and pastes, not isolated strings.
    _, text, _ = minted
    blob = f"export STASH_TOKEN={text}\n# other stuff"
    assert matched(re.search(tokens.TOKEN_PATTERN, blob)).group(0) == text


def test_parse_round_trips_mint(minted):
    user_id, text, secret = minted
    tok = tokens.parse(text)
    assert tok is not None
    assert tok.user_id == user_id
    assert tok.secret == secret


def test_many_mints_are_distinct_and_all_parse():
    user_id = tokens.new_user_id()
    seen = set()
    for _ in range(200):
        text, secret = tokens.mint(user_id)
        assert token_parts(text).secret == secret
        seen.add(secret)
    assert len(seen) == 200


def test_new_user_ids_are_16_lowercase_hex():
    for _ in range(50):
        uid = tokens.new_user_id()
        assert re.fullmatch(r"[0-9a-f]{16}", uid)
        assert tokens.is_user_id(uid)


@pytest.mark.parametrize("bad", ["", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "0123456789abcdeg"])
def test_mint_refuses_a_malformed_user_id(bad):
    with pytest.raises(ValueError):
        tokens.mint(bad)


def test_every_single_character_substitution_is_refused(minted):
    # A CRC32 catches every single-character change; the test tries every
    # position, with a spread of replacement characters at each.
    _, text, _ = minted
    rng = random.Random(1234)
    pool = B62 + "_-.+/= \t~é"
    tried = 0
    for pos in range(len(text)):
        replacements = {c for c in rng.sample(pool, 24) if c != text[pos]}
        replacements |= {c for c in (B62[(B62.find(text[pos]) + 1) % 62], "_") if c != text[pos]}
        for c in replacements:
            mutated = text[:pos] + c + text[pos + 1 :]
            assert tokens.parse(mutated) is None, (pos, c)
            tried += 1
    assert tried > 20 * len(text)


def test_adjacent_transpositions_are_refused(minted):
    _, text, _ = minted
    for pos in range(len(text) - 1):
        if text[pos] == text[pos + 1]:
            continue
        swapped = text[:pos] + text[pos + 1] + text[pos] + text[pos + 2 :]
        assert tokens.parse(swapped) is None, pos


def test_wrong_length_is_refused_even_with_a_correct_checksum(minted):
    user_id, text, _ = minted
    digits = text[24:67]
    assert tokens.parse(text[:-1]) is None
    assert tokens.parse(text + "0") is None
    assert tokens.parse(forge(user_id, digits[:-1])) is None
    assert tokens.parse(forge(user_id, "0" + digits)) is None
    assert tokens.parse(forge(user_id[:-1], digits)) is None
    assert tokens.parse(forge(user_id + "a", digits)) is None


def test_uppercase_user_id_is_refused_even_with_a_correct_checksum(minted):
    user_id, text, _ = minted
    digits = text[24:67]
    upper = user_id.upper()
    if upper == user_id:  # all digits: force a hex letter in
        upper = "A" + user_id[1:]
    assert tokens.parse(forge(upper, digits)) is None
    # The forge helper itself is sound: the lowercase original comes back.
    assert tokens.parse(forge(user_id, digits)) is not None


@pytest.mark.parametrize("wrap", [" {}", "{} ", "{}\n", "\t{}", "{}\r\n", "\u00a0{}", "{}\x00"])
def test_surrounding_whitespace_is_refused(minted, wrap):
    _, text, _ = minted
    assert tokens.parse(wrap.format(text)) is None


def test_inner_whitespace_is_refused(minted):
    _, text, _ = minted
    assert tokens.parse(text[:30] + " " + text[31:]) is None


def test_a_secret_of_2_to_the_256_or_more_is_refused():
    # 43 base62 digits can hold more than 256 bits; those values are not secrets.
    user_id = tokens.new_user_id()
    for n in (2**256, 2**256 + 1, (2**256 + 62**43) // 2, 62**43 - 1):
        assert tokens.parse(forge(user_id, b62(n, 43))) is None, n


def test_the_largest_and_smallest_secrets_are_accepted():
    user_id = tokens.new_user_id()
    top = tokens.parse(forge(user_id, b62(2**256 - 1, 43)))
    assert top is not None and top.secret == b"\xff" * 32
    zero = tokens.parse(forge(user_id, b62(0, 43)))
    assert zero is not None and zero.secret == bytes(32)


@pytest.mark.parametrize("prefix", ["stash2", "Stash1", "stash1x", "stash"])
def test_another_prefix_is_refused(minted, prefix):
    user_id, text, _ = minted
    body = f"{prefix}_{user_id}_{text[24:67]}"
    assert tokens.parse(body + spec_checksum(body)) is None


@pytest.mark.parametrize("junk", ["", "stash1_", "Bearer x", "x" * 10_000, "\u0661" * 73])
def test_junk_is_refused(junk):
    assert tokens.parse(junk) is None


def test_non_ascii_digits_of_the_right_length_are_refused(minted):
    # Unicode decimal digits match \d in some engines; the token alphabet is ASCII.
    _, text, _ = minted
    mutated = text[:7] + "\u0660" + text[8:]
    assert tokens.parse(mutated) is None


def test_lookup_tag_depends_on_user_and_secret():
    secret = bytes(range(32))
    a, b = tokens.new_user_id(), tokens.new_user_id()
    assert a != b
    assert tokens.lookup_tag(a, secret) != tokens.lookup_tag(b, secret)
    assert tokens.lookup_tag(a, secret) == tokens.lookup_tag(a, secret)
    assert tokens.lookup_tag(a, secret) != tokens.lookup_tag(a, secret[:-1] + b"\x00")
    tag = tokens.lookup_tag(a, secret)
    assert isinstance(tag, bytes) and len(tag) >= 16
    # The tag is stored in the keyring: it must not carry the secret.
    assert secret[:16] not in tag and secret[16:] not in tag


def test_repr_of_a_token_hides_the_secret(minted):
    _, text, secret = minted
    tok = tokens.parse(text)
    for shown in (repr(tok), str(tok), f"{tok!r}", f"{tok}", repr([tok]), repr({"t": tok})):
        assert secret.hex() not in shown
        assert repr(secret) not in shown
        assert text[24:67] not in shown
        assert text not in shown


def test_user_ids_can_be_minted_within_a_shard():
    for _ in range(200):
        uid = tokens.new_user_id(("a", "3f"))
        assert tokens.is_user_id(uid) and uid.startswith(("a", "3f")), uid
    seen = {tokens.new_user_id(("0", "1", "2"))[0] for _ in range(300)}
    assert seen == {"0", "1", "2"}
    # The rest stays random: 300 ids of one prefix are 300 ids.
    assert len({tokens.new_user_id(("c",)) for _ in range(300)}) == 300
    assert [tokens.is_id_prefix(p) for p in ("a", "3f", "ffff", "", "A", "12345", "g")] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
    ]
