"""Evals on lent servers: held at the eval step's weights, drained and restored, nothing lost."""

from __future__ import annotations

import asyncio
from typing import Any

from fakes import FakeClient, ToyEnv
from test_orchestrator import build, varied_reply, varied_reward

from telescope.core.evals.aggregate import EvalResult
from telescope.core.runtime.eval_control import EvalController


class FakeEvalRunner:
    """Records which servers ran which evals at which step; each eval takes ``seconds``."""

    def __init__(self, cfg: Any, seconds: float) -> None:
        self.cfg, self.seconds = cfg, seconds
        self.calls: list[tuple[int, list[str], list[int]]] = []

    async def close(self) -> None:
        self.closed = True

    def due(self, step: int) -> list[Any]:
        return [e for e in self.cfg.evals if step % e.eval_every == 0]

    async def run(self, entries: list[Any], clients: list[Any], step: int) -> list[EvalResult]:
        self.calls.append((step, [e.name for e in entries], [c.index for c in clients]))
        await asyncio.sleep(self.seconds)
        return [EvalResult(e.name, step, {"score": float(step)}) for e in entries]


def build_with_evals(tokenizer: Any, **overrides: Any) -> tuple[Any, Any, list[Any]]:
    """A 6-step run on 3 servers with the ``toy`` eval every 2 steps; its orchestrator, trainer and clients."""
    clients = [FakeClient(varied_reply(tokenizer), delay=lambda rid: 0.01) for _ in range(3)]
    for i, c in enumerate(clients):
        c.index = i  # type: ignore[attr-defined]
    fields = {
        "number_of_steps": 6,
        "max_async_rollout": 1,
        "discard_group_zero_advantage": False,
        "inference_num_workers": 3,
        "evals": [{"name": "toy", "eval_every": 2}],
        **overrides,
    }
    orch, trainer, _ = build(tokenizer, ToyEnv(varied_reward, n=40), clients, **fields)
    return orch, trainer, clients


def make(
    tokenizer: Any, seconds: float, **overrides: Any
) -> tuple[Any, Any, FakeEvalRunner, list[Any], list[Any]]:
    orch, trainer, clients = build_with_evals(tokenizer, **overrides)
    runner = FakeEvalRunner(orch.cfg, seconds)
    logged: list[tuple[int, list[Any]]] = []
    controller = EvalController(
        orch.cfg, runner, clients, lambda step, results: logged.append((step, results))
    )
    orch.hooks.append(controller)

    async def main() -> None:
        await controller.before_training(resumed=False)
        await orch.run()
        await controller.after_training(orch)

    asyncio.run(main())
    return orch, trainer, runner, clients, logged


def test_periodic_evals_run_on_the_eval_server_held_at_the_eval_step(tokenizer: Any) -> None:
    orch, trainer, runner, clients, logged = make(tokenizer, seconds=0.4)
    # Baseline on every server, then steps 2, 4 and 6 on the last server; 6 is not repeated at the end.
    assert runner.calls == [(0, ["toy"], [0, 1, 2]), (2, ["toy"], [2]), (4, ["toy"], [2]), (6, ["toy"], [2])]
    assert [step for step, _ in logged] == [0, 2, 4, 6]
    held_versions = {v for v, hold in zip(trainer.versions, trainer.holds, strict=True) if 2 in hold}
    assert held_versions, "a 0.4 s eval outlasts a training step: later syncs must hold the eval server"
    assert all(hold <= {2} for hold in trainer.holds)
    # No training request reached server 2 with weights it had not loaded.
    for request in clients[2].requests:
        rid = request["request_id"]
        version = int(rid.rsplit("-v", 1)[1].split("-")[0])
        assert rid in clients[2].aborted or version not in held_versions, rid


def test_drained_groups_are_requeued_not_lost(tokenizer: Any) -> None:
    orch, trainer, _, _, _ = make(tokenizer, seconds=0.2)
    trained = [g.group_id for b in trainer.batches for g in b.groups]
    assert len(trained) == len(set(trained))
    used = sorted(trained + [i.group_id for i in orch.prompts.outstanding()])
    assert used == list(range(len(used)))


def test_final_eval_brings_held_servers_to_the_final_weights(tokenizer: Any) -> None:
    # eval_every 5 with 6 steps: the eval at step 5 outlasts step 6, whose sync holds server 2.
    _, trainer, runner, _, _ = make(tokenizer, seconds=0.6, evals=[{"name": "toy", "eval_every": 5}])
    assert runner.calls[-1] == (6, ["toy"], [0, 1, 2])
    assert trainer.versions[-1] == 6 and trainer.holds[-1] == set()
    assert 2 in trainer.holds[trainer.versions.index(6)], "step 6's own sync was held"


def test_a_plugin_failing_on_periodic_eval_results_ends_the_run_naming_the_hook(tokenizer: Any) -> None:
    import pytest

    from telescope.core.errors import RunStageError

    def report(step: int, results: list[Any]) -> None:
        if step == 2:
            raise RuntimeError("plugin bug in eval_end")

    orch, trainer, clients = build_with_evals(tokenizer)
    controller = EvalController(orch.cfg, FakeEvalRunner(orch.cfg, 0.0), clients, report)
    orch.hooks.append(controller)

    async def main() -> None:
        await orch.run()
        await controller.after_training(orch)

    with pytest.raises(RunStageError, match="the telescope_eval_end hook failed: RuntimeError: plugin bug"):
        asyncio.run(main())
    assert len(trainer.batches) < 6  # the run stopped, it did not go on with a warning


def test_a_periodic_eval_over_the_infra_failure_rate_ends_the_run(tokenizer: Any) -> None:
    """The evals count in the run's ledger (``EvalRunner(..., infra=orchestrator.infra)``): a periodic
    eval that takes the failure rate above ``infra_max_failure_rate`` ends the run at the next step,
    as training's own failures would; any other failed eval is only reported."""
    import pytest

    from telescope.core.rollouts.outcomes import InfraRateError

    class RateExceedingRunner(FakeEvalRunner):
        async def run(self, entries: list[Any], clients: list[Any], step: int) -> list[EvalResult]:
            raise InfraRateError("infrastructure failures: 3 of the last 3 sample attempts (100%) failed")

    orch, trainer, clients = build_with_evals(tokenizer)
    controller = EvalController(orch.cfg, RateExceedingRunner(orch.cfg, 0.0), clients, lambda *_: None)
    orch.hooks.append(controller)

    async def main() -> None:
        await orch.run()
        await controller.after_training(orch)

    from telescope.core.errors import RunStageError

    with pytest.raises(
        RunStageError, match="EvalController failed: InfraRateError: infrastructure failures: 3 of"
    ):
        asyncio.run(main())
    assert len(trainer.batches) < 6  # the run stopped, it did not go on with a warning
