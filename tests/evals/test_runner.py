"""EvalRunner against a real transformers-engine server on the built-in tiny model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from math import comb
from typing import Any

import pytest
from eval_envs import parity

from telescope.core.env.parsers import strip_eos
from telescope.core.evals import EvalRunner, flat_metrics, resolve_eval, training_exclusions
from telescope.core.inference.client import InferenceClient
from telescope.core.registry import UnknownComponentError
from telescope.core.testing import make_config


@pytest.fixture(scope="module")
def server_url(tiny_path: str) -> Iterator[str]:
    from telescope.core.inference.settings import TransformersEngineKwargs
    from telescope.core.inference.transformers_engine.server import start_in_thread
    from telescope.core.weights.group import free_port

    cfg = make_config(model="telescope/tiny", max_model_len=1024, seed=7)  # room for wordle's long prompt
    srv = start_in_thread(cfg, TransformersEngineKwargs(max_num_seqs=16), port=free_port())
    yield srv.url
    srv.stop()


def eval_cfg(**entry: Any) -> Any:
    evals = [{"name": "parity", "num_samples": 5, "max_tokens": 6, **entry}]
    return make_config(
        model="telescope/tiny",
        max_model_len=256,
        max_tokens=40,
        temperature=1.0,
        seed=3,
        max_concurrent_prompts_per_server=3,
        environments=[{"name": "parity"}],
        evals=evals,
    )


class FlakyClient:
    """A real client that fails the requests whose id ends with one of ``fail``."""

    def __init__(self, url: str, fail: tuple[str, ...] = ()) -> None:
        self.inner, self.fail = InferenceClient(url), fail
        self.request_ids: list[str] = []

    async def complete(self, prompt: list[int], **params: Any) -> Any:
        self.request_ids.append(params["request_id"])
        if params["request_id"].endswith(self.fail or ("\0",)):
            raise RuntimeError("injected failure")
        return await self.inner.complete(prompt, **params)


def run_eval(runner: EvalRunner, clients: list[Any], step: int) -> Any:
    async def main() -> Any:
        try:
            return await runner.run(list(runner.cfg.evals), clients, step)
        finally:
            for c in clients:
                await c.inner.close()

    return asyncio.run(main())


def test_metrics_follow_from_the_rows(server_url: str, registry: Any, tokenizer: Any) -> None:
    cfg = eval_cfg(pass_k={"at_k": {"metrics": ["parity"], "k": [1, 3]}, "pow_k": {"k": [2]}})
    runner = EvalRunner(cfg, registry, tokenizer)
    clients = [FlakyClient(server_url), FlakyClient(server_url)]
    (result,) = run_eval(runner, clients, step=10)
    assert result.name == "parity" and result.step == 10
    env: Any = resolve_eval("parity", {}, registry)
    rows = result.rows
    assert [r["prompt"] for r in rows] == [env.format_prompt(env.get_sample(i), tokenizer) for i in range(5)]
    assert all(len(r["completions"]) == 3 and r["errors"] == [None] * 3 for r in rows)  # n = max k
    for r in rows:  # the entry's max_tokens (6) overrides the training 40
        assert all(1 <= n <= 6 for n in r["completion_tokens"])
        assert [m["parity"] for m in r["metrics"]] == [parity(t) for t in r["completions"]]
    counts = [sum(parity(t) for t in r["completions"]) for r in rows]
    m = result.metrics
    assert m["num_samples"] == 5 and m["num_completions"] == 15 and m["errors"] == 0
    assert m["parity"] == pytest.approx(sum(counts) / 15)
    assert m["reward"] == pytest.approx(m["parity"])
    # The reward sees each completion without its stop text (the EOS rule); rows keep the raw text.
    seen = [strip_eos(t, tokenizer.eos_token) for r in rows for t in r["completions"]]
    assert m["length"] == pytest.approx(sum(len(t) for t in seen) / 15)
    assert m["pass@3/parity"] == pytest.approx(sum(c > 0 for c in counts) / 5)
    assert m["pass@1/parity"] == pytest.approx(sum(c / 3 for c in counts) / 5)
    assert m["pass^2/parity"] == pytest.approx(sum(comb(int(c), 2) / 3 for c in counts) / 5)
    assert m["pass^2/length"] == pytest.approx(1.0)  # every completion has length > 0
    assert "pass@1/length" not in m  # at_k names only parity
    assert {rid.split("-")[0] for c in clients for rid in c.request_ids} == {"eval"}
    assert all(c.request_ids for c in clients)  # work was spread over both clients
    assert flat_metrics([result])["eval/parity/pass@3/parity"] == m["pass@3/parity"]
    # Seeds come from (seed, eval, sample, completion): one client, same completions.
    (again,) = run_eval(EvalRunner(cfg, registry, tokenizer), [FlakyClient(server_url)], step=20)
    assert [r["completions"] for r in again.rows] == [r["completions"] for r in rows]


class RecordingClient(FlakyClient):
    """A real client that keeps every request's sampling parameters, by request id."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.params: dict[str, dict[str, Any]] = {}

    async def complete(self, prompt: list[int], **params: Any) -> Any:
        self.params[params["request_id"]] = params
        return await super().complete(prompt, **params)


