"""``telescope env check``: passes for every shipped environment and eval, fails with one clear
line for the broken cases of issue 20 (a kwargs model not deriving from the base one, an unknown
sandbox provider, a reward that always fails, a reference that earns nothing)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from telescope.cli.commands.envs import app
from telescope.core.env import RewardResult, Sample, SingleTurnEnvironment, SingleTurnKwargs
from telescope.core.env.check import check_environment
from telescope.core.plugins import build_registry, get_plugin_manager
from telescope.core.registry import PluginInfo


def _offline_kwargs(registry: Any, kind: str, name: str) -> dict[str, Any]:
    """Kwargs a shipped environment needs here: the shipped sample data (no hub) and, for
    i3_code, the local provider without bubblewrap (CI has none) and no warm pool."""
    component = registry.get(kind, name)
    model = component.kwargs_model
    kwargs: dict[str, Any] = (
        {"sample_data": True} if model is not None and "sample_data" in model.model_fields else {}
    )
    kwargs.update(component.meta.get("example_kwargs", {}))  # e.g. openenv: the shipped demo server
    if name == "i3_code":
        kwargs.update(pool_size=0, provider_kwargs={"allow_unsandboxed": True})
    return kwargs


def _check(registry: Any, name: str, kwargs: dict[str, Any], tokenizer: Any, **opts: Any) -> dict[str, Any]:
    lines = asyncio.run(check_environment(registry, name, kwargs, tokenizer=tokenizer, num_samples=2, **opts))
    return {line.step: line for line in lines}


def test_every_shipped_environment_and_eval_passes(registry: Any, tiny_tokenizer: Any) -> None:
    checked = []
    for kind in ("environment", "eval"):
        for name in registry.names(kind, available_only=True):
            lines = _check(
                registry, name, _offline_kwargs(registry, kind, name), tiny_tokenizer, as_eval=kind == "eval"
            )
            assert all(line.ok for line in lines.values()), (name, lines)
            agent = [
                "build",
                "samples",
                "prompts",
                "resources",
                "agent",
            ]  # an agent: its rollout needs a model (skipped)
            assert list(lines) in (
                ["build", "samples", "prompts", "resources", "reference", "junk"],
                agent,
            ), name
            checked.append((name, lines["reference" if "reference" in lines else "agent"].message))
    scored = {n for n, message in checked if "scored" in message}
    assert {"reverse_text", "wordle", "calculator", "gsm8k", "math500", "gpqa_diamond"} <= scored
    assert {"countdown", "i3_code"} <= {n for n, _ in checked} - scored  # no reference answer: skipped


class _Broken(SingleTurnEnvironment):
    kwargs_model: ClassVar[type[SingleTurnKwargs]] = SingleTurnKwargs
    failure: ClassVar[str] = "raise"

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("say hi", "hi")]

    def reference_completion(self, sample: Sample) -> str | None:
        return sample.answer

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if self.failure == "raise":
            raise KeyError("answer_key")
        return RewardResult(0.0)  # "zero": never rewards anything


class _ZeroReward(_Broken):
    failure = "zero"


class _Plugin:
    from telescope.core import hookimpl

    @hookimpl
    def telescope_register_environments(self, register: Any) -> None:
        from pydantic import BaseModel, ConfigDict

        class PlainKwargs(BaseModel):
            model_config = ConfigDict(extra="forbid")
            size: int = 3

        register.add("raising", _Broken)
        register.add("zero", _ZeroReward)
        register.add("plain_kwargs", _Broken, kwargs_model=PlainKwargs)


@pytest.fixture(scope="module")
def broken_registry() -> Any:
    pset = get_plugin_manager()
    pset.pm.register(_Plugin(), name="broken")
    pset.infos["broken"] = PluginInfo("broken", "tests", "tests", "0")
    return build_registry(pset)


def test_broken_cases_fail_with_one_clear_line(broken_registry: Any, tiny_tokenizer: Any) -> None:
    plain = _check(broken_registry, "plain_kwargs", {}, tiny_tokenizer)
    assert list(plain) == ["build"] and not plain["build"].ok
    assert "must subclass telescope.core.env.EnvironmentKwargs" in plain["build"].message
    raising = _check(broken_registry, "raising", {}, tiny_tokenizer)
    assert not raising["reference"].ok and not raising["junk"].ok
    assert raising["reference"].message == "scoring 'hi' failed: reward_error: KeyError: 'answer_key'"
    zero = _check(broken_registry, "zero", {}, tiny_tokenizer)
    assert zero["reference"].message == "the reference answer 'hi' scored 0, no more than a junk answer (0)"
    provider = _check(broken_registry, "i3_code", {"sample_data": True, "provider": "nosuch"}, tiny_tokenizer)
    assert list(provider) == ["build"] and "unknown sandbox provider 'nosuch'" in provider["build"].message
    creds = _check(
        broken_registry, "i3_code", {"sample_data": True, "provider": "e2b", "pool_size": 0}, tiny_tokenizer
    )
    if broken_registry.get("sandbox_provider", "e2b").available:  # the SDK is there, credentials are not
        assert not creds["resources"].ok and "E2B_API_KEY" in creds["resources"].message


def test_cli_prints_a_line_per_step_and_exits_1_on_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = CliRunner().invoke(app, ["check", "reverse_text", "--samples", "2"])
    assert ok.exit_code == 0, ok.output
    assert "ok   reference 'ssalg teiuq' scored 1" in ok.output
    assert "reverse_text: every check passed" in ok.output
    bad = CliRunner().invoke(app, ["check", "i3_code", "--kwargs", "{sample_data: true, provider: lcoal}"])
    assert bad.exit_code == 1
    assert "FAIL build" in bad.output and "Did you mean 'local'?" in bad.output
