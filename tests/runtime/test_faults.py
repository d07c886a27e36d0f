"""The fault injector: its spec parses into typed faults or fails clearly; unset, it does nothing."""

from __future__ import annotations

import asyncio
import zlib
from types import SimpleNamespace
from typing import Any

import pytest

from telescope.core import faults
from telescope.core.faults import FaultSpec, FaultSpecError, InjectedFault, parse


def test_a_spec_parses_into_typed_faults() -> None:
    spec = parse("train_step_raise@3, request_fail=0.1,reward_raise=countdown,reward_hang=*,server_slow=0.5")
    assert spec == FaultSpec(
        train_step_raise=3, request_fail=0.1, reward_raise="countdown", reward_hang="*", server_slow=0.5
    )
    assert parse("") == FaultSpec()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("train_step_raise", "entry 'train_step_raise' needs a value: write name@N or name=value"),
        (
            "kill_everything@2",
            "kill_everything: Extra inputs are not permitted (known faults: train_step_raise",
        ),
        ("request_fail=1.5", "request_fail: Input should be less than or equal to 1"),
        ("train_step_raise@0", "train_step_raise: Input should be greater than or equal to 1"),
        ("train_step_raise@three", "train_step_raise: Input should be a valid integer"),
        ("request_fail=0.1,request_fail=0.2", "'request_fail' is given twice"),
    ],
)
def test_a_bad_spec_is_one_clear_error(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError) as info:
        parse(spec)
    assert message in str(info.value) and str(info.value).startswith("TELESCOPE_FAULTS")


def test_unset_nothing_is_injected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TELESCOPE_FAULTS", raising=False)
    assert faults.current() is None
    faults.on_train_step(3)
    faults.on_prepare_prompt(40)
    asyncio.run(faults.on_request("g0-s0-v0"))
    asyncio.run(faults.on_reward("countdown"))
    env_vars: dict[str, str] = {}
    faults.propagate(env_vars)
    assert env_vars == {}


def test_each_fault_fires_where_it_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELESCOPE_FAULTS", "train_step_raise@3,prompt_raise@2,reward_raise=countdown")
    faults.on_train_step(2)
    with pytest.raises(InjectedFault, match="train_step_raise@3"):
        faults.on_train_step(3)
    with pytest.raises(InjectedFault, match="prompt_raise@2"):
        faults.on_prepare_prompt(2)
    asyncio.run(faults.on_reward("reverse_text"))
    with pytest.raises(InjectedFault, match="reward_raise=countdown"):
        asyncio.run(faults.on_reward("countdown"))
    env_vars: dict[str, str] = {}
    faults.propagate(env_vars)  # Ray workers receive the same spec
    assert env_vars == {"TELESCOPE_FAULTS": "train_step_raise@3,prompt_raise@2,reward_raise=countdown"}


def test_failed_requests_are_a_reproducible_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELESCOPE_FAULTS", "request_fail=0.25")
    ids = [f"g{g}-s{s}-v0" for g in range(400) for s in range(4)]

    def fails(rid: str) -> bool:
        try:
            asyncio.run(faults.on_request(rid))
        except InjectedFault:
            return True
        return False

    failed = {rid for rid in ids if fails(rid)}
    assert failed == {rid for rid in ids if zlib.crc32(rid.encode()) < 0.25 * 2**32}  # by hash: reproducible
    assert 0.2 < len(failed) / len(ids) < 0.3


def test_a_hanging_reward_times_out_and_scores_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import ToyEnv

    from telescope.core.env.faults import inject_reward_faults

    monkeypatch.setenv("TELESCOPE_FAULTS", "reward_hang=toy")
    env = ToyEnv(lambda completion, sample: 1.0, timeout_s=0.1)
    inject_reward_faults(env)  # what env.resolve does to every environment it builds, with faults set
    sample = env.samples()[0]
    result = asyncio.run(env.score("abc", sample))
    assert result.total_reward == 0.0 and result.sample_metrics["reward_timeout"] == 1.0
    monkeypatch.setenv("TELESCOPE_FAULTS", "reward_raise=*")
    result = asyncio.run(env.score("abc", sample))
    assert result.sample_metrics["reward_error"] == 1.0
    monkeypatch.delenv("TELESCOPE_FAULTS")
    assert asyncio.run(env.score("abc", sample)).total_reward == 1.0


def test_the_run_seams_are_installed_only_with_faults_set(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes import FakeClient, ToyEnv
    from test_orchestrator import build, varied_reply, varied_reward

    from telescope.core.inference.faults import FaultyClient
    from telescope.core.runtime.supervision.faults import ServerKill

    monkeypatch.delenv("TELESCOPE_FAULTS", raising=False)
    orch, _, _ = build(tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)))
    assert type(orch.clients[0]) is FakeClient and orch.hooks == [] and "_prepare" not in vars(orch.prompts)
    monkeypatch.setenv("TELESCOPE_FAULTS", "server_kill@5")
    orch, _, _ = build(tokenizer, ToyEnv(varied_reward), FakeClient(varied_reply(tokenizer)))
    assert isinstance(orch.clients[0], FaultyClient) and isinstance(orch.hooks[0], ServerKill)
    assert "_prepare" in vars(orch.prompts)  # the preparation counts prompts for prompt_raise


def test_a_trainer_backend_raises_only_in_the_step_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from telescope.core.runtime.supervision.faults import with_trainer_faults

    class Backend:
        def train_step(self, batch: Any) -> dict[str, float]:
            return {"loss": float(batch.step)}

        def init(self) -> dict[str, Any]:
            return {"dp_world_size": 1}

    backend: Any = Backend()
    monkeypatch.delenv("TELESCOPE_FAULTS", raising=False)
    assert with_trainer_faults(backend) is backend
    monkeypatch.setenv("TELESCOPE_FAULTS", "train_step_raise@3")
    faulty = with_trainer_faults(backend)
    assert faulty.train_step(SimpleNamespace(step=1)) == {"loss": 1.0}  # type: ignore[arg-type]
    assert faulty.init() == {"dp_world_size": 1}  # everything else is the backend's own
    with pytest.raises(InjectedFault, match="train_step_raise@3"):
        faulty.train_step(SimpleNamespace(step=2))  # type: ignore[arg-type]  # 0-based step 2 = step 3