def test_per_eval_sampling_overrides_reach_the_server(server_url: str, registry: Any, tokenizer: Any) -> None:
    evals = [
        {
            "name": "parity",
            "num_samples": 3,
            "pass_k": [3],
            "temperature": 0.0,
            "top_p": 0.5,
            "max_tokens": 3,
        },
        {"name": "own_metrics", "num_samples": 2, "pass_k": [2]},
    ]
    cfg = make_config(
        model="telescope/tiny",
        max_model_len=256,
        max_tokens=40,
        temperature=1.0,
        top_p=None,
        seed=3,
        environments=[{"name": "parity"}],
        evals=evals,
    )
    client = RecordingClient(server_url)
    greedy, default = run_eval(EvalRunner(cfg, registry, tokenizer), [client], step=2)
    sent = {
        name: [p for rid, p in client.params.items() if rid.startswith(f"eval-{name}-")]
        for name in ("parity", "own_metrics")
    }
    assert len(sent["parity"]) == 9 and len(sent["own_metrics"]) == 4  # samples x max k
    assert {(p["temperature"], p["top_p"], p["max_tokens"]) for p in sent["parity"]} == {(0.0, 0.5, 3)}
    assert {(p["temperature"], p["top_p"], p["max_tokens"]) for p in sent["own_metrics"]} == {(1.0, None, 40)}
    assert len({p["seed"] for p in sent["parity"]}) == 9  # every completion has its own seed ...
    for row in greedy.rows:  # ... yet temperature 0 samples the same greedy tokens for each
        assert len(set(row["completions"])) == 1 and all(n <= 3 for n in row["completion_tokens"])
    assert any(n > 3 for r in default.rows for n in r["completion_tokens"])  # the training max_tokens


def test_a_failed_request_is_counted_and_the_sample_still_counts(
    server_url: str, registry: Any, tokenizer: Any
) -> None:
    cfg = eval_cfg(num_samples=3, pass_k=[1, 2])
    runner = EvalRunner(cfg, registry, tokenizer)
    (result,) = run_eval(runner, [FlakyClient(server_url, fail=("-0-1",))], step=1)
    m, rows = result.metrics, result.rows
    assert m["errors"] == 1 and m["num_completions"] == 5 and m["num_samples"] == 3
    assert rows[0]["errors"][1] == "RuntimeError: injected failure"
    assert rows[0]["completions"][1] == ""
    first = [parity(rows[0]["completions"][0])]  # sample 0 keeps its one good completion
    assert rows[0]["pass@1/parity"] == pytest.approx(first[0])
    assert rows[0]["pass@2/parity"] is None
    valid = [t for r in rows for t, e in zip(r["completions"], r["errors"], strict=True) if e is None]
    assert m["parity"] == pytest.approx(sum(parity(t) for t in valid) / 5)
    assert m["pass@2/parity"] == pytest.approx(sum(r["pass@2/parity"] for r in rows[1:]) / 2)


def test_an_infrastructure_failure_is_retried_then_left_out_never_scored(
    server_url: str, registry: Any, tokenizer: Any
) -> None:
    """As in training: sample 0's sandbox fails once (retried, then scored), sample 1's always (masked
    after infra_max_retries_per_sample retries: out of the metrics, counted in infra_masked, not errors)."""
    from eval_envs import FlakySandboxEnv

    from telescope.core.infra import ORIGINS

    FlakySandboxEnv.calls.clear()
    ORIGINS.drain()
    cfg = eval_cfg(name="flaky_sandbox", num_samples=3)
    cfg = cfg.model_copy(update={"infra_max_retries_per_sample": 2, "infra_retry_backoff_s": 0.0})
    (result,) = run_eval(EvalRunner(cfg, registry, tokenizer), [FlakyClient(server_url)], step=1)
    m, rows = result.metrics, result.rows
    assert FlakySandboxEnv.calls == {0: 2, 1: 3, 2: 1}  # 1 + 2 retries for sample 1
    assert (m["infra_masked"], m["infra_retried"], m["errors"], m["num_completions"]) == (1, 3, 0, 2)
    assert rows[1]["rewards"] == [None] and "sandbox_create" in rows[1]["errors"][0]
    assert [r["metrics"][0]["odd"] for r in (rows[0], rows[2])] == [
        1 - parity(r["completions"][0]) for r in (rows[0], rows[2])
    ]
    assert m["odd"] == pytest.approx((rows[0]["metrics"][0]["odd"] + rows[2]["metrics"][0]["odd"]) / 2)
    counted = ORIGINS.drain()
    assert sum(n for o, n in counted.items() if o.cause == "sandbox_create") == 4  # where they happened


