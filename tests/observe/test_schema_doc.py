"""docs/run-directory.md against the code: every documented field is written, every written one documented.

The tables of the document are parsed (backticked names in the first column), so a field
added to a record, or a metric key added to ``rollout_metrics``, fails here until the
schema document lists it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from telescope.core.observe import RolloutRecord, RunDirReader, perf_metrics, rollout_metrics
from telescope.core.observe.rundir.records import EVENT_TYPES, TimelineEvent

DOC = Path(__file__).parents[2] / "docs" / "run-directory.md"


def _section(title: str) -> str:
    """The text of the ``## title`` section, up to the next ``## ``."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _first_column_names(section: str) -> list[str]:
    """Backticked names in the first cell of every table row (header and rule rows skipped)."""
    names = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names += re.findall(r"`([^`]+)`", first)
    return names


def _expand(pattern: str) -> list[str]:
    """``a/{x,y}/b`` -> ``[a/x/b, a/y/b]`` (several brace groups multiply)."""
    parts = re.split(r"\{([^}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _regex(name: str) -> re.Pattern[str]:
    """A documented key with ``<env>``/``<name>`` placeholders as a regex."""
    return re.compile("^" + re.sub(r"<[a-z]+>", "[^/]+", re.escape(name)) + "$")


def test_rollout_fields_match_the_document() -> None:
    documented = set(_first_column_names(_section("rollouts/block_{k}.jsonl.zst")))
    # the token view's fields are written only when set: a record with them has every field
    token_view = {"completion_token_texts": ["a"], "completion_logprobs": [-0.1]}
    written = set(RolloutRecord(step=1, group_id=0, env="e", sample_id=0, **token_view).to_dict())
    assert documented == written
    assert written - set(RolloutRecord(step=1, group_id=0, env="e", sample_id=0).to_dict()) == set(token_view)


def test_run_json_fields_match_the_document(synthetic_run: Path) -> None:
    documented = set(_first_column_names(_section("run.json")))
    assert documented == set(RunDirReader(synthetic_run).meta)


def test_event_fields_and_types_match_the_document() -> None:
    section = _section("events/block_{k}.jsonl.zst and events/tail.jsonl.zst")
    listed = re.search(r"`\{([^}]*)\}`", section.replace("\n", " "))
    assert listed is not None, "the event record's field list is missing from the document"
    documented = {f.strip() for f in listed.group(1).split(",")}
    assert documented == set(TimelineEvent(type="run").to_dict())
    assert _first_column_names(section) == list(EVENT_TYPES)


def _metric_patterns() -> list[str]:
    section = _section("metrics.jsonl")
    table = section[section.index("| key | meaning |") : section.index("Gini:")]
    names = [n for cell in _first_column_names(table) for n in _expand(cell)]
    perf = section[section.index("Orchestrator throughput") :]
    return names + re.findall(r"`(perf/[a-z_]+)`", perf)


@pytest.fixture
def produced(make_rows) -> set[str]:
    """Every key rollout_metrics and perf_metrics can produce, from constructed steps."""
    rows = make_rows(1)  # kept, max_async, zero_advantage and off_policy rows, one environment
    other_env = [
        RolloutRecord(
            step=1,
            group_id=9,
            env="other",
            sample_id=i,
            reward=float(i) / 2,
            raw_reward=float(i),
            completion_ids=[1],
        )  # a declared range 0..2 normalised it
        for i in range(2)
    ]
    drained = [RolloutRecord(step=1, group_id=8, env="e", sample_id=0, discard_reason="eval_drain")]
    keys = set(rollout_metrics(rows + other_env + drained))
    return keys | set(perf_metrics(1.0, 10, async_level=0))


def test_every_produced_metric_is_documented(produced: set[str]) -> None:
    patterns = [_regex(p) for p in _metric_patterns()]
    undocumented = sorted(k for k in produced if not any(p.match(k) for p in patterns))
    assert undocumented == []


def test_every_documented_metric_is_produced(produced: set[str]) -> None:
    never = sorted(p for p in _metric_patterns() if not any(_regex(p).match(k) for k in produced))
    assert never == []
