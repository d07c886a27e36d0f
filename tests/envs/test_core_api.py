"""The environment API in telescope.core.env: import cost, Rubric, Environment.score, pass@k."""

from __future__ import annotations

import asyncio
import itertools
import math
import subprocess
import sys
import time

import pytest

from telescope.core.env import (
    RewardResult,
    RolloutState,
    Rubric,
    Sample,
    SingleTurnEnvironment,
    SingleTurnKwargs,
    TrajectoryStep,
    aggregate_pass_k,
    pass_at_k,
    pass_pow_k,
)
from telescope.core.testing import heavy_imports_after


def test_env_api_imports_without_heavy_deps() -> None:
    code = "import telescope.core.env, telescope.envs.plugin, telescope.envs.kwargs"
    heavy = ("torch", "transformers", "math_verify", "datasets", "ray", "sympy")
    assert heavy_imports_after(code, heavy) == []


def run(coro):
    return asyncio.run(coro)


def test_rubric_passes_only_declared_arguments_and_weights() -> None:
    seen: dict[str, tuple] = {}

    def by_completion(completion):
        seen["c"] = (completion,)
        return 1.0

    async def by_answer(answer, metadata):
        seen["a"] = (answer, metadata)
        return 0.5, "gold"

    def everything(**kwargs):
        seen["all"] = tuple(sorted(kwargs))
        return 2.0

    rubric = Rubric().add_reward(by_completion, 2.0).add_reward(by_answer, 1.0, range_min=0, range_max=1)
    rubric.add_metric(everything, name="all")
    sample = Sample("q", "42", {"k": 1})
    result = run(rubric.score(completion="text", sample=sample))
    assert seen["c"] == ("text",)
    assert seen["a"] == ("42", {"k": 1})
    assert seen["all"] == ("answer", "completion", "eos_token", "metadata", "sample")
    assert result.total_reward == pytest.approx(2.0 * 1.0 + 1.0 * 0.5 + 0.0 * 2.0)
    assert result.sample_metrics["by_completion"] == 1.0 and result.sample_metrics["all"] == 2.0
    assert result.golden_answers == {"by_answer": "gold"}
    assert rubric.metrics_ranges == {"by_answer": {"min": 0, "max": 1, "invert": False}}
    assert result.sample_metrics["reward_error"] == 0.0 and result.sample_metrics["reward_timeout"] == 0.0


def test_rubric_errors_timeouts_and_nan_score_zero_and_are_counted() -> None:
    def boom(completion):
        raise RuntimeError("kaput")

    async def slow_async():
        await asyncio.sleep(5)
        return 1.0

    def slow_sync():
        time.sleep(1.0)
        return 1.0

    def nan():
        return math.nan

    def good():
        return 1.0

    rubric = Rubric(timeout_s=0.2)
    for fn in (boom, slow_async, slow_sync, nan, good):
        rubric.add_reward(fn)
    result = run(rubric.score(completion="x", sample=Sample("q")))
    assert result.total_reward == 1.0
    assert result.sample_metrics["reward_error"] == 2.0  # boom + nan
    assert result.sample_metrics["reward_timeout"] == 2.0  # slow_async + slow_sync
    keys = sorted(t["info_key"] for t in result.info_turns)
    assert keys == [
        "reward_error/boom",
        "reward_error/nan",
        "reward_timeout/slow_async",
        "reward_timeout/slow_sync",
    ]
    assert any("kaput" in t["info_value"] for t in result.info_turns)


class _Env(SingleTurnEnvironment):
    default_name = "toy"
    default_system_prompt = "SYS"
    default_instruction_prompt = "INSTR"

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("What?", "a")]

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if completion == "raise":
            raise ValueError("bad")
        if completion == "hang":
            await asyncio.sleep(10)
        return RewardResult(1.0, {"x": 1.0})


