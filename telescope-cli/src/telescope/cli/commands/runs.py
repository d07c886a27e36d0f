"""``telescope runs show RUN_DIR``: a terminal summary of a run from its local files alone."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from telescope.cli.errors import say
from telescope.cli.health import run_health
from telescope.cli.style import new_app
from telescope.core.infra import summary as infra_summary
from telescope.core.observe.rundir.reader import RunDirError, RunDirReader
from telescope.core.observe.stats import split_metric_key
from telescope.core.observe.stdio import printable_data

app = new_app(help="Inspect run directories.", no_args_is_help=True)

FINDINGS_SHOWN = 10
"""``runs show`` lists the latest this many health findings (``--json`` has every recorded one)."""


@app.callback()
def _runs() -> None:
    """Inspect run directories (a callback keeps ``show`` a subcommand, not the whole app)."""


#: Config fields shown in the summary, in this order (those missing are skipped).
HIGHLIGHT_KEYS = (
    "model",
    "algorithm",
    "train_backend",
    "inference_engine",
    "environments",
    "number_of_steps",
    "group_size",
    "prompts_batch_size_for_trainer",
    "learning_rate",
    "max_async_rollout",
    "max_off_policy_steps",
    "seq_len",
    "seed",
)
_BARS = "▁▂▃▄▅▆▇█"
#: Step metrics a reader looks for first, in this order (those missing are skipped).
HEADLINE_METRICS = ("reward/mean", "loss", "entropy", "kl_divergence_inference", "grad_norm")


def _is_timing(key: str) -> bool:
    return key.startswith(("timing_", "timing/"))


def metric_order(keys: list[str]) -> list[str]:
    """Headline metrics first, then the rest by section (``General`` first, the others A-Z),
    group and name; timing rows last, so they never push reward and loss off the screen."""

    def rank(key: str) -> tuple[int, int, str, str, str]:
        if key in HEADLINE_METRICS:
            return (0, HEADLINE_METRICS.index(key), "", "", "")
        section, group, metric = split_metric_key(key) if key else ("", "", "")
        return (2 if _is_timing(key) else 1, section != "General", section, group, metric)

    return sorted(keys, key=rank)


def display_model(run: RunDirReader, cfg: dict[str, Any]) -> str:
    """The model as the user named it: run.json's ``info.model``, else config.yaml's value with
    a built-in model's folder mapped back to its name (run dirs written before ``info.model``)."""
    from telescope.core.models.tiny import builtin_model_name

    named = run.meta.get("info", {}).get("model")
    return str(named) if named else builtin_model_name(str(cfg.get("model", "")))


