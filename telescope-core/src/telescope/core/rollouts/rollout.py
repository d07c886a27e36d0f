"""One sample's rollout: generate through an inference server, then score.

Single-turn: one request with the prompt's token ids. Multi-turn: the environment answers
each model turn; the next prompt reuses the exact token ids so far (``Interleaver``), and
environment tokens are masked out of the loss. Reaching the context limit ends a rollout
gracefully (it is scored as it stands), never with an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telescope.core.env.agent import AgentEnvironment
from telescope.core.env.base import Environment, MultiTurnEnvironment
from telescope.core.env.types import RewardResult, Sample
from telescope.core.rollouts.compaction import CompactionSettings
from telescope.core.rollouts.groups import RolloutSample, normalize_reward
from telescope.core.rollouts.routing import RouteKey, Router
from telescope.core.rollouts.seeds import request_seed, turn_seed
from telescope.core.rollouts.tokens import Interleaver

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.inference.server_client import ServerClient
    from telescope.core.rollouts.agent import AgentGateway

__all__ = ["GenerationSettings", "RolloutRunner", "SampleTask", "failed_sample", "request_seed"]


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling settings shared by every request of a run."""

    temperature: float
    top_p: float | None
    max_tokens: int
    max_model_len: int
    stop_token_ids: list[int]
    priority_by_turn: bool
    token_view_max_tokens: int = 0
    """Not a sampling setting: completions of at most this many tokens are also decoded token
    by token for the rollout records' token view (``rollout_token_view_max_tokens``)."""
    compaction: CompactionSettings | None = None
    """Multi-turn rollouts summarize and continue past ``at_tokens`` (None: they stop at max_model_len)."""

    @classmethod
    def from_config(cls, cfg: TelescopeConfig, stop_ids: list[int]) -> GenerationSettings:
        return cls(
            cfg.temperature,
            cfg.top_p,
            cfg.max_tokens,
            cfg.max_model_len,
            stop_ids,
            cfg.vllm_scheduling_policy == "priority",
            cfg.rollout_token_view_max_tokens,
            CompactionSettings.from_config(cfg),
        )


@dataclass
class SampleTask:
    """What a lane needs to run one sample."""

    request_id: str
    env: Environment
    sample: Sample
    prompt_ids: list[int]
    prompt_text: str
    reward_min: float | None
    reward_max: float | None
    server: int = -1
    lane: int = -1
    model_version: Callable[[], int] = lambda: -1
    seed: int | None = None
    """Sampling seed of the first request (turn t uses ``seed + t``): a rerun, or a resumed run,
    samples the same tokens from the same weights."""
    group_id: int = -1
    """The group this sample belongs to (its samples share the prompt: routing keeps them together)."""

    @property
    def route_key(self) -> RouteKey:
        """What the router knows of this sample's requests."""
        return RouteKey(self.request_id, f"g{self.group_id}", self.server)


