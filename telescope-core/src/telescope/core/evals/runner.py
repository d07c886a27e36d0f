"""``EvalRunner``: evals run exactly like training rollouts, on the servers they are given.

Prompts are rendered once (``PromptSource.prepare``, as in training) when the runner is
built; each completion is one ``RolloutRunner`` request with a seed derived from the run
seed, the eval name, the sample index and the completion index, so an eval repeats. Work is
spread over the clients through one queue, ``max_concurrent_prompts_per_server`` requests
in flight per client. A failed request is counted in ``errors``; the run goes on.

A completion an infrastructure failure ended (``telescope.core.infra``: a sandbox that could not be
created, a server's 5xx, ...) is no score: as in training (``rollouts/outcomes.py``, the same
``infra_*`` settings and ``InfraLedger`` decisions) it runs again after a backoff, and when its
retries run out it is left out of the eval's metrics and counted (``infra_masked``; the retries in
``infra_retried``), never scored 0.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telescope.core.env.base import Environment
from telescope.core.env.chat import ChatOptions
from telescope.core.env.types import RewardResult, Sample
from telescope.core.evals.aggregate import CompletionOutcome, EvalResult, aggregate
from telescope.core.evals.resolve import LoadedEval, load_eval
from telescope.core.infra import infra_cause
from telescope.core.rollouts.outcomes import InfraLedger, InfraPolicy
from telescope.core.rollouts.prompts import PreparedPrompt, PromptSource
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner, SampleTask, request_seed
from telescope.core.rollouts.scheduler import PromptItem
from telescope.core.rollouts.tokens import Interleaver, stop_token_ids

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.inference.server_client import ServerClient

__all__ = ["EvalRunner", "eval_scoring_env", "eval_settings"]

Progress = Callable[[str, int, int], None]


def eval_settings(cfg: TelescopeConfig, entry: Any, stop_ids: list[int]) -> GenerationSettings:
    """The training sampling settings, overridden by the entry's non-null temperature/top_p/max_tokens."""
    base = GenerationSettings.from_config(cfg, stop_ids)
    overrides = {
        f: getattr(entry, f) for f in ("temperature", "top_p", "max_tokens") if getattr(entry, f) is not None
    }
    return dataclasses.replace(base, **overrides)


def eval_scoring_env(env: Environment) -> Environment:
    """A shallow copy of ``env`` whose ``score`` returns the eval metrics (``compute_eval_metrics``).

    ``RolloutRunner`` scores through ``env.score``; an instance attribute replaces it for evals
    only, so environments that define their own eval metrics get them, and the reward is kept.
    """
    own_metrics = type(env).compute_eval_metrics is not Environment.compute_eval_metrics
    scored = copy.copy(env)

    async def score(target: Any, sample: Sample, eos_token: str = "") -> RewardResult:
        reward = await env.score(target, sample, eos_token)
        if not own_metrics:
            return reward
        result = await env.evaluate(target, sample, eos_token)
        return RewardResult(
            reward.total_reward,
            dict(result.metrics),
            golden_answers=result.golden_answers,
            info_turns=result.info_turns,
            sample_tags=result.sample_tags,
        )

    scored.score = score  # type: ignore[method-assign]
    return scored


@dataclass
class _Eval:
    loaded: LoadedEval
    prompts: list[PreparedPrompt]
    runner: RolloutRunner
    scoring_env: Environment

    @property
    def n(self) -> int:
        """Completions per sample: the largest k of its pass_k (at least 1)."""
        return int(self.loaded.entry.pass_k.max_k)