def sparkline(values: list[float], width: int = 60) -> str:
    """One character per bucket of consecutive values (bucket mean), scaled min..max."""
    if not values:
        return ""
    n = min(width, len(values))
    buckets = [values[i * len(values) // n : (i + 1) * len(values) // n] for i in range(n)]
    means = [sum(b) / len(b) for b in buckets]
    lo, hi = min(means), max(means)
    if hi == lo:
        return _BARS[len(_BARS) // 2] * n
    return "".join(_BARS[round((m - lo) / (hi - lo) * (len(_BARS) - 1))] for m in means)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and value and isinstance(value[0], dict) and "name" in value[0]:
        return ", ".join(str(v["name"]) for v in value)
    return str(value)


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _header(console: Console, run: RunDirReader, steps: list[dict[str, Any]]) -> None:
    meta = run.meta
    last = steps[-1]["step"] if steps else "-"
    console.print(
        f"[bold]Run[/] {escape(str(meta.get('name', '')))}  id {meta.get('run_id')}  [bold]{meta.get('status')}[/]"
    )
    console.print(
        f"  dir {escape(str(run.path))}  schema v{meta.get('schema_version')}  starts {meta.get('starts', 1)}"
    )
    console.print(f"  steps logged {len(steps)}  last step {last}")
    health = run_health(meta, time.time())
    if health["text"]:
        style = {"slow": "yellow", "overdue": "red"}.get(health["state"], "")
        word = {"slow": "slow: ", "overdue": "overdue: "}.get(health["state"], "")
        line = f"  {word}{health['text']}"
        console.print(f"[{style}]{escape(line)}[/]" if style else escape(line))


def health_findings(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The health sentinel's verdict as run.json's ``info.health`` holds it (None: not recorded)."""
    health = (meta.get("info") or {}).get("health")
    return health if isinstance(health, dict) else None


def _findings(console: Console, meta: dict[str, Any]) -> None:
    """``Health: <state>`` and one line per finding (the latest ``FINDINGS_SHOWN``)."""
    health = health_findings(meta)
    if health is None:
        return
    state, findings = str(health.get("state", "ok")), health.get("findings") or []
    style = {"ok": "green", "warning": "yellow"}.get(state, "red")
    count = health.get("count", len(findings))
    rollbacks = f", {health['rollbacks']} rollback(s)" if health.get("rollbacks") else ""
    console.print(f"[bold]Health[/] [{style}]{escape(state)}[/]: {count} finding(s){rollbacks}")
    for f in findings[-FINDINGS_SHOWN:]:
        line = f"  step {f.get('step')}  {f.get('name')} ({f.get('action')}): {f.get('evidence')}"
        console.print(line, markup=False)


def _config(console: Console, cfg: dict[str, Any], model: str) -> None:
    table = Table(title="Config highlights", show_header=False, title_justify="left")
    for key in HIGHLIGHT_KEYS:
        if key in cfg:
            table.add_row(key, model if key == "model" else _fmt(cfg[key]))
    console.print(table)


def _reward_curve(console: Console, run: RunDirReader, key: str) -> None:
    series = run.metric_series(key)
    if not series:
        console.print(f"[bold]Reward curve[/] ({escape(key)}): no data yet")
        return
    values = [v for _, v in series]
    console.print(f"[bold]Reward curve[/] ({escape(key)}, steps {series[0][0]}..{series[-1][0]})")
    console.print(f"  {sparkline(values)}")
    console.print(
        f"  first {values[0]:.4f}  last {values[-1]:.4f}  min {min(values):.4f}  max {max(values):.4f}"
    )


def _latest(console: Console, steps: list[dict[str, Any]], limit: int) -> None:
    if not steps:
        return
    rec = steps[-1]
    keys = metric_order(list(rec.get("metrics", {})))
    if limit <= 0:
        console.print(
            f"[bold]Latest step metrics[/] (step {rec['step']}): {len(keys)} not listed (use --metrics N)"
        )
        return
    table = Table(title=f"Latest step metrics (step {rec['step']})", title_justify="left")
    for col in ("section", "group", "metric", "value"):
        table.add_column(col)
    for key in keys[:limit]:
        section, group, metric = split_metric_key(key)
        table.add_row(section, group, metric, _fmt(rec["metrics"][key]))
    console.print(table)
    if len(keys) > limit:
        console.print(f"  ... {len(keys) - limit} more (use --metrics N)")


def _evals(console: Console, run: RunDirReader, limit: int) -> None:
    """The latest value of each eval metric (names made printable: they come from the run directory)."""
    """The latest record of each eval: its step and up to ``limit`` metrics."""
    latest = printable_data(run.latest_evals())
    if not latest:
        return
    if limit <= 0:
        console.print(
            f"[bold]Latest evals[/]: {', '.join(sorted(latest))} (metrics not listed; use --metrics N)"
        )
        return
    table = Table(title="Latest evals", title_justify="left")
    hidden = 0
    for col, justify in (("eval", "left"), ("step", "right"), ("metric", "left"), ("value", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name in sorted(latest):
        rec = latest[name]
        metrics = rec.get("metrics", {}) or {}
        keys = sorted(metrics)[:limit]
        hidden += max(len(metrics) - limit, 0)
        for i, key in enumerate(keys or ["-"]):
            value = _fmt(metrics[key]) if key in metrics else "-"
            table.add_row(name if i == 0 else "", str(rec.get("step")) if i == 0 else "", key, value)
    console.print(table)
    if hidden:
        console.print(f"  ... {hidden} more eval metrics (use --metrics N)")


def _discards(console: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    reasons = Counter(r.get("discard_reason") or "kept" for r in rows)
    kinds = Counter(r.get("zero_advantage_kind") for r in rows if r.get("discard_reason") == "zero_advantage")
    table = Table(title="Rollouts by outcome (all steps)", title_justify="left")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    table.add_column("pct", justify="right")
    total = sum(reasons.values()) or 1
    for reason, count in reasons.most_common():
        table.add_row(reason, str(count), f"{100 * count / total:.1f}%")
    console.print(table)
    if kinds:
        parts = ", ".join(f"{k or 'unknown'} {v}" for k, v in kinds.most_common())
        console.print(f"  zero_advantage samples by kind: {parts}")


def _infra(console: Console, steps: list[dict[str, Any]]) -> None:
    """One line on the infrastructure failures under samples (retried, masked, by cause), when any."""
    line = infra_summary(steps[-1].get("metrics", {})) if steps else None
    if line is not None:
        console.print(f"[bold]Infrastructure[/] (all steps): {escape(line)}")


def sample_rows(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` kept rollouts of the last step that has rollouts."""
    if not rows or n <= 0:
        return []
    last_step = max(r["step"] for r in rows)
    return [r for r in rows if r["step"] == last_step and r.get("kept")][:n]


def _samples(console: Console, rows: list[dict[str, Any]], n: int, width: int) -> None:
    if not rows or n <= 0:
        return
    last_step = max(r["step"] for r in rows)
    kept = [r for r in rows if r["step"] == last_step and r.get("kept")]
    console.print(f"[bold]Sample rollouts[/] (step {last_step}, {min(n, len(kept))} of {len(kept)} kept)")
    for r in kept[:n]:
        console.print(
            f"  {escape('[' + str(r.get('env')) + ']')} group {r.get('group_id')} #{r.get('sample_id')}  reward {r.get('reward'):.4g}"
            f"  adv {r.get('advantage'):.4g}  stop {r.get('stop_reason')}  tokens {r.get('completion_tokens')}"
        )
        console.print(f"    prompt:     {_clip(r.get('prompt_text', ''), width)}", markup=False)
        console.print(f"    completion: {_clip(r.get('completion_text', ''), width)}", markup=False)


def summary_json(
    run: RunDirReader, cfg: dict[str, Any], steps: list[dict[str, Any]], rows: list[dict[str, Any]], n: int
) -> dict[str, Any]:
    """What ``show`` prints, as data: the records as the run directory holds them (every step,
    not only the latest), so scripts need not parse the tables."""
    return {
        "run_dir": str(run.path),
        "run": run.meta,
        "health": run_health(run.meta, time.time()),
        "health_findings": health_findings(run.meta),
        "model": display_model(run, cfg),
        "config": cfg,
        "steps": steps,
        "latest_evals": run.latest_evals(),
        "rollout_outcomes": dict(Counter(r.get("discard_reason") or "kept" for r in rows)),
        "infra": infra_summary(steps[-1].get("metrics", {})) if steps else None,
        "samples": sample_rows(rows, n),
    }


@app.command("show")
def show(
    run_dir: Path = typer.Argument(..., help="Run directory (holds run.json)."),
    rollouts: int = typer.Option(3, "--rollouts", help="Sample rollouts to print."),
    metrics: int = typer.Option(40, "--metrics", help="Latest-step metrics to print (0: none)."),
    reward_key: str = typer.Option(
        "reward/mean", "--reward_key", "--reward-key", help="Step metric drawn as the curve."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object instead."),
) -> None:
    """Summarise a run: config highlights, reward curve, latest metrics and evals, discards, sample rollouts."""
    try:
        run = RunDirReader(run_dir)
    except RunDirError as exc:
        say("error:", exc)
        raise typer.Exit(code=2) from None
    console = Console(highlight=False, soft_wrap=False)
    steps = run.steps()
    rows = run.rollouts()
    cfg = run.config()
    if as_json:  # JSON escapes control characters itself
        typer.echo(json.dumps(summary_json(run, cfg, steps, rows, rollouts), default=str))
        return
    # Everything printed comes from the run directory: no escape sequence of it reaches the terminal.
    run.meta, steps, rows, cfg = (
        printable_data(run.meta),
        printable_data(steps),
        printable_data(rows),
        printable_data(cfg),
    )
    _header(console, run, steps)
    _findings(console, run.meta)
    _config(console, cfg, display_model(run, cfg))
    _reward_curve(console, run, reward_key)
    _latest(console, steps, metrics)
    _evals(console, run, metrics)
    _discards(console, rows)
    _infra(console, steps)
    _samples(console, rows, rollouts, width=100)
    for fname, problem in run.problems().items():
        console.print(f"[yellow]note:[/] {escape(fname)}: {escape(problem)}")