def test_in_a_run_eval_infra_failures_count_toward_the_runs_failure_rate(
    server_url: str, registry: Any, tokenizer: Any
) -> None:
    """With the training run's ledger, the evals' infrastructure failures are the run's: counted in
    its ``infra/*`` and, past ``infra_max_failure_rate`` over ``infra_failure_window`` attempts, the
    eval ends the run (``InfraRateError``): sample 1's sandbox never starts, sample 0's fails once,
    so a 3-attempt window fills with 2 or 3 failures (> 0.5 x 3) whatever the order. ``telescope eval``
    (its own ledger) masks the same failures and finishes."""
    from eval_envs import FlakySandboxEnv

    from telescope.core.infra import ORIGINS
    from telescope.core.rollouts.outcomes import InfraLedger, InfraPolicy, InfraRateError

    cfg = eval_cfg(name="flaky_sandbox", num_samples=2)
    cfg = cfg.model_copy(
        update={
            "infra_max_retries_per_sample": 2,
            "infra_retry_backoff_s": 0.0,
            "infra_failure_window": 3,
            "infra_max_failure_rate": 0.5,
            "max_concurrent_prompts_per_server": 1,
        }
    )
    FlakySandboxEnv.calls.clear()
    ORIGINS.drain()
    ledger = InfraLedger(InfraPolicy.from_config(cfg))
    runner = EvalRunner(cfg, registry, tokenizer, infra=ledger)
    with pytest.raises(
        InfraRateError, match=r"[23] of the last 3 sample attempts .* provider 'fake', cause 'sandbox_create'"
    ):
        run_eval(runner, [FlakyClient(server_url)], step=1)
    calls = dict(FlakySandboxEnv.calls)
    failures = (1 if calls.get(0) else 0) + calls.get(1, 0)  # sample 0 fails its first attempt only
    assert sum(calls.values()) >= 3 and failures >= 2  # the window filled before the rule spoke
    metrics = ledger.step_metrics()
    assert metrics["infra/failed"] == failures and metrics["infra/env/flaky_sandbox/failed"] == failures

    FlakySandboxEnv.calls.clear()
    (result,) = run_eval(EvalRunner(cfg, registry, tokenizer), [FlakyClient(server_url)], step=1)
    assert result.metrics["infra_masked"] == 1 and FlakySandboxEnv.calls == {0: 2, 1: 3}
    ORIGINS.drain()


def test_environments_with_their_own_eval_metrics(server_url: str, registry: Any, tokenizer: Any) -> None:
    cfg = eval_cfg(name="own_metrics", num_samples=2, pass_k=[2])
    (result,) = run_eval(EvalRunner(cfg, registry, tokenizer), [FlakyClient(server_url)], step=1)
    for row in result.rows:
        assert [m["odd"] for m in row["metrics"]] == [1 - parity(t) for t in row["completions"]]
        assert row["rewards"] == [parity(t) for t in row["completions"]]  # the reward is kept
    assert "parity" not in result.metrics and "pass@2/odd" in result.metrics


def test_due_resolution_and_bad_entries(registry: Any, tokenizer: Any) -> None:
    cfg = make_config(
        environments=[{"name": "parity"}],
        evals=[{"name": "parity", "eval_every": 3}, {"name": "own_metrics", "eval_every": 2}],
    )
    runner = EvalRunner(cfg, registry, tokenizer)
    assert [[e.name for e in runner.due(s)] for s in (0, 1, 2, 3, 6)] == [
        [],
        [],
        ["own_metrics"],
        ["parity"],
        ["parity", "own_metrics"],
    ]
    with pytest.raises(UnknownComponentError, match="unknown eval 'parityy'. Did you mean 'parity'"):
        resolve_eval("parityy", {}, registry)
    twice = make_config(evals=[{"name": "parity"}, {"name": "parity"}])
    with pytest.raises(ValueError, match="listed more than once"):
        EvalRunner(twice, registry, tokenizer)
    whole = make_config(
        environments=[{"name": "parity"}], evals=[{"name": "parity", "separate_eval_samples": True}]
    )
    with pytest.raises(ValueError, match="num_samples -1, which reserves the whole dataset"):
        training_exclusions(whole, registry)


def test_a_multi_turn_environment_as_an_eval(server_url: str, tokenizer: Any) -> None:
    from telescope.core.plugins import load_plugins

    _, full = load_plugins()
    cfg = make_config(
        model="telescope/tiny",
        max_model_len=1024,
        max_tokens=4,
        seed=3,
        environments=[{"name": "wordle"}],
        evals=[{"name": "wordle", "num_samples": 2, "kwargs": {"max_turns": 2}}],
    )
    (result,) = run_eval(EvalRunner(cfg, full, tokenizer), [FlakyClient(server_url)], step=1)
    assert result.metrics["errors"] == 0 and result.metrics["num_completions"] == 2
    assert all(len(r["completions"]) == 1 for r in result.rows)
    # The model's turns (at most 4 tokens each, at most 2 turns) plus the environment's replies between them.
    assert all(n >= 1 for r in result.rows for n in r["completion_tokens"])
    assert all(r["finish_reasons"][0] in ("stop", "length") for r in result.rows)
    assert result.metrics["reward"] == pytest.approx(sum(r["rewards"][0] for r in result.rows) / 2)
