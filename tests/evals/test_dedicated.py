"""Dedicated evals on local data files: prompts, answer extraction and scoring."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from telescope.core.evals import resolve_eval
from telescope.core.plugins import load_plugins

DATA = Path(__file__).parent / "data"
SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_, REGISTRY = load_plugins()


def load(name: str, **kwargs: Any) -> Any:
    return resolve_eval(name, {"data_files": str(DATA / f"{name}.jsonl"), **kwargs}, REGISTRY)


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def score(env: Any, text: str, idx: int) -> Any:
    return asyncio.run(env.score(text, env.get_sample(idx), "<|im_end|>"))


def test_registered_as_evals_not_environments() -> None:
    assert {"math500", "aime_2024", "aime_2025", "gpqa_diamond"} <= set(REGISTRY.names("eval"))
    assert "math500" not in REGISTRY.names("environment")


@pytest.mark.parametrize(
    ("name", "key"), [("math500", "problem"), ("aime_2024", "problem"), ("aime_2025", "question")]
)
def test_math_prompts_are_the_problem_plus_the_boxed_instruction(name: str, key: str, tokenizer: Any) -> None:
    env = load(name)
    source = rows(name)
    assert len(env) == len(source)
    for i, row in enumerate(source):
        messages = env.build_messages(env.get_sample(i))
        assert messages == [{"role": "user", "content": row[key] + SUFFIX}]  # no system prompt
        assert row[key] + SUFFIX in env.format_prompt(
            env.get_sample(i), tokenizer
        )  # through the chat template


def test_math500_scoring_level_and_subject() -> None:
    env = load("math500")
    right = score(env, "so \\boxed{\\frac{1}{2}}<|im_end|>", 1)
    assert right.sample_metrics["correct"] == 1.0 and right.total_reward == 1.0
    assert right.sample_metrics["level"] == 3.0 and right.sample_tags == {"subject": "Algebra"}
    assert score(env, "equivalent: \\boxed{0.5}", 1).sample_metrics["correct"] == 1.0
    assert score(env, "\\boxed{2}", 1).sample_metrics["correct"] == 0.0
    assert score(env, "no box at all: 1/2", 1).sample_metrics["correct"] == 0.0
    # Only the text after </think> is read: a box inside the thinking does not count.
    assert score(env, "<think>maybe \\boxed{1/2}</think> I give up", 1).sample_metrics["correct"] == 0.0
    assert score(env, "<think>maybe \\boxed{7}</think> so \\boxed{1/2}", 1).sample_metrics["correct"] == 1.0
    assert score(env, "\\boxed{6}", 2).sample_metrics["level"] == 2.0


@pytest.mark.parametrize(
    ("name", "idx", "good", "bad"), [("aime_2024", 0, "24", "1024"), ("aime_2025", 1, "8", "9")]
)
def test_aime_scoring(name: str, idx: int, good: str, bad: str) -> None:
    env = load(name)
    assert score(env, f"The answer is \\boxed{{{good}}}.", idx).sample_metrics["correct"] == 1.0
    assert score(env, f"The answer is \\boxed{{{bad}}}.", idx).sample_metrics["correct"] == 0.0


@pytest.mark.parametrize("seed", [0, 42])
def test_gpqa_choices_shuffled_by_one_seeded_rng_and_letter_extraction(seed: int) -> None:
    env = load("gpqa_diamond", seed=seed)
    rng = random.Random(seed)  # one RNG shared across questions, in dataset order
    for i, row in enumerate(rows("gpqa_diamond")):
        order = list(range(4))
        rng.shuffle(order)
        choices = [
            row["Correct Answer"],
            row["Incorrect Answer 1"],
            row["Incorrect Answer 2"],
            row["Incorrect Answer 3"],
        ]
        sample = env.get_sample(i)
        lines = sample.prompt.splitlines()
        assert lines[0].startswith("Answer the following multiple choice question")
        assert lines[2] == row["Question"]
        assert lines[-4:] == [f"{'ABCD'[j]}) {choices[o]}" for j, o in enumerate(order)]
        letter = "ABCD"[order.index(0)]
        assert sample.answer == letter
        wrong = next(x for x in "ABCD" if x != letter)
        assert (
            score(env, f"Answer: {wrong}\nOn reflection...\nanswer: ${letter}$", i).sample_metrics["correct"]
            == 1.0
        )
        assert score(env, f"Answer: {letter}\nNo wait.\nAnswer: {wrong}", i).sample_metrics["correct"] == 0.0
        assert score(env, f"<think>Answer: {letter}</think>", i).sample_metrics["correct"] == 0.0


def test_a_missing_local_file_is_a_clear_error() -> None:
    env = resolve_eval("math500", {"data_files": str(DATA / "nope.jsonl")}, REGISTRY)
    with pytest.raises(FileNotFoundError, match="nope.jsonl.*check `data_files`"):
        env.samples()
