"""Every registered environment and eval loads offline and renders prompts via the chat template."""

from __future__ import annotations

import asyncio

import pytest

from telescope.core.env import ChatOptions, MultiTurnEnvironment, Sample, create_environment, create_eval

OFFLINE_KWARGS = {
    "countdown": {"num_generated": 20},
    "reverse_text": {"num_generated": 20},
    "wordle": {"num_samples": 10},
    "calculator": {"num_samples": 10},
}
ENVIRONMENTS = [
    "calculator",
    "countdown",
    "dapo_math",
    "deepscaler",
    "gsm8k",
    "hendrycks_math",
    "i3_code",
    "reverse_text",
    "wordle",
]
EVALS = ["aime_2024", "aime_2025", "gpqa_diamond", "math500"]


def test_registered_names(registry) -> None:
    assert set(ENVIRONMENTS) <= set(registry.names("environment"))
    assert set(EVALS) <= set(registry.names("eval"))
    assert registry.get("environment", "wordle").meta["multi_turn"] is True
    assert registry.get("environment", "gsm8k").meta["requires"] == ["math-verify"]


def _render(env, sample: Sample, tokenizer) -> str:
    chat = ChatOptions(enable_thinking=True)
    if isinstance(env, MultiTurnEnvironment):
        return env.format_messages(env.get_initial_prompt(sample), tokenizer, chat)
    return env.format_prompt(sample, tokenizer, chat)


@pytest.mark.parametrize("name", ENVIRONMENTS + EVALS)
def test_loads_offline_and_renders(registry, tiny_tokenizer, name: str) -> None:
    kwargs = OFFLINE_KWARGS.get(name, {"sample_data": True})
    env = create_eval(registry, name, kwargs) if name in EVALS else create_environment(registry, name, kwargs)
    assert env.name == name
    samples = env.load_dataset()
    assert 1 <= len(samples) <= 200
    for sample in samples[:3]:
        text = _render(env, sample, tiny_tokenizer)
        question = sample.prompt if isinstance(sample.prompt, str) else sample.prompt[-1]["content"]
        assert question in text or name == "gpqa_diamond" and question.splitlines()[2] in text
        assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
        assert name == "i3_code" or sample.answer != ""
    assert env.load_dataset(2) == samples[:2]


def test_any_environment_serves_as_an_eval(registry) -> None:
    env = create_eval(registry, "countdown", {"num_generated": 5})
    assert env.name == "countdown" and len(env.load_dataset()) == 5


def test_gsm8k_and_gpqa_rows(registry) -> None:
    gsm = registry.create("environment", "gsm8k", {"sample_data": True}).load_dataset()
    assert gsm[0].answer == "14"
    gpqa = registry.create("eval", "gpqa_diamond", {"sample_data": True})
    first = gpqa.load_dataset()
    assert [s.answer for s in first] == [s.answer for s in gpqa.load_dataset()]  # same shuffle every load
    s = first[0]
    correct_line = next(line for line in s.prompt.splitlines() if line.startswith(f"{s.answer}) "))
    assert correct_line == f"{s.answer}) Photon"
    assert asyncio.run(gpqa.score(f"Reasoning...\nAnswer: {s.answer}", s)).total_reward == 1.0
    wrong = "A" if s.answer != "A" else "B"
    assert asyncio.run(gpqa.score(f"Answer: {s.answer}\nAnswer: ${wrong}$", s)).total_reward == 0.0


def test_math500_metrics_and_tags(registry) -> None:
    env = registry.create("eval", "math500", {"sample_data": True})
    sample = env.load_dataset()[1]
    result = asyncio.run(env.evaluate("\\boxed{\\frac{5}{6}}", sample))
    assert result.metrics["correct"] == 1.0 and result.metrics["level"] == 2.0
    assert result.sample_tags == {"subject": "Prealgebra"}


def test_data_files_override(registry, tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n')
    env = registry.create("environment", "deepscaler", {"data_files": str(path)})
    assert [(s.prompt, s.answer) for s in env.load_dataset()] == [("1+1?", "2")]
    with pytest.raises(FileNotFoundError, match="data_files"):
        registry.create(
            "environment", "deepscaler", {"data_files": str(tmp_path / "missing.jsonl")}
        ).load_dataset()


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("olleh", 1.0),
        ("olle", 2 * 4 / 9),
        ("", 0.0),
        ("<think>x</think> olleh ", 1.0),
        ("hello", 2 * 2 / 10),
    ],  # LCS("hello", "olleh") = "ll",
)
def test_reverse_text_reward(registry, completion: str, expected: float) -> None:
    env = registry.create("environment", "reverse_text", {})
    result = asyncio.run(env.score(completion, Sample("hello", "olleh")))
    assert result.total_reward == pytest.approx(expected)


def test_hub_dataset_path_offline_gives_a_clear_error() -> None:
    import os
    import subprocess
    import sys

    code = (
        "from telescope.core.plugins import load_plugins\n"
        "env = load_plugins()[1].create('eval', 'math500', {})\n"
        "try:\n    env.load_dataset()\nexcept RuntimeError as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "could not load dataset 'HuggingFaceH4/MATH-500' (subset None, split 'test')" in out.stdout, (
        out.stderr
    )
    assert "sample_data: true" in out.stdout


def test_parquet_data_files_load_through_datasets(registry, tmp_path) -> None:
    import datasets

    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([{"question": "2+2?", "answer": "so #### 4"}]).to_parquet(str(path))
    env = registry.create("environment", "gsm8k", {"data_files": [str(path)]})
    assert [(s.prompt, s.answer) for s in env.load_dataset()] == [("2+2?", "4")]