class RolloutRunner:
    """Runs samples against a client; calls ``on_generated`` once the model's work is done."""

    def __init__(self, tokenizer: Any, settings: GenerationSettings, interleaver: Interleaver | None) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.interleaver = interleaver
        self.eos_text = tokenizer.eos_token or ""
        self._pieces: dict[int, str] = {}
        """Token id -> its text decoded alone (the token view decodes each id once per run)."""
        self.agent_gateway: AgentGateway | None = None
        """Where agent environments' rollouts reach the model (set by the runtime when a run has one)."""
        self.router: Router | None = None
        """Picks each request's server among ``clients`` (None: every request to the lane's server)."""
        self.clients: list[ServerClient] = []

    def route_requests(self, router: Router, clients: list[ServerClient]) -> None:
        """Send each request where ``router`` says (``clients[i]`` is server ``i``)."""
        if router.num_servers != len(clients):
            raise ValueError(
                f"the router knows {router.num_servers} servers but {len(clients)} clients were given"
            )
        self.router, self.clients = router, clients

    async def complete(
        self, client: ServerClient, task: SampleTask, prompt_ids: list[int], params: dict[str, Any]
    ) -> Any:
        """One request of ``task``: on the server the router picks (else ``client``, the lane's server)."""
        if self.router is None or self.router.policy == "pinned":
            (choice,) = await client.complete(prompt_ids, **params)
            return choice
        server = self.router.route(task.route_key, len(prompt_ids))  # the conversation it holds from now on
        with self.router.request(server):
            (choice,) = await self.clients[server].complete(prompt_ids, **params)
        return choice

    def request_params(
        self, prompt_len: int, turn: int, request_id: str, seed: int | None
    ) -> dict[str, Any] | None:
        room = self.settings.max_model_len - prompt_len
        if room < 1:
            return None
        return {
            "temperature": self.settings.temperature,
            "top_p": self.settings.top_p,
            "max_tokens": min(self.settings.max_tokens, room),
            "stop_token_ids": self.settings.stop_token_ids,
            "priority": -turn if self.settings.priority_by_turn else 0,
            "request_id": request_id,
            "seed": None if seed is None else seed & 0x7FFFFFFF,
        }

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def token_texts(self, ids: list[int]) -> list[str] | None:
        """Each token of ``ids`` decoded alone, or None past ``token_view_max_tokens``."""
        if not ids or len(ids) > self.settings.token_view_max_tokens:
            return None
        new = sorted({i for i in ids if i not in self._pieces})
        if new:
            texts = self.tokenizer.batch_decode([[i] for i in new], skip_special_tokens=False)
            self._pieces.update(zip(new, map(str, texts), strict=True))
        return [self._pieces[i] for i in ids]

    def stop_text(self, ids: list[int]) -> str:
        """The text of the stop token that ended ``ids`` (any of the run's stop ids), else the EOS text."""
        if ids and ids[-1] in self.settings.stop_token_ids:
            piece = self._pieces.get(ids[-1])  # the token view's cache: one token decoded alone
            if piece is None:
                piece = self._pieces[ids[-1]] = self.decode(ids[-1:])
            return piece
        return self.eos_text

    async def run(
        self, client: ServerClient, task: SampleTask, on_generated: Callable[[], None]
    ) -> RolloutSample:
        """Generate and score one sample (never raises for model-output problems)."""
        try:
            return await self._run(client, task, on_generated)
        finally:
            if self.router is not None:
                self.router.release(task.route_key)

    async def _run(
        self, client: ServerClient, task: SampleTask, on_generated: Callable[[], None]
    ) -> RolloutSample:
        if isinstance(task.env, AgentEnvironment):
            from telescope.core.rollouts.agent import run_agent_rollout

            if self.agent_gateway is None:
                raise RuntimeError(
                    f"environment {task.env.name!r} is an agent environment but this runner has no gateway "
                    "(RolloutRunner.agent_gateway); the runtime starts one for runs with agent environments"
                )
            return await run_agent_rollout(self, self.agent_gateway, client, task, on_generated)
        if isinstance(task.env, MultiTurnEnvironment):
            from telescope.core.rollouts.multi_turn import run_multi_turn

            return await run_multi_turn(self, client, task, task.env, on_generated)
        return await self._single_turn(client, task, on_generated)

    async def _single_turn(
        self, client: ServerClient, task: SampleTask, on_generated: Callable[[], None]
    ) -> RolloutSample:
        start_version, t0 = task.model_version(), time.time()
        params = self.request_params(len(task.prompt_ids), 0, task.request_id, turn_seed(task.seed, 0))
        if params is None:  # nothing generated, nothing to score (the caller frees the lane)
            raise PromptTooLongError(len(task.prompt_ids), self.settings.max_model_len)
        choice = await self.complete(client, task, task.prompt_ids, params)
        t1 = time.time()
        on_generated()
        text = self.decode(choice.token_ids)
        result = await task.env.score(text, task.sample, self.stop_text(choice.token_ids))
        sample = self._finish(
            task,
            choice.token_ids,
            choice.logprobs,
            None,
            choice.finish_reason or "stop",
            result,
            text,
            start_version,
            (t0, t1, time.time()),
            num_turns=1,
        )
        sample.response_ids = [choice.response_id] if choice.response_id else []
        return sample

    def _finish(
        self,
        task: SampleTask,
        completion: list[int],
        logprobs: list[float],
        mask: list[int] | None,
        finish: str,
        result: RewardResult,
        text: str,
        start_version: int,
        times: tuple[float, float, float],
        *,
        num_turns: int,
    ) -> RolloutSample:
        t0, t1, t2 = times
        raw = float(result.total_reward)
        return RolloutSample(
            prompt_ids=list(task.prompt_ids),
            completion_ids=list(completion),
            inference_logprobs=list(logprobs),
            loss_mask=mask,
            finish_reason=finish,
            reward=normalize_reward(raw, task.reward_min, task.reward_max),
            raw_reward=raw,
            sample_metrics=dict(result.sample_metrics),
            prompt_text=task.prompt_text,
            completion_text=text,
            server=task.server,
            lane=task.lane,
            model_version_start=start_version,
            model_version_end=task.model_version(),
            num_turns=num_turns,
            completion_token_texts=self.token_texts(completion),
            timings={
                "generation_start": t0,
                "generation_end": t1,
                "reward_end": t2,
                "generation_s": t1 - t0,
                "reward_s": t2 - t1,
            },
            info={
                "golden_answers": result.golden_answers,
                "sample_tags": result.sample_tags,
                "info_turns": result.info_turns,
                "reward_errors": [
                    t["info_value"]
                    for t in result.info_turns
                    if str(t.get("info_key", "")).startswith(("reward_error", "reward_timeout"))
                ],
            },
        )


def failed_sample(task: SampleTask, version: int, message: str) -> RolloutSample:
    """The record of a sample whose request failed: nothing generated, nothing scored."""
    return RolloutSample(
        list(task.prompt_ids),
        [],
        [],
        None,
        "error",
        0.0,
        0.0,
        prompt_text=task.prompt_text,
        server=task.server,
        lane=task.lane,
        model_version_start=version,
        model_version_end=version,
        info={"error": message},
    )


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a completion within max_model_len."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens, leaving no room to generate within max_model_len={max_model_len}"
        )
