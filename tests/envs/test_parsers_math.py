"""Parsers and math environments: hand-written completions with exact expected rewards."""

from __future__ import annotations

import asyncio
import threading

import pytest

from telescope.core.env import (
    Sample,
    extract_answer_tags,
    extract_boxed_answer,
    extract_code_block,
    extract_xml_tag,
    strip_think_tags,
    verify_math_answer,
)


def test_strip_think_and_boxed_extraction() -> None:
    assert strip_think_tags("<think>a</think>b</think>  final ") == "final"
    assert strip_think_tags("no tags") == "no tags"
    assert extract_boxed_answer("x \\boxed{\\frac{1}{2}} y \\boxed{3}") == "3"
    assert extract_boxed_answer("\\boxed{\\frac{\\sqrt{2}}{2}}") == "\\frac{\\sqrt{2}}{2}"
    assert extract_boxed_answer("\\boxed{\\boxed{7}}") == "7"  # the last box to open is the inner one
    assert extract_boxed_answer("done: \\boxed{5} then \\boxed{unclosed") == "5"
    assert extract_boxed_answer("boxed{4}") == "4"
    assert extract_boxed_answer("no box here") == ""
    assert extract_answer_tags("<answer>1</answer> <answer> 2 </answer>") == "2"
    assert extract_xml_tag("<guess>[crane]</guess>", "guess") == "[crane]"
    assert extract_xml_tag("nothing", "guess") is None
    text = "```js\nlet a;\n```\n```python\nprint(1)\n```\n```\nraw\n```"
    assert extract_code_block(text) == "print(1)"
    assert extract_code_block("```\nx = 1\n```") == "x = 1"
    assert extract_code_block("no code") is None


def test_verify_math_answer_variants_from_a_worker_thread() -> None:
    cases = [
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{1}{2}", "\\frac12", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("3", "4", False),
        ("", "4", False),
        ("x" * 501, "4", False),
        ("9\\pi", "9\\pi", True),
    ]
    results: dict[int, bool] = {}

    def check() -> None:  # math-verify's signal-based timeout would raise on this thread
        for i, (pred, gold, _) in enumerate(cases):
            results[i] = verify_math_answer(pred, gold)

    t = threading.Thread(target=check)
    t.start()
    t.join(120)
    assert results == {i: want for i, (_, _, want) in enumerate(cases)}


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>2x = 12</think> so \\boxed{6}", 1.0),
        ("The answer is \\boxed{\\boxed{6}}", 1.0),
        ("\\boxed{6.0}", 1.0),
        ("I think it is 6.", 0.0),  # no box
        ("\\boxed{7}", 0.0),
        ("<think>\\boxed{6}</think> final \\boxed{5}", 0.0),  # the box after thinking counts
        ("\\boxed{6}<|endoftext|>", 1.0),
    ],
)
def test_math_reward(registry, completion: str, expected: float) -> None:
    env = registry.create("environment", "hendrycks_math", {"sample_data": True})
    sample = Sample("Solve 2x + 7 = 19.", "6")
    result = asyncio.run(env.score(completion, sample))
    assert result.total_reward == expected
    assert result.sample_metrics["correct"] == expected
    assert result.golden_answers == {"correct": "6"}


def test_math_latex_answer(registry) -> None:
    env = registry.create("environment", "deepscaler", {"sample_data": True})
    sample = Sample("q", "\\frac{5}{6}")
    assert asyncio.run(env.score("\\boxed{\\frac{5}{6}}", sample)).total_reward == 1.0
    assert asyncio.run(env.score("\\boxed{5/6}", sample)).total_reward == 1.0
    assert asyncio.run(env.score("\\boxed{\\frac{6}{5}}", sample)).total_reward == 0.0


def test_math_verifier_hard_deadline_kills_and_recovers() -> None:
    from telescope.core.env import MathVerifier, MathVerifyTimeout

    verifier = MathVerifier(workers=1, timeout_s=5, hard_timeout_s=0.3)
    try:
        verifier.warmup()
        with pytest.raises(MathVerifyTimeout, match="worker was killed"):
            verifier.verify("9^{9^{9^{9}}}", "1")  # sympy works on this for ~1 s: past the deadline
        verifier.hard_timeout_s = 60
        assert verifier.verify("\\frac{1}{2}", "0.5") is True  # a fresh pool serves the next check
    finally:
        verifier.close()


def test_math_timeout_is_recorded_not_raised(registry, monkeypatch) -> None:
    from telescope.core.env import MathVerifyTimeout
    from telescope.envs import math_envs

    def stuck(prediction: str, ground_truth: str) -> bool:
        raise MathVerifyTimeout("math-verify took longer than 20s")

    monkeypatch.setattr(math_envs, "verify_math_answer", stuck)
    env = registry.create("environment", "gsm8k", {"sample_data": True})
    result = asyncio.run(env.score("\\boxed{14}", Sample("q", "14")))
    assert result.total_reward == 0.0
    assert result.sample_metrics["reward_timeout"] == 1.0 and result.sample_metrics["reward_error"] == 0.0


def test_plugin_marks_missing_dependencies() -> None:
    from telescope.cli.commands.envs import _missing_optional
    from telescope.envs.plugin import _missing

    assert _missing("math_verify", "pip install x") is None
    assert (
        _missing("surely_not_installed_pkg", "pip install y")
        == "needs surely_not_installed_pkg: pip install y"
    )
    assert _missing_optional({"optional": ["datasets", "surely-not-installed-pkg"]}) == [
        "surely-not-installed-pkg"
    ]
