"""``telescope eval``: evaluate checkpoints (native or HF) with the training eval definitions.

Per checkpoint: a native checkpoint is converted to a temporary HF folder; the engine
plugin launches ``inference_num_workers`` servers (no Ray); every eval runs through
``EvalRunner``; results go to ``<run_dir>/evals/metrics.jsonl`` (one line per checkpoint and
eval) and ``<run_dir>/evals/samples.jsonl``, and to W&B when enabled; the servers are
stopped and the converted copy deleted whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.config.errors import ConfigError
from telescope.core.evals.aggregate import EvalResult, flat_metrics
from telescope.core.evals.standalone_config import CheckpointRef, EvalRunConfig, training_config

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["discover_checkpoints", "evaluate_checkpoints", "hf_folder", "launch_servers"]

_STEP_DIR = re.compile(r"^step_(\d+)$")
Progress = Callable[[str, int, int], None]


def discover_checkpoints(run: EvalRunConfig) -> list[CheckpointRef]:
    """Checkpoints to evaluate, by step: discovered, then ``model``, then explicit ones (which win)."""
    from telescope.core.checkpoint.layout import is_hf_checkpoint
    from telescope.core.checkpoint.manager import CheckpointManager

    found: dict[int, CheckpointRef] = {}
    if run.checkpoint_dir:
        root = Path(run.checkpoint_dir)
        native = set(CheckpointManager(root).steps())
        hf = {
            int(m.group(1))
            for p in (root.iterdir() if root.is_dir() else [])
            if (m := _STEP_DIR.match(p.name)) and is_hf_checkpoint(p)
        }
        if not native | hf:
            raise ConfigError(
                f"checkpoint_dir: {root} holds no complete step_<N> checkpoint (native with "
                "meta.json, or an HF folder); check the path"
            )
        found.update({s: CheckpointRef(path=str(root / f"step_{s}"), step=s) for s in sorted(native | hf)})
    if run.model:
        found[run.model_step] = CheckpointRef(path=run.model, step=run.model_step)
    found.update({c.step: c for c in run.checkpoints})
    return [found[s] for s in sorted(found)]


@contextlib.contextmanager
def hf_folder(ref: CheckpointRef) -> Iterator[str]:
    """An HF model for ``ref``: native checkpoints are converted into a temporary folder."""
    from telescope.core.checkpoint.layout import is_native_checkpoint

    if not is_native_checkpoint(ref.path):
        if Path(ref.path).exists() or not ref.path.startswith(("/", ".")):
            yield ref.path  # an HF folder, or a hub name
            return
        raise ConfigError(f"checkpoints: {ref.path} (step {ref.step}) does not exist")
    from telescope.core.checkpoint.convert import convert_checkpoint

    with tempfile.TemporaryDirectory(prefix=f"telescope-eval-step{ref.step}-") as tmp:
        yield str(convert_checkpoint(ref.path, Path(tmp) / "hf"))


def launch_servers(cfg: TelescopeConfig, registry: Any, engine_name: str, log_dir: Path) -> list[Any]:
    """Start every server of ``cfg`` through the engine plugin and wait until all are healthy."""
    engine = registry.create("inference_engine", engine_name, cfg.inference_engine_kwargs, cfg=cfg)
    config_path = engine.write_config(log_dir)
    servers: list[Any] = []
    try:
        for i in range(engine.num_servers):
            servers.append(engine.launch(i, log_dir=str(log_dir), config_path=config_path, wait=False))
        for server in servers:
            server.wait_ready(engine.kwargs.startup_timeout_s)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: list[Any]) -> None:
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop(grace_s=5.0)


def _tokenizer(cfg: TelescopeConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


async def _evaluate_one(
    cfg: TelescopeConfig, registry: Any, engine: str, step: int, log_dir: Path, progress: Progress | None
) -> list[EvalResult]:
    from telescope.core.evals.runner import EvalRunner
    from telescope.core.inference.client import InferenceClient
    from telescope.core.inference.faults import with_request_faults

    runner = await asyncio.to_thread(
        EvalRunner, cfg, registry, await asyncio.to_thread(_tokenizer, cfg), progress
    )
    servers = await asyncio.to_thread(launch_servers, cfg, registry, engine, log_dir)
    clients = [InferenceClient(s.url) for s in servers]
    try:
        return await runner.run(list(cfg.evals), with_request_faults(list(clients)), step)
    finally:
        for client in clients:
            await client.close()
        await asyncio.to_thread(stop_servers, servers)
        await runner.close()


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, default=str) + "\n")


def write_results(out_dir: Path, ref: CheckpointRef, results: list[EvalResult]) -> None:
    """Append one results line per eval and one samples line per eval sample."""
    from telescope.core.observe.loggers.local import eval_sample_record

    now = time.time()
    _append(
        out_dir / "metrics.jsonl",
        [
            {"step": ref.step, "name": r.name, "checkpoint": ref.path, "time": now, "metrics": r.metrics}
            for r in results
        ],
    )
    _append(
        out_dir / "samples.jsonl",
        [
            {**eval_sample_record(ref.step, r.name, row), "checkpoint": ref.path}
            for r in results
            for row in r.rows
        ],
    )


class WandbEvalSink:
    """Logs ``eval/<name>/<metric>`` against an ``eval/step`` axis (a resumed run's history may be ahead)."""

    def __init__(self, run: EvalRunConfig) -> None:
        import wandb

        out = run.resolved_run_dir
        out.mkdir(parents=True, exist_ok=True)
        if run.wandb_run_path:
            entity, project, run_id = run.wandb_run_path.split("/")
            self.run = wandb.init(entity=entity, project=project, id=run_id, resume="must", dir=str(out))
        else:
            self.run = wandb.init(
                project=run.wandb_project, job_type="eval", config=run.model_dump(mode="json"), dir=str(out)
            )
        self.run.define_metric("eval/step")
        self.run.define_metric("eval/*", step_metric="eval/step")

    def log(self, step: int, results: list[EvalResult]) -> None:
        self.run.log({"eval/step": step, **flat_metrics(results)})

    def finish(self) -> None:
        self.run.finish()


async def evaluate_checkpoints(
    run: EvalRunConfig,
    registry: Any,
    *,
    progress: Progress | None = None,
    on_checkpoint: Callable[[CheckpointRef, list[EvalResult]], None] | None = None,
) -> list[tuple[CheckpointRef, list[EvalResult]]]:
    """Evaluate every checkpoint of ``run`` in step order (see the module docstring)."""
    from telescope.core.inference.auto import resolve_inference_engine

    refs = discover_checkpoints(run)
    engine, _ = resolve_inference_engine(run.inference_engine)
    out_dir = run.resolved_run_dir / "evals"
    out_dir.mkdir(parents=True, exist_ok=True)
    sink = WandbEvalSink(run) if run.use_wandb else None
    done: list[tuple[CheckpointRef, list[EvalResult]]] = []
    try:
        for ref in refs:
            with hf_folder(ref) as folder:
                cfg = training_config(run, folder, engine)
                log_dir = run.resolved_run_dir / "logs" / "eval_inference" / f"step_{ref.step}"
                results = await _evaluate_one(cfg, registry, engine, ref.step, log_dir, progress)
            write_results(out_dir, ref, results)
            if sink is not None:
                sink.log(ref.step, results)
            if on_checkpoint is not None:
                on_checkpoint(ref, results)
            done.append((ref, results))
    finally:
        if sink is not None:
            sink.finish()
    return done
