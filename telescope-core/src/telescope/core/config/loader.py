"""Three-layer loading: packaged defaults -> run YAML -> CLI overrides.

Top-level keys of a later layer replace those of an earlier one (the schema is flat; a
list such as ``environments`` is replaced whole, never merged element by element), except a
dotted override (``--environments.0.kwargs.seed 3``), which sets one value inside the field
as the earlier layers left it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from telescope.core.config.dotted import apply_overrides, split_override_key
from telescope.core.config.errors import ConfigError
from telescope.core.registry import did_you_mean

__all__ = [
    "DEFAULTS_SOURCE",
    "CLI_SOURCE",
    "Layers",
    "load_yaml_file",
    "parse_overrides",
    "parse_yaml_value",
    "resolve_layers",
]

DEFAULTS_SOURCE = "defaults"
CLI_SOURCE = "cli"


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-6 / 5e-7 as floats (YAML 1.1 would read them as strings)."""


_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def parse_yaml_value(text: str) -> Any:
    """Parse one CLI value as YAML (so lists, dicts, null, booleans and 1e-6 work)."""
    return yaml.load(text, Loader=_Loader)


def read_utf8(path: Path) -> str:
    """The text of a config file: UTF-8 (a BOM is allowed), else a ConfigError saying what it is."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"config file '{path}' cannot be read: {exc.strerror or exc}", source=str(path)
        ) from None
    try:
        text = raw.decode("utf-8-sig")
        bad = raw.find(0)  # NUL decodes as UTF-8 but is no text (UTF-16 without a BOM, binary files)
    except UnicodeDecodeError as exc:
        bad = exc.start
    if bad < 0:
        return text
    raise ConfigError(
        f"'{path}' is not a UTF-8 text file ({_looks_like(raw)}; byte 0x{raw[bad]:02x} at offset {bad}); "
        "save it as UTF-8 YAML",
        source=str(path),
    )


def _looks_like(raw: bytes) -> str:
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or raw[:64].count(0) > len(raw[:64]) // 4:
        return "it looks like UTF-16"
    return "it looks like a binary file" if 0 in raw[:1024] else "it is in another encoding"


def load_yaml_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file, bad YAML or a non-mapping is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file '{p}' does not exist (check the path)", source=str(p))
    try:
        data = yaml.load(read_utf8(p), Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"'{p}' is not valid YAML{where}: {problem}", source=str(p)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"'{p}' must be a YAML mapping of field: value, got a {type(data).__name__}", source=str(p)
        )
    return data


def load_defaults() -> dict[str, Any]:
    """The packaged ``default_train.yaml``."""
    text = resources.files("telescope.core.config").joinpath("default_train.yaml").read_text("utf-8")
    return yaml.load(text, Loader=_Loader) or {}


def parse_overrides(args: list[str], known_fields: list[str]) -> dict[str, Any]:
    """Parse ``--field value`` / ``--field=value`` pairs (dashes in names become underscores).

    A ``--field`` followed by another ``--field`` or by nothing sets it to true (``--overwrite``).
    ``--field.key.0 value`` is kept as the key ``"field.key.0"``: ``apply_overrides`` sets it
    inside the field.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"override '{arg}': expected --field value (e.g. --learning_rate 5e-7)")
        key, eq, value = arg[2:].partition("=")
        name, path = split_override_key(key)
        key = ".".join([name, *path])
        if name not in known_fields:
            raise ConfigError(f"override --{key}: unknown field.{did_you_mean(name, known_fields)}".rstrip())
        if not eq and (i + 1 >= len(args) or args[i + 1].startswith("--")):
            out[key] = True  # a bare --flag (--overwrite); a field that is not a bool rejects it by name
            i += 1
            continue
        if not eq:
            i += 1
            value = args[i]
        try:
            out[key] = parse_yaml_value(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override --{key}: value {value!r} is not valid YAML ({exc})") from None
        i += 1
    return out


@dataclass
class Layers:
    """The merged raw config and which layer set each top-level key."""

    merged: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def user_keys(self) -> set[str]:
        """Keys set by the run YAML or the CLI (not by the defaults)."""
        return {k for k, s in self.sources.items() if s != DEFAULTS_SOURCE}


def resolve_layers(
    path: str | Path | None,
    overrides: list[str] | dict[str, Any] | None,
    known_fields: list[str],
) -> Layers:
    """Merge the three layers, recording the source of every key."""
    layers = Layers(merged={})
    stack: list[tuple[str, dict[str, Any]]] = [(DEFAULTS_SOURCE, load_defaults())]
    if path is not None:
        stack.append((str(path), load_yaml_file(path)))
    if isinstance(overrides, dict):
        stack.append((CLI_SOURCE, dict(overrides)))
    elif overrides:
        stack.append((CLI_SOURCE, parse_overrides(list(overrides), known_fields)))
    for source, data in stack:
        if source == CLI_SOURCE:  # only the command line has dotted keys (a YAML key is a field)
            layers.merged = apply_overrides(layers.merged, data)
            layers.sources.update({split_override_key(key)[0]: source for key in data})
            continue
        for key, value in data.items():
            layers.merged[key] = value
            layers.sources[key] = source
    return layers
