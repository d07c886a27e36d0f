"""Core built-in plugin: engines (registers nothing until its issue lands)."""

from __future__ import annotations
