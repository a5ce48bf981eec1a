"""Stash: permanent, encrypted memory for AI agents, served over HTTP."""

# The one declaration of the version: pyproject.toml reads it (hatch's version source), /health and
# /openapi.json answer it, and CHANGELOG.md's newest release is it (tests/unit/test_version.py).
__version__ = "0.4.0"
