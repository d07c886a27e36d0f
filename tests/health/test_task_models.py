"""The health bench's countdown and wordle models (task_models.py): their warm-start examples are the
environments' own prompts with solutions the environments score as valid, and the warm-started
models' samples score differently within a group (the learning signal a healthy run needs)."""

from __future__ import annotations

import asyncio
import random
import re
import statistics
from typing import Any

import pytest
from task_models import WORDLE_GUESSES, countdown_sample, sample_rewards, task_env, task_example, task_model

from telescope.envs.wordle import format_score


def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_countdown_examples_are_the_environments_prompts_with_full_mark_solutions(tiny_path: str) -> None:
    tok, env, example = _tokenizer(tiny_path), task_env("countdown"), task_example("countdown")
    rng = random.Random("test")
    for _ in range(200):
        ids, solution = example(tok, rng)
        prompt = tok.decode(ids)
        found = re.search(r"Using the numbers \[([\d, ]+)\], create an equation that equals (\d+)\.", prompt)
        assert found is not None, prompt
        nums, target = [int(n) for n in found.group(1).split(", ")], int(found.group(2))
        sample = countdown_sample(nums, target)
        assert prompt == env.format_prompt(sample, tok)
        assert asyncio.run(env.score(solution, sample)).total_reward == 2.0, (nums, target, solution)


def test_wordle_examples_are_valid_guesses_in_the_environments_conversation(tiny_path: str) -> None:
    tok, env, example = _tokenizer(tiny_path), task_env("wordle"), task_example("wordle")
    rng = random.Random("test")
    turns = []
    for _ in range(200):
        ids, solution = example(tok, rng)
        prompt = tok.decode(ids)
        assert format_score(solution) == 1.0
        guess = solution.removeprefix("<guess>[").removesuffix("]</guess>")
        assert guess in WORDLE_GUESSES and guess in env.guesses
        previous = re.findall(r"<guess>\[(\w+)\]</guess><\|im_end\|>", prompt)
        assert guess not in previous  # a repeated guess is an invalid move
        if previous:
            assert re.search(r"\n[GYX]( [GYX]){4}\n", prompt), prompt  # the feedback on the first
        turns.append(len(previous))
    assert sorted(set(turns)) == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("task,max_tokens", [("countdown", 64), ("wordle", 32)])
def test_the_warm_started_models_score_differently_within_groups(
    model_cache: str, task: str, max_tokens: int
) -> None:
    # The environment scores 8 samples of each of 6 prompts (as bench/health.py's runs sample them):
    # not every sample alike and not every one 0 (the random telescope/tiny's case: no signal),
    # and most groups of a prompt's samples are not all alike (GRPO learns from those).
    groups = sample_rewards(task, task_model(task), prompts=6, n=8, max_tokens=max_tokens)
    flat = [r for group in groups for r in group]
    assert any(flat) and len(set(flat)) > 1, groups
    assert sum(len(set(g)) > 1 for g in groups) >= 4, groups
    assert statistics.mean(flat) > 0.05, groups
