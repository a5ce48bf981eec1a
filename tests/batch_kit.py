"""Helpers shared by tests, moved whole from tests/e2e/test_batch_clients.py so that no test module imports another."""

from __future__ import annotations

from tests.printed import orders


def tail_command(output: str) -> str:
    """The last command handed over: a batch's answer is a here-document
    that spans several lines."""
    return orders(output)[-1]
