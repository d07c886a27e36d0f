"""Tiny models warm-started on countdown and wordle, for the health bench's healthy runs.

The built-in ``telescope/tiny`` (random weights) scores 0 on every countdown and wordle sample:
a run on it has no learning signal, and the sentinel's ``reward_saturated`` is then a true
finding. These models get a short supervised pass (``telescope.core.models.warmstart``) on the
environments' own prompts, rendered by the environments themselves, and on valid solutions, with
label smoothing, so their samples score differently within a group and GRPO has something to learn:

- countdown: ``<think>\n</think>\n<answer>EXPR</answer>``, EXPR the expression the problem's
  target was built from (``countdown_problem``, with the environment's operator rules). What the
  model learns is the format (reward 0, 0.5 or 1 varies within a group); it does not learn to copy
  the numbers from a 300-token prompt (not in 1500 steps either), so its equations are wrong;
- wordle: ``<guess>[word]</guess>``, a word of ``WORDLE_GUESSES``: the first guess, or the second,
  after the environment's feedback on the first (a word that feedback allows, if one does): format
  and partial credit vary within a group.

``task_model("countdown")`` builds the model once into ``cache_dir()/models`` (deterministic: the
spec's seed draws the weights and the examples) and returns its folder, which a run config names as ``model``. Lives here, not in
``telescope.core`` (which never imports an environment); bench/health.py imports it.
``python tests/health/task_models.py`` prints each model's reward mean and spread.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

from telescope.core.env import Sample
from telescope.core.models.tiny import TinyModelSpec, cached_tiny_model

__all__ = [
    "TASK_SPECS",
    "countdown_problem",
    "countdown_sample",
    "sample_rewards",
    "task_env",
    "task_example",
    "task_model",
]

VERSION = "2"
"""Bump when an example or a spec changes: the cached folders are keyed by it."""
TASK_SPECS: dict[str, TinyModelSpec] = {
    "countdown": TinyModelSpec(
        128, 2, 4, 2, 256, seed=11, warm_start_steps=150, warm_start_label_smoothing=0.05
    ),
    "wordle": TinyModelSpec(
        128, 2, 4, 2, 256, seed=12, warm_start_steps=150, warm_start_label_smoothing=0.05
    ),
}
WORDLE_GUESSES = (
    "crane slate raise audio heart learn plant stone about other light house sound round water earth"
).split()
"""The wordle model's words (secret-list words): few enough to learn in a short warm start, so its
guesses are valid (feedback, partial credit) more often than not."""
WORDLE_TURNS = 2
"""The wordle games the bench plays (``max_turns``): the warm start's second turn is the last."""


def countdown_problem(rng: random.Random, count: int, max_number: int) -> tuple[list[int], int, str]:
    """A problem as ``telescope.envs.countdown.generate_problem`` makes them (the same numbers, the
    same operator rules), and the expression its target was built from. Built over the numbers in
    the order the question lists them (the environment's own problems shuffle that order first): a
    solution that copies the numbers in turn is the easiest one for a tiny model."""
    from telescope.envs.countdown import combine

    while True:
        nums = [rng.randint(1, max_number) for _ in range(count)]
        value, expression = combine(nums, rng)
        if 1 <= value <= 10_000:
            return nums, value, expression


def task_env(task: str) -> Any:
    """The environment ``task`` as the bench configures it (defaults; wordle: ``WORDLE_TURNS``)."""
    if task == "countdown":
        from telescope.envs.countdown import CountdownEnvironment

        return CountdownEnvironment()
    from telescope.envs.kwargs import WordleKwargs
    from telescope.envs.wordle import WordleEnvironment

    return WordleEnvironment(WordleKwargs(max_turns=WORDLE_TURNS))


def countdown_sample(nums: list[int], target: int) -> Sample:
    """The sample the countdown environment makes of a problem."""
    from telescope.envs.countdown import QUESTION

    return Sample(QUESTION.format(nums=nums, target=target), str(target), {"nums": nums, "target": target})


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def wordle_turn(env: Any, sample: Sample, guess: str) -> list[dict[str, Any]]:
    """The first guess ``guess`` of ``sample``'s game and the environment's reply (its feedback)."""
    state = env.create_initial_state(sample)
    assistant = {"role": "assistant", "content": f"<guess>[{guess}]</guess>"}
    reply = asyncio.run(env.env_response([*env.get_initial_prompt(sample), assistant], state))
    return [assistant, *reply]


