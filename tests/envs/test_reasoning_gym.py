"""The reasoning_gym environment against the real reasoning-gym library: its samples are the library's
entries, its rewards the library's own ``score_answer``, and bad input scores 0 and is counted."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from telescope.cli.commands.envs import app
from telescope.core.env.resolve import create_environment, environment_component_problems

rg = pytest.importorskip("reasoning_gym")


def build(registry: Any, **kwargs: Any) -> Any:
    return create_environment(registry, "reasoning_gym", kwargs)


def score(env: Any, completion: str, sample: Any) -> Any:
    return asyncio.run(env.score(completion, sample))


def test_samples_are_the_librarys_entries(registry: Any) -> None:
    env = build(registry, task="basic_arithmetic", size=4, seed=7, max_terms=2)
    expected = rg.create_dataset("basic_arithmetic", size=4, seed=7, max_terms=2)
    samples = env.load_dataset()
    assert [(s.prompt, s.answer) for s in samples] == [(e["question"], e["answer"]) for e in expected]
    assert all(
        s.metadata["entry"]["metadata"]["num_terms"] == 2 for s in samples
    )  # the task config reached it
    messages = env.build_messages(samples[0])
    assert messages[0] == {"role": "system", "content": rg.utils.SYSTEM_PROMPTS["default"]}
    assert messages[1] == {"role": "user", "content": samples[0].prompt}


def test_rewards_are_score_answer_on_the_extracted_answer(registry: Any) -> None:
    env = build(registry, task="basic_arithmetic", size=3, seed=3)
    library = rg.create_dataset("basic_arithmetic", size=3, seed=3)
    sample, entry = env.load_dataset()[0], library[0]
    answer = entry["answer"]
    for reply, found in (
        (f"<think>easy</think><answer>{answer}</answer>", 1.0),  # exact
        (f"<answer>x{answer}</answer>", 1.0),  # partial credit, the library's len ratio
        (f"<answer>1</answer> then <answer>{answer}</answer>", 1.0),  # the last answer counts
        ("<answer>wrong</answer>", 1.0),
        (answer, 0.0),  # no tags: score_answer(None) = 0, counted as not found
    ):
        result = score(env, reply, sample)
        extracted = rg.utils.extract_answer(reply)
        assert result.total_reward == library.score_answer(extracted, entry), reply
        assert result.sample_metrics["score"] == result.total_reward
        assert result.sample_metrics["answer_found"] == found
        assert result.sample_metrics["reward_error"] == 0.0
        assert result.golden_answers["score"] == answer
        assert result.sample_tags == {"task": "basic_arithmetic"}
    assert score(env, f"<answer>{answer}</answer>", sample).total_reward == 1.0
    assert 0.0 < score(env, f"<answer>x{answer}</answer>", sample).total_reward < 1.0
    assert score(env, "<answer>wrong</answer>", sample).total_reward == 0.0


def test_a_scorer_that_raises_scores_zero_and_is_counted(registry: Any) -> None:
    env = build(registry, task="prime_factorization", size=2, seed=3)
    sample = env.load_dataset()[0]
    with pytest.raises(ValueError):  # the library's own scorer fails on this answer
        rg.create_dataset("prime_factorization", size=2, seed=3).score_answer("[[", sample.metadata["entry"])
    result = score(env, "<answer>[[</answer>", sample)
    assert result.total_reward == 0.0
    assert result.sample_metrics["reward_error"] == 1.0
    assert any("invalid literal" in t["info_value"] for t in result.info_turns)
    assert score(env, f"<answer>{sample.answer}</answer>", sample).total_reward == 1.0


def test_several_tasks_interleave_with_per_task_metrics(registry: Any) -> None:
    env = build(
        registry,
        task=["basic_arithmetic", "leg_counting"],
        size=3,
        seed=1,
        basic_arithmetic={"max_terms": 2},
    )
    samples = env.load_dataset()
    assert [s.metadata["task"] for s in samples] == ["basic_arithmetic", "leg_counting"] * 3
    legs = rg.create_dataset("leg_counting", size=3, seed=1)
    assert [s.answer for s in samples[1::2]] == [e["answer"] for e in legs]  # unchanged by the other task
    alone = build(registry, task="leg_counting", size=3, seed=1).load_dataset()
    assert [s.prompt for s in alone] == [s.prompt for s in samples[1::2]]
    result = score(env, f"<answer>{samples[1].answer}</answer>", samples[1])
    assert (
        result.sample_metrics["score/leg_counting"] == 1.0
        and "score/basic_arithmetic" not in result.sample_metrics
    )
    assert result.sample_tags == {"task": "leg_counting"}
    assert env.tags_options == {"task": ["basic_arithmetic", "leg_counting"]}
    assert env.metrics_ranges["score/leg_counting"] == {"min": 0.0, "max": 1.0, "invert": False}
    assert len(env.load_dataset(num_samples=4)) == 4
    assert (
        len(build(registry, task=["basic_arithmetic", "leg_counting"], size=3, num_samples=5).load_dataset())
        == 5
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"task": "basic_arithmetc"},
            "'basic_arithmetc' is not a reasoning-gym task. Did you mean 'basic_arithmetic'?",
        ),
        (
            {"task": "basic_arithmetic", "max_term": 3},
            "'max_term' is not a config field of reasoning-gym task",
        ),
        (
            {"task": "basic_arithmetic", "max_terms": 1},
            "refuses config {'max_terms': 1}: AssertionError: max_terms must be >= min_terms",
        ),
        (
            {"task": "leg_counting", "prompt_style": "terse"},
            "prompt_style: 'terse' is not one of reasoning-gym's system prompts",
        ),
        ({"task": ["leg_counting", "gcd"], "gcd": {"seed": 1}}, "gcd: 'seed' is not a config field"),
    ],
)
def test_bad_kwargs_are_named_at_validation(registry: Any, kwargs: dict[str, Any], message: str) -> None:
    component = registry.get("environment", "reasoning_gym")
    problems = environment_component_problems(component, kwargs, registry)
    assert any(message in p for p in problems), problems


def test_misplaced_task_config_is_refused_by_the_kwargs_model() -> None:
    from pydantic import ValidationError

    from telescope.envs.kwargs import ReasoningGymKwargs

    with pytest.raises(ValidationError, match="'max_terms' is not one of the tasks"):
        ReasoningGymKwargs(task=["basic_arithmetic", "gcd"], max_terms=3)
    with pytest.raises(ValidationError, match="a task is named twice"):
        ReasoningGymKwargs(task=["gcd", "gcd"])


def test_envs_list_shows_the_tasks() -> None:
    result = CliRunner().invoke(app, ["list", "--json"])
    entry = next(e for e in json.loads(result.output) if e["name"] == "reasoning_gym")
    assert entry["available"] and "basic_arithmetic" in entry["choices"]["task"]
    assert set(entry["choices"]["task"]) == set(rg.factory.DATASETS) - {"composite"}
    text = CliRunner().invoke(app, ["list", "--brief"]).output
    assert f"task ({len(entry['choices']['task'])}): ab, acre," in text


def test_envs_list_without_the_library_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed: find_spec is None
    result = CliRunner().invoke(app, ["list", "--brief"])
    line = next(line for line in result.output.splitlines() if "reasoning_gym (" in line)
    assert "unavailable: needs reasoning_gym: pip install 'telescope-envs[reasoning-gym]'" in line
    entry = next(
        e
        for e in json.loads(CliRunner().invoke(app, ["list", "--json"]).output)
        if e["name"] == "reasoning_gym"
    )
    assert entry["choices"] == {} and entry["install"] == "pip install 'telescope-envs[reasoning-gym]'"
