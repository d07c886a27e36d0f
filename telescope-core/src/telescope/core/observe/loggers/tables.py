"""Rows and scalars the remote loggers (W&B, TensorBoard, MLflow) show the same way.

One rollout is one row of ``ROLLOUT_TABLE_COLUMNS`` (token ids stay in the local run
directory); an eval's scores become ``eval/<name>/<metric>`` scalars; tables that a
logger can only show as text are rendered as Markdown here, once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from telescope.core.observe.rundir.records import RolloutRecord

__all__ = [
    "ROLLOUT_TABLE_COLUMNS",
    "eval_scalars",
    "eval_table",
    "finite_scalars",
    "markdown_table",
    "rollout_table_row",
    "table_cell",
]

#: Columns of the ``rollouts`` table (token ids stay in the local rollouts blocks).
ROLLOUT_TABLE_COLUMNS = [
    "step",
    "group_id",
    "sample_id",
    "env",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "kept",
    "discard_reason",
    "stop_reason",
    "model_version",
    "prompt_tokens",
    "completion_tokens",
    "server",
    "lane",
    "sample_metrics",
]


def rollout_table_row(r: RolloutRecord) -> list[Any]:
    """``r`` as one row of ``ROLLOUT_TABLE_COLUMNS``."""
    return [
        r.step,
        r.group_id,
        r.sample_id,
        r.env,
        r.prompt_text,
        r.completion_text,
        r.reward,
        r.advantage,
        r.kept,
        r.discard_reason or "",
        r.stop_reason,
        r.model_version,
        r.prompt_tokens,
        r.completion_tokens,
        r.server,
        r.lane,
        json.dumps(r.sample_metrics, sort_keys=True),
    ]


def table_cell(value: Any) -> Any:
    """A table cell: scalars and text as they are, anything else as JSON text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def eval_table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(columns, data) of an eval's per-sample rows: every key any row has, sorted."""
    columns = sorted({key for row in rows for key in row})
    return columns, [[table_cell(row.get(c)) for c in columns] for row in rows]


def eval_scalars(name: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """``{"eval/<name>/<metric>": value}`` for the numeric metrics of one eval."""
    return {f"eval/{name}/{key}": value for key, value in finite_scalars(metrics, finite=False).items()}


def finite_scalars(values: Mapping[str, Any], *, finite: bool = True) -> dict[str, float]:
    """The int/float entries of ``values`` as floats (bools and text dropped; NaN/inf too when ``finite``)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not finite or math.isfinite(value):
                out[key] = float(value)
    return out


def _md_cell(value: Any, max_chars: int) -> str:
    text = str(table_cell(value))
    if len(text) > max_chars:
        text = text[:max_chars] + f"… (+{len(text) - max_chars} chars)"
    # A Markdown table row is one line and ``|`` separates cells.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def markdown_table(columns: Sequence[str], data: Sequence[Sequence[Any]], *, max_chars: int = 2000) -> str:
    """A Markdown table (cells cut at ``max_chars``, newlines as ``<br>``) for text-only viewers."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_cell(v, max_chars) for v in row) + " |" for row in data]
    return "\n".join(lines)