def task_example(task: str) -> Any:
    """The warm start's ``Example`` of ``task``: ``(tokenizer, rng) -> (prompt ids, solution)``."""
    env = task_env(task)

    def countdown(tokenizer: Any, rng: random.Random) -> tuple[list[int], str]:
        nums, target, expression = countdown_problem(rng, rng.randint(3, 4), 99)
        prompt = env.format_prompt(countdown_sample(nums, target), tokenizer)
        return _ids(tokenizer, prompt), f"<think>\n</think>\n<answer>{expression}</answer>"

    def wordle(tokenizer: Any, rng: random.Random) -> tuple[list[int], str]:
        from telescope.envs.wordle import INTRO
        from telescope.envs.wordle_game import score_guess

        secret = rng.choice(env.words)
        sample = Sample(INTRO, secret, {})
        messages = env.get_initial_prompt(sample)
        first = rng.choice(WORDLE_GUESSES)
        if rng.random() < 0.5 or first == secret:  # the first guess
            guess = first
        else:  # the second: a word the first guess's feedback allows, if one of ours does
            messages = [*messages, *wordle_turn(env, sample, first)]
            others = [w for w in WORDLE_GUESSES if w != first]
            marks = score_guess(first, secret)
            guess = rng.choice([w for w in others if score_guess(first, w) == marks] or others)
        return _ids(tokenizer, env.format_messages(messages, tokenizer)), f"<guess>[{guess}]</guess>"

    return countdown if task == "countdown" else wordle


def task_model(task: str) -> str:
    """Folder of ``task``'s warm-started model (built on first use, then read from the cache)."""
    return cached_tiny_model(f"health--tiny-{task}-v{VERSION}", TASK_SPECS[task], task_example(task))


def sample_rewards(
    task: str, folder: str, *, prompts: int = 4, n: int = 8, max_tokens: int = 64, seed: int = 0
) -> list[list[float]]:
    """Rewards of ``n`` samples (temperature 1) of each of the environment's first ``prompts``
    samples by the model in ``folder``, scored by the environment (a wordle game: its turns)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from telescope.core.env.types import TrajectoryStep

    env = task_env(task)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    eos = str(tokenizer.eos_token)

    def generate(ids: list[int], count: int) -> list[list[int]]:
        out = model.generate(
            torch.tensor([ids]),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_tokens,
            num_return_sequences=count,
            pad_token_id=tokenizer.pad_token_id,
        )
        rows = [row[len(ids) :].tolist() for row in out]
        return [
            row[: row.index(tokenizer.pad_token_id)] if tokenizer.pad_token_id in row else row for row in rows
        ]

    def text(row: list[int]) -> str:
        return str(tokenizer.decode(row, skip_special_tokens=False))

    async def play(sample: Sample) -> float:  # one game, as rollouts/multi_turn.py plays it
        state = env.create_initial_state(sample)
        messages = env.get_initial_prompt(sample)
        for _ in range(env.max_turns):
            ids = _ids(tokenizer, env.format_messages(messages, tokenizer))
            (row,) = generate(ids, 1)
            content = text(row)
            content = content[: -len(eos)] if content.endswith(eos) else content
            assistant = {"role": "assistant", "content": content}
            state.trajectory.append(TrajectoryStep(prompt=list(messages), completion=[assistant]))
            reply = await env.env_response([*messages, assistant], state)
            if env.is_done(state)[0]:
                break
            messages = env.get_next_prompt_messages(state, reply)
        return float((await env.score(state, sample, eos)).total_reward)

    rewards = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for sample in env.load_dataset(prompts):
            if task == "countdown":
                ids = _ids(tokenizer, env.format_prompt(sample, tokenizer))
                rows = generate(ids, n)
                scored = [asyncio.run(env.score(text(r), sample, eos)) for r in rows]
                rewards.append([float(r.total_reward) for r in scored])
            else:
                rewards.append([asyncio.run(play(sample)) for _ in range(n)])
    return rewards


def main() -> None:
    import time

    for task, tokens in (("countdown", 64), ("wordle", 32)):
        start = time.time()
        folder = task_model(task)
        built = time.time() - start
        rewards = sample_rewards(task, folder, prompts=8, n=8, max_tokens=tokens)
        flat = [r for group in rewards for r in group]
        spread = statistics.mean(statistics.pstdev(g) for g in rewards)
        print(
            f"{task}: {folder} ({built:.0f} s to build or load); reward mean {statistics.mean(flat):.3f}, "
            f"std {statistics.pstdev(flat):.3f}, within-group std {spread:.3f}, "
            f"groups all alike {sum(len(set(g)) == 1 for g in rewards)}/{len(rewards)}, "
            f"nonzero {sum(r > 0 for r in flat)}/{len(flat)}"
        )
        for group in rewards[:3]:
            print("   ", [round(r, 2) for r in group])


if __name__ == "__main__":
    main()
