"""The run directory's schema: file layout, record types, append-only JSONL and block files, the
reader behind ``telescope runs show`` and the dashboard (docs/run-directory.md).
"""
