"""Odd input at the HTTP edge: digits that are not ASCII, negative numbers,
invented methods. Each gets a clear error, never a 500, and nothing of it
reaches a metric label or a log line."""

from __future__ import annotations

import logging

import pytest

from tests.support.api import Api, assert_error


@pytest.mark.parametrize("url", ["/shape?T=%C2%B2", "/shape?lines=%D9%A3", "/shape?T=-1"])
def test_public_numbers_must_be_ascii_digits(api: Api, url: str) -> None:
    assert_error(api.get(url), 422, "request.bad_value")


@pytest.mark.parametrize("query", ["part=%C2%B2", "T=%C2%B2", "part=%D9%A3"])
def test_wake_numbers_must_be_ascii_digits(api: Api, owner: str, query: str) -> None:
    assert_error(api.get(f"/wake?{query}", owner), 422, "request.bad_value")


@pytest.mark.parametrize("body", [{"T": -5}, {"part": -1}, {"part": 1.5}, {"T": "3"}])
def test_wake_twin_numbers_are_whole_and_not_negative(api: Api, owner: str, body: dict) -> None:
    resp = api.post("/wake", owner, json=body)
    if body == {"T": "3"}:
        assert_error(resp, 422, "wake.bad_t")  # a digit string is a number; the log is empty
    else:
        assert_error(resp, 422, "request.bad_value")


def test_grant_ids_must_be_ascii_digits(api: Api, owner: str) -> None:
    assert_error(api.delete("/grants/%C2%B2", owner), 404, "grants.unknown")


def test_an_invented_method_reaches_no_label_and_no_log(api: Api, caplog) -> None:
    marker = "QWERTYMETHOD"
    with caplog.at_level(logging.INFO, logger="stash"):
        resp = api.request(marker, "/health")
    assert_error(resp, 405)
    assert marker not in api.get("/metrics").text
    assert all(marker not in r.getMessage() for r in caplog.records)
    assert any("OTHER" in r.getMessage() for r in caplog.records if r.name == "stash.access")
