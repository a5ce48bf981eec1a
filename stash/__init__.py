"""Stash: permanent, encrypted memory for AI agents, served over HTTP."""

__version__ = "0.1.0"