class EvalRunner:
    """Loads every ``cfg.evals`` entry once; ``run`` evaluates some of them on given clients."""

    def __init__(
        self,
        cfg: TelescopeConfig,
        registry: Any,
        tokenizer: Any,
        progress: Progress | None = None,
        infra: InfraLedger | None = None,
    ) -> None:
        """``infra``: the training run's ledger (``Orchestrator.infra``): the evals' infrastructure
        failures then count in its ``infra/*`` metrics and toward its ``infra_max_failure_rate``, and an
        eval that takes the rate above it ends the run (``InfraRateError``) as training would. None
        (``telescope eval``): a ledger of its own per ``run``, retries and masking only."""
        names = [e.name for e in cfg.evals]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"evals: {dupes} listed more than once; their metrics would collide - keep one entry each"
            )
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.progress = progress
        chat = ChatOptions.from_config(cfg)
        stop_ids = stop_token_ids(tokenizer)
        interleaver = Interleaver(tokenizer, chat) if cfg.interleaved_rollouts else None
        self.evals: dict[str, _Eval] = {}
        for entry in cfg.evals:
            loaded = load_eval(entry, registry)
            source = PromptSource(None, {entry.name: loaded.env}, {}, tokenizer, chat, 0)  # type: ignore[arg-type]
            prompts = [source.prepare(PromptItem(0, entry.name, i, 0)) for i in range(len(loaded.samples))]
            runner = RolloutRunner(tokenizer, eval_settings(cfg, entry, stop_ids), interleaver)
            self.evals[entry.name] = _Eval(loaded, prompts, runner, eval_scoring_env(loaded.env))
        self._prepared: set[str] = set()
        self._run_ledger = infra
        self._infra = infra or InfraLedger(InfraPolicy.from_config(cfg))
        """Retry or mask of each completion an infrastructure failure ended (the run's, else a new
        one per ``run``)."""

    def due(self, step: int) -> list[Any]:
        """Entries due after completed (1-indexed) training step ``step``."""
        return [e for e in self.cfg.evals if step > 0 and step % e.eval_every == 0]

    async def run(self, entries: list[Any], clients: Sequence[ServerClient], step: int) -> list[EvalResult]:
        """Evaluate ``entries`` on ``clients``; one ``EvalResult`` per entry, in order."""
        if not clients:
            raise ValueError("EvalRunner.run needs at least one inference client")
        chosen = [self._get(e.name) for e in entries]
        for ev in chosen:
            if ev.loaded.name not in self._prepared:
                await ev.loaded.env.prepare_resources()
                self._prepared.add(ev.loaded.name)
        outcomes = [[[CompletionOutcome() for _ in range(ev.n)] for _ in ev.prompts] for ev in chosen]
        jobs = deque(
            (e, s, c) for e, ev in enumerate(chosen) for s in range(len(ev.prompts)) for c in range(ev.n)
        )
        done = [0] * len(chosen)
        self._infra = self._run_ledger or InfraLedger(InfraPolicy.from_config(self.cfg))

        async def worker(server: int) -> None:
            while jobs:
                e, s, c = jobs.popleft()
                outcomes[e][s][c] = await self._complete(chosen[e], s, c, clients[server], server, step)
                done[e] += 1
                if self.progress is not None:
                    self.progress(chosen[e].loaded.name, done[e], len(chosen[e].prompts) * chosen[e].n)

        per_client = max(1, int(self.cfg.max_concurrent_prompts_per_server))
        await asyncio.gather(*(worker(i) for i in range(len(clients)) for _ in range(per_client)))
        return [self._aggregate(ev, outs, step) for ev, outs in zip(chosen, outcomes, strict=True)]

    def _get(self, name: str) -> _Eval:
        if name not in self.evals:
            raise KeyError(f"eval '{name}' is not in this runner's config (known: {sorted(self.evals)})")
        return self.evals[name]

    async def _complete(
        self, ev: _Eval, pos: int, completion: int, client: ServerClient, server: int, step: int
    ) -> CompletionOutcome:
        prompt, name = ev.prompts[pos], ev.loaded.name
        index = prompt.item.sample_idx
        task = SampleTask(
            request_id=f"eval-{name}-step{step}-{index}-{completion}",
            env=ev.scoring_env,
            sample=prompt.sample,
            prompt_ids=prompt.prompt_ids,
            prompt_text=prompt.prompt_text,
            reward_min=None,
            reward_max=None,
            server=server,
            seed=request_seed(int(self.cfg.seed), "eval", name, index, completion),
        )
        retries = 0
        while True:
            try:
                rollout = await ev.runner.run(client, task, lambda: None)
                break
            except Exception as exc:  # a failed request is counted; only the run's infra rate stops evals
                error = infra_cause(exc)
                if error is None:
                    return CompletionOutcome(error=f"{type(exc).__name__}: {exc}", infra_retries=retries)
                retry = self._infra.failed(name, error, retries)
                stop = self._infra.rate_exceeded() if self._run_ledger is not None else None
                if stop is not None:
                    raise stop from exc
                if not retry:
                    message = f"infrastructure failure ({error.cause}, provider '{error.provider}'): {error}"
                    return CompletionOutcome(error=message, infra_cause=error.cause, infra_retries=retries)
                retries += 1
                await asyncio.sleep(self._infra.policy.backoff(retries))
        self._infra.attempt_finished()
        metrics = {k: float(v) for k, v in rollout.sample_metrics.items()}
        metrics.setdefault("reward", float(rollout.raw_reward))
        return CompletionOutcome(
            rollout.completion_text,
            float(rollout.raw_reward),
            metrics,
            rollout.finish_reason,
            num_tokens=len(rollout.completion_ids),
            infra_retries=retries,
        )

    def _aggregate(self, ev: _Eval, outcomes: list[list[CompletionOutcome]], step: int) -> EvalResult:
        samples = [(p.item.sample_idx, p.prompt_text, p.sample.answer) for p in ev.prompts]
        return aggregate(ev.loaded.name, step, ev.loaded.entry.pass_k, samples, outcomes)

    async def close(self) -> None:
        """Release what the evals' ``prepare_resources`` started."""
        for name in sorted(self._prepared):
            await self.evals[name].loaded.env.close()
        self._prepared.clear()
