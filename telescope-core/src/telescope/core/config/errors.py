"""Configuration errors: one readable message per problem, never a traceback."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from telescope.core.registry import did_you_mean

__all__ = ["ConfigError", "problems_from_validation_error"]


class ConfigError(ValueError):
    """A configuration problem the user can fix. ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f" ({source})" if source else ""
        super().__init__(f"invalid configuration{where}:\n" + "\n".join(f"  - {p}" for p in self.problems))


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problems_from_validation_error(
    err: ValidationError, *, prefix: str = "", known_fields: list[str] | None = None
) -> list[str]:
    """Translate a pydantic error into lines naming the field, the bad value and what is allowed."""
    problems: list[str] = []
    unions: dict[str, int] = {}
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # Union members add their type name to the location; drop those for readability.
        loc = tuple(p for p in loc if p not in ("int", "bool", "str", "float", "none", "list[str]"))
        field = prefix + _path(loc) if loc else prefix.rstrip(".")
        kind = e["type"]
        if not field:  # a cross-field rule: its message names the fields involved
            problems.append(e["msg"].removeprefix("Value error, "))
        elif kind == "extra_forbidden":
            name = str(loc[-1]) if loc else "?"
            candidates = _sibling_fields(loc, known_fields) if not prefix else []
            hint = did_you_mean(name, candidates)
            problems.append(f"{field}: unknown field.{hint}".rstrip())
        elif kind == "missing":
            problems.append(f"{field}: required field is missing")
        else:
            msg = e["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
            merged = unions.get(field)
            if merged is not None:  # another member of a union: one line, "a or b"
                problems[merged] = problems[merged].replace(" (got", f", or {msg} (got", 1)
                continue
            unions[field] = len(problems)
            problems.append(
                f"{field}: {'should be ' if msg != e['msg'] and 'Input' in e['msg'] else ''}{msg} (got {e.get('input')!r})"
            )
    return _dedupe(problems)


def _sibling_fields(loc: tuple[Any, ...], known_fields: list[str] | None) -> list[str]:
    """Valid names next to an unknown key (top level, or inside an environment/eval entry)."""
    from telescope.core.config.entries import EnvironmentEntry, EvalEntry

    if len(loc) == 1:
        return known_fields or []
    nested: dict[str, type[BaseModel]] = {"environments": EnvironmentEntry, "evals": EvalEntry}
    model = nested.get(str(loc[0]))
    return list(model.model_fields) if model is not None and len(loc) == 3 else []


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]  # type: ignore[func-returns-value]
