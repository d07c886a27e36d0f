"""The Metrics page's Custom view, kept on the server next to the runs.

The layout (sections, each a name and its metric keys, in order) is one JSON file under the
runs root, ``<root>/.telescope-ui/layout.json``: any browser, host name or port serving the same
runs sees it. Named copies (export/import) are ``<root>/.telescope-ui/layouts/<name>.json``; a
name is a plain file name, never a path, and every file is checked to resolve inside the root.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from telescope.core.observe.rundir.layout import write_json_atomic

__all__ = ["LayoutError", "LayoutStore", "validate_layout"]

UI_DIR = ".telescope-ui"
LAYOUT_FILE = "layout.json"
EXPORTS_DIR = "layouts"
MAX_SECTIONS = 100
MAX_KEYS = 500
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")


class LayoutError(ValueError):
    """A layout or a layout name the server refuses (the message says what to change)."""


def validate_layout(value: Any) -> list[dict[str, Any]]:
    """``[{"name": str, "keys": [str, ...]}, ...]`` from a request body's ``sections``."""
    if not isinstance(value, list) or len(value) > MAX_SECTIONS:
        raise LayoutError(
            f"layout sections must be a list of at most {MAX_SECTIONS} sections, got {type(value).__name__}"
        )
    out = []
    for i, section in enumerate(value):
        if not isinstance(section, dict) or not isinstance(section.get("name"), str):
            raise LayoutError(
                f"layout section {i} must be an object with a string 'name', got {section!r:.80}"
            )
        keys = section.get("keys", [])
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(keys) > MAX_KEYS:
            raise LayoutError(
                f"layout section {section['name']!r}: 'keys' must be a list of at most {MAX_KEYS} metric keys (strings)"
            )
        out.append({"name": section["name"][:200], "keys": list(dict.fromkeys(keys))})
    return out


class LayoutStore:
    """The layout file and the named exports under ``root`` (see module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.dir = self.root / UI_DIR

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root):
            raise LayoutError(f"{path} resolves to {resolved}, outside the runs root {self.root}: refused")
        return resolved

    def _named(self, name: Any) -> Path:
        if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
            raise LayoutError(
                f"layout name {name!r} is not a plain name: use letters, digits, '_', '-' and '.' (at most 64, no path)"
            )
        return self._inside(self.dir / EXPORTS_DIR / f"{name}.json")

    def _read(self, path: Path) -> list[dict[str, Any]]:
        path = self._inside(path)
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise LayoutError(f"{path} is not a readable layout ({exc}): fix or delete it") from None
        return validate_layout(data.get("sections") if isinstance(data, dict) else data)

    def _write(self, path: Path, sections: list[dict[str, Any]]) -> Path:
        path = self._inside(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._inside(path.parent)  # a symlinked folder must not lead out either
        write_json_atomic(path, {"sections": sections})
        return path

    def load(self) -> list[dict[str, Any]]:
        return self._read(self.dir / LAYOUT_FILE)

    def save(self, sections: Any) -> list[dict[str, Any]]:
        valid = validate_layout(sections)
        self._write(self.dir / LAYOUT_FILE, valid)
        return valid

    def exported(self) -> list[str]:
        folder = self.dir / EXPORTS_DIR
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []

    def export(self, name: Any) -> Path:
        """The current layout, copied to ``layouts/<name>.json``."""
        return self._write(self._named(name), self.load())

    def import_(self, name: Any) -> list[dict[str, Any]]:
        """``layouts/<name>.json`` becomes the current layout."""
        path = self._named(name)
        if not path.exists():
            raise LayoutError(
                f"no exported layout {name!r}: known are {', '.join(self.exported()) or 'none'}"
            )
        return self.save(self._read(path))