def test_environment_score_never_raises() -> None:
    env = _Env(SingleTurnKwargs(reward_timeout_s=0.1))
    sample = env.get_sample(0)
    assert run(env.score("ok", sample)).total_reward == 1.0
    failed = run(env.score("raise", sample))
    assert failed.total_reward == 0.0 and failed.sample_metrics["reward_error"] == 1.0
    timed = run(env.score("hang", sample))
    assert timed.total_reward == 0.0 and timed.sample_metrics["reward_timeout"] == 1.0
    metrics = run(env.evaluate("raise", sample)).metrics
    assert metrics["reward_error"] == 1.0


def test_format_prompt_through_chat_template(tiny_tokenizer) -> None:
    from telescope.core.env import ChatOptions

    env = _Env(SingleTurnKwargs(add_thinking_prefix=True))
    sample = env.get_sample(0)
    text = env.format_prompt(sample, tiny_tokenizer, ChatOptions(enable_thinking=True))
    expected = (
        "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nINSTR\n\nWhat?<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    )
    assert text == expected
    plain = env.format_prompt(
        sample, tiny_tokenizer, ChatOptions(enable_thinking=False), add_thinking_prefix=False
    )
    assert plain.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )  # enable_thinking=False reached the template
    override = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    custom = env.format_prompt(
        sample, tiny_tokenizer, ChatOptions(chat_template=override), add_thinking_prefix=False
    )
    assert custom == "[system]SYS[user]INSTR\n\nWhat?"


def test_unknown_or_mistyped_kwarg_is_an_error(registry) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="num_generatd"):
        registry.create("environment", "countdown", {"num_generatd": 5})
    with pytest.raises(ValidationError, match="max_turns"):
        registry.create("environment", "wordle", {"max_turns": "many"})


def test_rollout_state_helpers() -> None:
    state = RolloutState(sample=Sample("q"))
    state.trajectory.append(
        TrajectoryStep(
            [{"role": "user", "content": "q"}],
            [{"role": "assistant", "content": "a"}],
            completion_token_ids=[1, 2],
            completion_logprobs=[-0.1, -0.2],
        )
    )
    state.trajectory.append(
        TrajectoryStep(
            [{"role": "user", "content": "q2"}],
            [{"role": "assistant", "content": "b"}],
            completion_token_ids=[3],
            completion_logprobs=[-0.3],
        )
    )
    assert state.num_turns == 2
    assert state.get_full_completion_ids() == [1, 2, 3]
    assert state.get_full_logprobs() == [-0.1, -0.2, -0.3]
    assert state.last_messages()[-1] == {"role": "assistant", "content": "b"}


def _brute_force(n: int, c: int, k: int) -> tuple[float, float]:
    """Enumerate every k-subset of n samples (c correct): P(any correct), P(all correct)."""
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets), sum(all(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_k_matches_enumeration_over_all_samples(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            at, pow_ = _brute_force(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(at)
            assert pass_pow_k(n, c, k) == pytest.approx(pow_)


def test_pass_k_uses_all_samples_not_first_k() -> None:
    # 8 samples, correct only at the end: "first k" would say pass@2 = 0.
    values = [[0, 0, 0, 0, 0, 0, 1, 1]]
    assert aggregate_pass_k(values, [2])[2] == pytest.approx(1 - (6 * 5) / (8 * 7))
    assert aggregate_pass_k(values, [2], kind="pow")[2] == pytest.approx((2 * 1) / (8 * 7))
    assert aggregate_pass_k([[1], [0, 1]], [2]) == {2: 1.0}  # the 1-sample prompt cannot inform k=2
    with pytest.raises(ValueError, match="n=1"):
        pass_at_k(1, 1, 2)


def test_stuck_sync_reward_never_blocks_process_exit() -> None:
    code = (
        "import asyncio, threading, time\n"
        "from telescope.core.env import Rubric, Sample\n"
        "def stuck():\n    threading.Event().wait()\n"
        "r = Rubric(timeout_s=0.1).add_reward(stuck)\n"
        "res = asyncio.run(r.score(sample=Sample('q')))\n"
        "print(res.sample_metrics['reward_timeout'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "1.0", out.stderr
