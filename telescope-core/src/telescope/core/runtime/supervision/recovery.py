"""Trainer recovery: a run whose trainer died restarts from its latest checkpoint.

A dead trainer rank (its process killed, a gloo/NCCL error, a lost node) leaves the
optimizer state of the ranks out of step; the only safe continuation is the last
checkpoint. The driver stops every process, starts them again and resumes through the
ordinary resume path (trainer state, orchestrator counters and the prompt ledger), so no
step is lost or trained twice. A failure that repeats at the same step (same exception
type and message) is deterministic: restarting would only repeat it, so the run stops.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.observe.stdio import tail_lines

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.runtime.checkpointing import ResumePoint

__all__ = [
    "DeadRank",
    "FailureSignature",
    "RestartPlan",
    "TrainerDiedError",
    "dead_trainer_ranks",
    "restart_point",
]

log = logging.getLogger("telescope.runtime")


class TrainerDiedError(RuntimeError):
    """A trainer rank's process died; the message names the rank (its last log lines are in the log)."""

    complete_reason = True  # ``describe_failure`` shows this message, not the Ray error behind it


@dataclass(frozen=True)
class DeadRank:
    """A trainer rank found dead after a failure."""

    rank: int
    pid: int | None
    detail: str
    log_tail: list[str]

    def describe(self) -> str:
        pid = f" (pid {self.pid})" if self.pid else ""
        return f"trainer rank {self.rank}{pid} died: {self.detail}"


@dataclass(frozen=True)
class RestartPlan:
    """Restart the run from ``point`` after the failure ``reason``."""

    point: ResumePoint
    reason: str


@dataclass(frozen=True)
class FailureSignature:
    """What makes two failures "the same": root exception type and message, and the step."""

    type: str
    message: str
    step: int


def signature(exc: BaseException, step: int, dead: list[DeadRank]) -> FailureSignature:
    from telescope.core.errors import root_cause
    from telescope.core.runtime.supervision.heartbeat import TrainerHungError

    if dead:  # the pids and actor ids in a death report differ every time: the ranks are what repeats
        return FailureSignature("TrainerDied", ",".join(str(d.rank) for d in dead), step)
    cause = root_cause(exc)
    if isinstance(cause, TrainerHungError):  # its durations differ every time: the ranks repeat
        return FailureSignature("TrainerHung", ",".join(str(r) for r in cause.ranks), step)
    first = (str(cause).strip().splitlines() or [""])[0]
    return FailureSignature(type(cause).__name__, first, step)


def dead_trainer_ranks(trainers: list[Any], timeout_s: float = 10.0) -> list[DeadRank]:
    """Ask every trainer rank whether it lives (after a failure); the dead ones with their last log lines."""
    import ray

    refs = [actor.node_ip.remote() for actor in trainers]
    dead = []
    for rank, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayActorError as exc:
            pid = _pid(str(exc))
            dead.append(DeadRank(rank, pid, _death_detail(str(exc)), _worker_log_tail(pid)))
        except Exception:  # noqa: BLE001 - alive but busy, or unreachable: not known dead
            continue
    return dead


def _pid(text: str) -> int | None:
    found = re.search(r"\bpid: (\d+)", text)  # Ray's ActorDiedError lists the worker's pid this way
    return int(found.group(1)) if found else None


def _death_detail(text: str) -> str:
    """The line of Ray's report that says why the process ended."""
    found = re.search(r"Worker exit detail: (.*?)(?: Some common causes|$)", " ".join(text.split()))
    if found:
        return f"its process ended ({found.group(1).strip()})"
    return (text.strip().splitlines() or ["the actor died"])[0]


def _worker_log_tail(pid: int | None, lines: int = 20) -> list[str]:
    """The last lines of the worker's stderr and stdout files in Ray's session log folder."""
    if pid is None:
        return []
    try:
        import ray

        node: Any = ray._private.worker._global_node
        logs = Path(node.get_logs_dir_path())
    except Exception:  # noqa: BLE001 - private Ray API: no tail rather than no recovery
        return []
    out: list[str] = []
    for path in sorted(logs.glob(f"worker-*-{pid}.err")) + sorted(logs.glob(f"worker-*-{pid}.out")):
        out += [f"[{path.name}] {line}" for line in tail_lines(path, lines) if line.strip()]
    return out[-lines:]


def restart_point(cfg: TelescopeConfig) -> ResumePoint | None:
    """The latest checkpoint of the run (a ``ResumePoint``), or None when there is none."""
    from telescope.core.config import ConfigError
    from telescope.core.runtime.checkpointing import find_resume_point

    if not cfg.checkpoint_every and not cfg.resume_from_checkpoint:
        return None
    try:
        return find_resume_point(cfg.model_copy(update={"resume_from_checkpoint": True}))
    except ConfigError:  # no complete checkpoint yet
        return None


def report_dead(dead: list[DeadRank], step: int) -> TrainerDiedError:
    """Log each dead rank with its last log lines; the one-line error naming them."""
    for d in dead:
        tail = "\n".join(f"    {line}" for line in d.log_tail) or "    (no log lines found)"
        log.error("%s at step %d; its last log lines:\n%s", d.describe(), step, tail)
    return TrainerDiedError(
        "; ".join(d.describe() for d in dead) + f" (at step {step}; its last log lines are "
        "in logs/telescope.log)"
    )
