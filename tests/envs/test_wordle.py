"""Wordle: feedback rules and full games against scripted players, with hand-computed rewards."""

from __future__ import annotations

import asyncio

import pytest

from telescope.core.env import Sample, run_text_rollout
from telescope.envs.wordle import INTRO, format_score
from telescope.envs.wordle_game import score_guess


def test_feedback_counts_duplicates() -> None:
    assert score_guess("paper", "apple") == "YYGYX"
    assert score_guess("eerie", "crane") == "XXYXG"
    assert score_guess("crane", "crane") == "GGGGG"


def test_format_score_components() -> None:
    assert format_score("<guess>[slate]</guess>") == pytest.approx(1.0)
    assert format_score("<think>hmm</think><guess>[slate]</guess>") == pytest.approx(1.0)
    assert format_score("I guess <guess>[slate]</guess>") == pytest.approx(0.8)
    assert format_score("<guess> [slate] </guess>") == pytest.approx(0.8)
    assert format_score("<guess></guess>") == pytest.approx(0.6)
    assert format_score("slate") == pytest.approx(0.2)  # no field: only the spacing credit


def _play(registry, secret: str, moves: list[str], **kwargs):
    env = registry.create("environment", "wordle", kwargs)
    sample = Sample(INTRO, secret)
    turns = iter(moves)
    state = asyncio.run(run_text_rollout(env, sample, lambda messages: next(turns)))
    return env, state, asyncio.run(env.score(state, sample))


def test_winning_game(registry) -> None:
    env, state, result = _play(
        registry, "crane", ["<guess>[slate]</guess>", "<think>hmm</think><guess>[crane]</guess>"]
    )
    assert state.stop_reason == "game_over" and state.num_turns == 2
    feedback = state.last_messages()[-2]["content"]
    assert feedback == "S L A T E\nX X G X G\nYou have 5 guesses left."
    m = result.sample_metrics
    assert (m["correct"], m["partial"], m["length"], m["format"]) == (1.0, 0.0, 0.5, 1.0)
    assert result.total_reward == pytest.approx(1 + 0 + 0.5 + 0.2 * 1.0)
    assert result.golden_answers["correct"] == "crane" and env.reward_max == 2.2


def test_invalid_words_and_repeats(registry) -> None:
    moves = [
        "I guess <guess>[xxxxx]</guess>",  # not a word: warning 1
        "<guess>[slate]</guess>",  # valid
        "<guess>[slate]</guess>",  # repeated: warning
        "<guess> [plane] </guess>",  # valid (spacing costs format only)
        "<guess>[zzzzz]</guess>",  # invalid
        "<guess>[qqqqq]</guess>",  # second invalid in a row: game over
    ]
    _, state, result = _play(registry, "crane", moves, max_turns=10)
    assert state.stop_reason == "game_over" and state.num_turns == 6
    assert state.custom["game"].history == ["slate", "plane"] and not state.custom["game"].won
    m = result.sample_metrics
    assert (m["correct"], m["length"]) == (0.0, 0.0)
    assert m["partial"] == pytest.approx(0.2 * 3)  # last feedback: X X G G G
    assert m["format"] == pytest.approx((0.8 + 1 + 1 + 0.8 + 1 + 1) / 6)
    assert result.total_reward == pytest.approx(0.6 + 0.2 * 5.6 / 6)
    assert m["won"] == 0.0 and m["num_guesses"] == 2.0


def test_running_out_of_guesses_and_turn_limit(registry) -> None:
    words = ["slate", "plane", "brick", "house", "light", "water"]
    _, state, result = _play(registry, "crane", [f"<guess>[{w}]</guess>" for w in words])
    assert state.stop_reason == "game_over" and state.num_turns == 6
    _, state, _ = _play(registry, "crane", [f"<guess>[{w}]</guess>" for w in words], max_turns=2)
    assert state.stop_reason == "max_turns_reached" and state.num_turns == 2


def test_dataset_is_seeded_and_private(registry) -> None:
    import random

    before = random.getstate()
    a = registry.create("environment", "wordle", {"num_samples": 20, "seed": 1}).load_dataset()
    b = registry.create("environment", "wordle", {"num_samples": 20, "seed": 1}).load_dataset()
    assert [s.answer for s in a] == [s.answer for s in b] and random.getstate() == before
    assert len({s.answer for s in a}) > 5


def test_real_guesses_are_valid_apart_from_the_secrets(registry, tmp_path) -> None:
    env = registry.create("environment", "wordle", {})
    assert {"stare", "arose", "adieu"} <= env.guesses and not {"stare", "arose", "adieu"} & set(env.words)
    assert set(env.words) <= env.guesses and len(env.guesses) > 4000 and len(env.words) == 471
    _, state, _ = _play(
        registry,
        "crane",
        [
            "<guess>[stare]</guess>",
            "<guess>[adieu]</guess>",
            "<guess>[arose]</guess>",
            "<guess>[crane]</guess>",
        ],
    )
    assert state.custom["game"].history == ["stare", "adieu", "arose", "crane"] and state.custom["game"].won
    own = tmp_path / "guesses.txt"
    own.write_text("zzzzz\n")
    custom = registry.create("environment", "wordle", {"guess_list_file": str(own)})
    assert "zzzzz" in custom.guesses and "stare" not in custom.guesses and "crane" in custom.guesses
