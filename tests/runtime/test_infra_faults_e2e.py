"""A real run (Ray, the transformers engine, FSDP, the local bubblewrap sandbox provider) with 10% of
sandbox creations failing, 5% of sandbox commands killed by the provider and 2% of inference requests
answered 503 (``TELESCOPE_FAULTS``): it finishes; every injected failure is counted under its cause;
none becomes a reward (the environment's reward is never below 1); groups keep their good samples."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_faults_e2e import steps
from test_resume_e2e import settings

from telescope.core import faults, infra
from telescope.core.config import load_config
from telescope.core.observe import RunDirReader
from telescope.core.plugins import load_plugins

pytest.importorskip("ray")

SANDBOX_ENV = '''
from telescope.core import hookimpl
from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, SingleTurnKwargs
from telescope.core.plugins import load_plugins
from telescope.core.sandbox import SandboxConfig, build_provider


class SandboxCount(SingleTurnEnvironment):
    """Counts the completion's bytes in a sandbox of its own: reward 1 + (bytes % 5) / 5, never below 1."""

    kwargs_model = SingleTurnKwargs
    provider = None

    def load_dataset(self, num_samples=-1):
        self._samples = [Sample(f"write {i} words", "") for i in range(64)]
        return self._samples

    async def compute_reward(self, completion, sample, eos_token=""):
        if self.provider is None:
            self.provider = build_provider(load_plugins()[1], "local", {})
        config = SandboxConfig(memory_mb=512, disk_size_gb=0.1, timeout_seconds=900)
        async with self.provider.sandbox(config) as box:
            await self.provider.upload_bytes(box, "c.txt", completion.encode())
            result = await self.provider.execute(box, "wc -c < c.txt", timeout=30)
        n = int(result.stdout.strip())
        return RewardResult(1.0 + (n % 5) / 5, {"bytes": float(n)})


@hookimpl
def telescope_register_environments(register):
    register.add("sandbox_count", "sandbox_env:SandboxCount", kwargs_model=SingleTurnKwargs, description="test")
'''

CAUSES = {
    "sandbox_create_fail": "sandbox_create",
    "sandbox_exec_kill": "sandbox_lost",
    "server_error": "server_error",
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox provider needs bubblewrap")
def test_injected_infrastructure_failures_are_counted_by_cause_and_never_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = tmp_path / "sandbox_env.py"
    plugin.write_text(SANDBOX_ENV)
    monkeypatch.setenv("TELESCOPE_FAULTS", "sandbox_create_fail=0.1,sandbox_exec_kill=0.05,server_error=0.02")
    faults.injected.clear()
    infra.ORIGINS.drain()
    run_dir, group_size = tmp_path / "run", 4
    from telescope.core.runtime import run_training

    pset, registry = load_plugins(files=[str(plugin)])
    overrides = dict(
        number_of_steps=8,
        environments=[{"name": "sandbox_count"}],
        plugins=[str(plugin)],
        group_size=group_size,
        prompts_batch_size_for_trainer=4,
        infra_retry_backoff_s=0.05,
    )
    run_training(load_config(None, settings(run_dir, **overrides), registry), pset, registry)
    metrics = steps(run_dir)
    assert [int(m["step"]) for m in metrics] == list(range(1, 9))  # the run finished
    after_last_step = infra.ORIGINS.drain()  # failures counted after the last step's metrics (shutdown)
    injected = dict(faults.injected)
    for fault, cause in CAUSES.items():
        counted = metrics[-1].get(f"totals/infra/cause/{cause}", 0.0) + sum(
            n for o, n in after_last_step.items() if o.cause == cause
        )
        assert injected.get(fault, 0) > 0 and counted == injected[fault], (fault, counted, injected)
    rows = RunDirReader(run_dir).rollouts()
    scored = [r for r in rows if r.get("discard_reason") not in ("off_policy", "eval_drain")]
    assert scored and min(r["reward"] for r in scored) >= 1.0  # no injected failure became a reward
    assert not [r for r in rows if r.get("discard_reason") == "rollout_error"]
    kept = [r for r in rows if r.get("discard_reason") is None]
    assert len(kept) >= 8 * 4 * 2  # groups trained on their good samples (at least 2 of each)
    retried = metrics[-1]["totals/infra/retried"]
    whole_groups = metrics[-1]["totals/infra/groups_hit"] * group_size
    print(
        f"\ninjected {injected}; counted by cause {[(c, metrics[-1].get(f'totals/infra/cause/{c}')) for c in CAUSES.values()]}"
        f" (+{sum(after_last_step.values())} after the last step); samples run again {retried:.0f}, masked "
        f"{metrics[-1]['totals/infra/masked']:.0f}; dropping whole groups would regenerate {whole_groups:.0f}"
    )
    assert 0 < retried < whole_groups
