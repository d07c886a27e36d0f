"""Sample outcomes (``rollouts/outcomes.py``): an infrastructure failure is retried, then masked, never
scored 0; the group trains on its remaining samples; too many failures end the run naming the cause."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes import FakeClient, ToyEnv
from test_orchestrator import build, varied_reply, varied_reward

from telescope.core import infra
from telescope.core.rollouts.outcomes import InfraLedger, InfraPolicy, InfraRateError


def failing_reply(tokenizer: Any, fails: Any) -> Any:
    """``varied_reply``, except that a request ``fails(request_id)`` picks dies as an infrastructure failure."""
    reply = varied_reply(tokenizer)

    def answer(prompt: list[int], rid: str) -> list[int]:
        if fails(rid):
            raise infra.failure(f"server died answering {rid}", cause="server_died", provider="fake")
        return list(reply(prompt, rid))

    return answer


def sample_index(rid: str) -> int:
    return int(rid.split("-")[1].removeprefix("s"))


def trained_groups(trainer: Any) -> list[Any]:
    return [g for batch in trainer.batches for g in batch.groups]


def total(steps: list[dict[str, float]], key: str) -> float:
    return sum(m.get(key, 0.0) for m in steps)


def test_a_sample_failing_for_the_infrastructure_runs_again_and_is_never_scored(tokenizer: Any) -> None:
    infra.ORIGINS.drain()
    first_try_of_sample_1 = lambda rid: sample_index(rid) == 1 and "-r" not in rid  # noqa: E731
    client = FakeClient(failing_reply(tokenizer, first_try_of_sample_1))
    orch, trainer, recorder = build(tokenizer, ToyEnv(varied_reward), client, infra_retry_backoff_s=0.0)
    asyncio.run(orch.run())
    groups = trained_groups(trainer)
    assert groups and all(len(g.samples) == 4 for g in groups)  # every sample came back, scored
    assert all(s.completion_ids and s.reward > 0 for g in groups for s in g.samples)  # no fake 0
    failed_first = [r for r in client.requests if first_try_of_sample_1(r["request_id"])]
    retried = [r for r in client.requests if "-r1" in r["request_id"]]
    assert len(retried) == len(failed_first) > 0
    steps = recorder.steps
    assert total(steps, "infra/failed") == total(steps, "infra/retried") == len(failed_first)
    assert total(steps, "infra/cause/server_died") == len(failed_first)  # counted where it happened
    assert (
        total(steps, "infra/env/toy/retried")
        == total(steps, "infra/provider/fake/failed")
        == len(failed_first)
    )
    assert total(steps, "infra/masked") == 0 and orch.counts.rollout_errors == 0
    assert total(steps, "infra/groups_hit") == len(failed_first)  # one failing sample per group
    assert steps[-1]["totals/infra/retried"] == len(failed_first)


def test_out_of_retries_a_sample_is_masked_and_its_group_trains_on_the_rest(tokenizer: Any) -> None:
    infra.ORIGINS.drain()
    # samples 2 and 3 of every group always fail; in group 0 sample 1 as well (one sample left)
    always = lambda rid: sample_index(rid) >= 2 or rid.startswith("g0-s1")  # noqa: E731
    client = FakeClient(failing_reply(tokenizer, always))
    orch, trainer, recorder = build(
        tokenizer,
        ToyEnv(varied_reward),
        client,
        infra_retry_backoff_s=0.0,
        infra_max_retries_per_sample=1,
        infra_max_failure_rate=1.0,
        discard_group_zero_advantage=False,
    )
    asyncio.run(orch.run())
    groups = trained_groups(trainer)
    assert groups and all(len(g.samples) == 2 and g.info["masked_samples"] == 2 for g in groups)
    for g in groups:  # advantages over the 2 remaining samples: they sum to 0 (the masked ones took no part)
        assert sum(s.advantage for s in g.samples) == pytest.approx(0.0, abs=1e-6)
        assert all(s.completion_ids for s in g.samples)
    dropped = [g for _, g in recorder.groups if g.discard_reason == "infra_error"]
    assert [g.group_id for g in dropped] == [0]  # one sample left: no advantage to compute
    tried: dict[str, int] = {}
    for r in client.requests:
        key = r["request_id"].split("-v")[0]
        tried[key] = tried.get(key, 0) + 1
    for g in [*groups, *dropped]:  # each masked sample ran twice (once more after its failure), then stopped
        masked = [i for i in range(4) if always(f"g{g.group_id}-s{i}")]
        assert [tried[f"g{g.group_id}-s{i}"] for i in masked] == [2] * len(masked)
    assert orch.infra.totals["masked"] >= 2 * len(groups) + 3
    assert orch.counts.rollout_errors == 0


def test_a_failure_rate_above_the_limit_ends_the_run_naming_provider_and_cause(tokenizer: Any) -> None:
    client = FakeClient(failing_reply(tokenizer, lambda rid: sample_index(rid) != 0))
    orch, trainer, _ = build(
        tokenizer,
        ToyEnv(varied_reward),
        client,
        infra_retry_backoff_s=0.0,
        infra_max_failure_rate=0.5,
        infra_failure_window=16,
    )
    with pytest.raises(InfraRateError, match=r"provider 'fake', cause 'server_died'") as raised:
        asyncio.run(orch.run())
    assert "infra_max_failure_rate=0.5" in str(raised.value) and "sample attempts" in str(raised.value)
    assert not trainer.batches


def test_an_infrastructure_failure_inside_the_reward_is_not_a_reward_of_0(tokenizer: Any) -> None:
    from telescope.core.sandbox import SandboxNotRunningError

    infra.ORIGINS.drain()
    seen: set[str] = set()

    def reward(completion: str, sample: Any) -> float:
        key = f"{sample.prompt}:{completion}"
        if key not in seen:  # the first scoring of each distinct completion: the sandbox is lost
            seen.add(key)
            error = SandboxNotRunningError("sandbox terminated by the provider")
            infra.mark(error, cause="sandbox_lost", provider="local")  # as the sandbox layer does
            raise error
        return float(len(completion))

    orch, trainer, recorder = build(
        tokenizer, ToyEnv(reward), FakeClient(varied_reply(tokenizer)), infra_retry_backoff_s=0.0
    )
    asyncio.run(orch.run())
    samples = [s for g in trained_groups(trainer) for s in g.samples]
    assert samples and all(s.reward > 0 and not s.sample_metrics.get("reward_error") for s in samples)
    assert total(recorder.steps, "infra/retried") > 0
    assert total(recorder.steps, "infra/cause/sandbox_lost") >= total(recorder.steps, "infra/retried")


def test_the_ledger_decides_retry_then_mask_and_backs_off_doubling() -> None:
    ledger = InfraLedger(InfraPolicy(max_retries=2, backoff_s=1.5, max_failure_rate=0.5, window=4))
    error = infra.InfraError("x", cause="sandbox_create", provider="modal")
    assert [ledger.failed("code", error, n) for n in range(3)] == [True, True, False]
    assert [ledger.policy.backoff(n) for n in (1, 2, 3, 10)] == [1.5, 3.0, 6.0, 60.0]
    ledger.attempt_finished()
    assert ledger.rate_exceeded() is not None  # 3 of 4 failed
    ledger.attempt_finished()
    assert ledger.rate_exceeded() is None  # the window slid: 2 of 4 is not above 0.5
    m = ledger.step_metrics()
    assert (m["infra/failed"], m["infra/retried"], m["infra/masked"]) == (3.0, 2.0, 1.0)
    assert m["infra/provider/modal/masked"] == 1.0 and m["infra/env/code/failed"] == 3.0
    assert ledger.step_metrics()["infra/failed"] == 0.0 and ledger.totals["failed"] == 3
    with pytest.raises(ValueError, match="cause 'disk' is not one of"):
        infra.InfraError("x", cause="disk", provider="p")  # type: ignore[arg-type]
