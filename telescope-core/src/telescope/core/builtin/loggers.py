"""Core built-in plugin: loggers (registers nothing until its issue lands)."""

from __future__ import annotations
