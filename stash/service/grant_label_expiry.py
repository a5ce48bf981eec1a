"""What an owner may say about a capability when minting it: a label (what
it is for) and an expiry. Pure checks; the key ring stores them."""

from __future__ import annotations

import datetime as dt
import re

from ..core.errors import Invalid
from ..storage import keyring

LABEL_MAX_BYTES = 64
_RFC3339_UTC = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.\d{1,9})?(?:[Zz]|\+00:00)")


def check_label(label: object) -> str | None:
    """1 to 64 bytes of printable UTF-8 text (no control or separator
    characters, so a listing line cannot be forged), surrounding spaces
    removed; None when absent."""
    if label is None:
        return None
    if not isinstance(label, str) or not label.strip() or not label.isprintable():
        raise Invalid(
            f'label must be printable text of 1 to {LABEL_MAX_BYTES} bytes, like "CI bot".', code="grants.bad_label"
        )
    label = label.strip()
    if len(label.encode()) > LABEL_MAX_BYTES:
        raise Invalid(f"label is {len(label.encode())} bytes; at most {LABEL_MAX_BYTES}.", code="grants.bad_label")
    return label


def check_expires(expires: object, now: dt.datetime) -> str | None:
    """An RFC 3339 UTC time after ``now`` (``Z`` or ``+00:00``; fractions of
    a second are dropped), written back as ``YYYY-MM-DDTHH:MM:SSZ``; None
    when absent."""
    if expires is None:
        return None
    m = _RFC3339_UTC.fullmatch(expires) if isinstance(expires, str) else None
    try:
        when = dt.datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}+00:00") if m else None
    except ValueError:
        when = None
    if when is None:
        raise Invalid("expires must be an RFC 3339 UTC time, like 2027-01-31T18:00:00Z.", code="grants.bad_expires")
    if when <= now:
        raise Invalid("expires is not in the future; give a later UTC time.", code="grants.bad_expires")
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


expired = keyring.expired
