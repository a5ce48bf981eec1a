"""The client address behind trusted proxies: X-Forwarded-For is read only
from a trusted peer, from the right, and never believed past the first
address no trusted proxy vouches for."""

from __future__ import annotations

import pytest

from stash.web.forwarded import MAX_HOPS, UNKNOWN, TrustedProxies, parse_network

LOCAL = TrustedProxies(["127.0.0.1", "::1", "10.0.0.0/8"])


def test_nothing_is_trusted_by_default():
    assert TrustedProxies().client("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"
    assert TrustedProxies().client("198.51.100.4", ["203.0.113.9"]) == "198.51.100.4"


def test_an_untrusted_peer_is_the_client_whatever_it_sends():
    assert LOCAL.client("198.51.100.4", ["127.0.0.1"]) == "198.51.100.4"
    assert LOCAL.client("198.51.100.4", ["not an address"]) == "198.51.100.4"


def test_a_trusted_peer_names_the_client():
    assert LOCAL.client("127.0.0.1", ["203.0.113.9"]) == "203.0.113.9"
    assert LOCAL.client("::1", ["2001:db8::7"]) == "2001:db8::7"


def test_the_right_most_untrusted_entry_wins_over_what_the_client_wrote():
    # The client sent "1.1.1.1, 127.0.0.1"; the proxy appended what it saw.
    assert LOCAL.client("127.0.0.1", ["1.1.1.1, 127.0.0.1, 203.0.113.9"]) == "203.0.113.9"
    # Two trusted hops (an edge proxy at 10.1.2.3 in front of the local one).
    assert LOCAL.client("127.0.0.1", ["1.1.1.1, 203.0.113.9, 10.1.2.3"]) == "203.0.113.9"


def test_several_header_fields_are_one_list_in_order():
    assert LOCAL.client("127.0.0.1", ["1.1.1.1", "203.0.113.9, 10.1.2.3"]) == "203.0.113.9"


def test_no_header_from_a_trusted_peer_is_the_peer():
    assert LOCAL.client("127.0.0.1", []) == "127.0.0.1"
    assert LOCAL.client("127.0.0.1", [""]) == "127.0.0.1"


def test_a_chain_of_only_proxies_is_its_left_most_entry():
    assert LOCAL.client("127.0.0.1", ["10.9.9.9, 10.1.2.3"]) == "10.9.9.9"


@pytest.mark.parametrize(
    "header",
    [
        "garbage",
        "203.0.113.9:443",
        "203.0.113.9 , , 10.1.2.3",
        "999.1.1.1",
        "1.1.1.1,",
        "\x00\xff",
        "2001:db8::1/64",
        "[2001:db8::1",
        "=" * 5000,
    ],
)
def test_an_unreadable_entry_before_the_client_makes_it_unknown(header):
    assert LOCAL.client("127.0.0.1", [header]) == UNKNOWN


def test_unreadable_entries_left_of_the_client_do_not_matter():
    assert LOCAL.client("127.0.0.1", ["garbage, 203.0.113.9"]) == "203.0.113.9"


def test_bracketed_and_mapped_addresses_are_read_as_addresses():
    assert LOCAL.client("127.0.0.1", ["[2001:db8::5]"]) == "2001:db8::5"
    assert LOCAL.client("::ffff:127.0.0.1", ["::ffff:203.0.113.9"]) == "203.0.113.9"


def test_a_chain_longer_than_max_hops_of_proxies_is_unknown():
    chain = ", ".join(["203.0.113.9"] + ["10.0.0.1"] * (MAX_HOPS + 5))
    assert LOCAL.client("127.0.0.1", [chain]) == UNKNOWN
    short = ", ".join(["203.0.113.9"] + ["10.0.0.1"] * (MAX_HOPS - 1))
    assert LOCAL.client("127.0.0.1", [short]) == "203.0.113.9"


def test_a_peer_that_is_not_an_address_is_passed_through():
    assert LOCAL.client("-", ["203.0.113.9"]) == "-"


def test_networks_are_parsed_strictly():
    assert str(parse_network("10.0.0.0/8")) == "10.0.0.0/8"
    assert str(parse_network("127.0.0.1")) == "127.0.0.1/32"
    assert str(parse_network("::1")) == "::1/128"
    for bad in ("10.0.0.1/8", "localhost", "", "10.0.0.0/33"):
        with pytest.raises(ValueError):
            parse_network(bad)
