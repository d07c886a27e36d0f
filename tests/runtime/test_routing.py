"""Routing: every turn of a rollout, and every sample of a group, goes where its prefix is cached,
unless that server is saturated beyond the margin; a finished rollout releases its affinity."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from typing import Any, ClassVar

import pytest
from fakes import FakeClient

from telescope.core.env import MultiTurnEnvironment, MultiTurnKwargs, RewardResult, Sample
from telescope.core.env.chat import ChatOptions
from telescope.core.env.types import ChatMessage, RolloutState
from telescope.core.observe.samplers.prometheus import prefix_cache_hit_rate
from telescope.core.rollouts.rollout import GenerationSettings, RolloutRunner, SampleTask
from telescope.core.rollouts.routing import RouteKey, Router
from telescope.core.rollouts.tokens import Interleaver, stop_token_ids


def key(rollout: str, group: str = "g0", home: int = 0) -> RouteKey:
    return RouteKey(rollout, group, home)


def load(router: Router, server: int, requests: int, stack: ExitStack) -> None:
    """Hold ``requests`` requests in flight on ``server`` until ``stack`` closes."""
    for _ in range(requests):
        stack.enter_context(router.request(server))


def test_sticky_least_loaded_keeps_a_rollout_and_its_group_on_the_server_holding_the_prefix() -> None:
    router = Router(3, "sticky_least_loaded", saturation_margin=2)
    with ExitStack() as stack:
        load(router, 2, 2, stack)  # the home is 2 requests busier than the others: within the margin
        assert [router.route(key("g0-s0", home=2)) for _ in range(3)] == [2, 2, 2]  # every turn
        assert router.route(key("g0-s1", home=2)) == 2  # a sample of the same group: the prompt is there
        assert router.moves == 0


def test_a_saturated_server_sends_the_turn_to_the_least_loaded_which_holds_the_prefix_from_then_on() -> None:
    router = Router(3, "sticky_least_loaded", saturation_margin=2)
    assert router.route(key("g0-s0", home=0)) == 0
    with ExitStack() as stack:
        load(router, 0, 3, stack)  # 3 beyond the least loaded > margin 2
        load(router, 1, 1, stack)
        assert router.route(key("g0-s0", home=0)) == 2  # least loaded: server 2 (0 requests)
        assert router.moves == 1
    assert router.route(key("g0-s0", home=0)) == 2  # the conversation is on 2 now, load or not
    assert router.sessions(2) == 1 and router.sessions(0) == 0


def test_a_groups_next_sample_goes_to_the_least_loaded_server_already_holding_its_prompt() -> None:
    router = Router(3, "sticky_least_loaded", saturation_margin=2)
    assert router.route(key("g0-s0", home=0)) == 0
    with ExitStack() as stack:
        load(router, 0, 3, stack)
        assert router.route(key("g0-s0", home=0)) == 1  # a later turn moved: server 1 holds the prompt now
        # server 2 is as idle as 1 and holds fewer conversations, but only 1 has the prompt cached
        assert router.route(key("g0-s1", home=0)) == 1
    assert router.moves == 1


def test_a_rollouts_first_request_stays_with_its_groups_prompt_however_loaded() -> None:
    """The lanes balance group starts; moving a first request would scatter the group's cold prompt
    (bench/routing.py: long prompts lost hit rate and throughput that way)."""
    router = Router(3, "sticky_least_loaded", saturation_margin=2)
    with ExitStack() as stack:
        load(router, 0, 5, stack)
        assert [router.route(key(f"g0-s{i}", home=0)) for i in range(3)] == [0, 0, 0]
        assert router.moves == 0
        assert router.route(key("g0-s0", home=0)) == 1  # its next turn is balanced


def test_a_saturated_server_keeps_a_turn_while_the_conversations_it_holds_fit_its_cache() -> None:
    """Moving re-prefills the whole conversation: only once the server's conversations overflow its
    prefix cache (so LRU is evicting them anyway) is a saturated server's turn moved."""
    old = Router(3, "sticky_least_loaded", saturation_margin=2)  # cache size unknown: load alone
    new = Router(3, "sticky_least_loaded", saturation_margin=2, cache_tokens=10_000)
    for router in (old, new):
        assert router.route(key("g0-s0", home=0), prompt_tokens=4_000) == 0
    with ExitStack() as stack:
        for router in (old, new):
            load(router, 0, 3, stack)  # 3 beyond the least loaded (0) > margin 2: saturated
        # the old rule moves the 4,000-token conversation to idle server 1 (a cold prefill there)
        assert old.route(key("g0-s0", home=0), prompt_tokens=4_300) == 1 and old.moves == 1
        # server 0 holds 4,000 tokens of conversations <= its 10,000-token cache: the turn stays
        assert new.route(key("g0-s0", home=0), prompt_tokens=4_300) == 0 and new.moves == 0
        assert new.held_tokens(0) == 4_300  # the conversation's last prompt
        # another group's 7,000-token rollout joins server 0: 4,300 + 7,000 = 11,300 > 10,000
        assert new.route(key("g1-s0", group="g1", home=0), prompt_tokens=7_000) == 0
        assert new.held_tokens(0) == 11_300
        # now the cache overflows: the turn goes to the least loaded (1: idle like 2, lower index)
        assert new.route(key("g0-s0", home=0), prompt_tokens=4_600) == 1 and new.moves == 1
        assert (new.held_tokens(0), new.held_tokens(1)) == (7_000, 4_600)
    new.release(key("g0-s0"))
    new.release(key("g1-s0", group="g1"))
    assert new.held_tokens(0) == new.held_tokens(1) == 0


def test_a_cache_size_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_tokens .* must be positive, got 0; pass None"):
        Router(2, cache_tokens=0)


def test_a_finished_rollout_releases_its_affinity_and_its_group_once_all_finished() -> None:
    router = Router(2, "sticky_least_loaded", saturation_margin=4)
    router.route(key("g0-s0", home=1))
    router.route(key("g0-s1", home=1))
    router.release(key("g0-s0"))
    assert router.sessions(1) == 1
    assert router.route(key("g0-s2", home=0)) == 1  # the group's prompt is still on 1 while g0-s1 runs
    router.release(key("g0-s1"))
    router.release(key("g0-s2"))
    assert router.sessions(0) == router.sessions(1) == 0
    assert router.route(key("g0-s3", home=0)) == 0  # no affinity left: the home again


def test_least_loaded_ignores_affinity_and_sticky_ignores_load() -> None:
    least = Router(2, "least_loaded")
    with least.request(0):
        assert least.route(key("g0-s0", home=0)) == 1
    with least.request(1):
        assert least.route(key("g0-s0", home=0)) == 0  # the conversation moves with the load
    sticky = Router(4, "sticky")
    first = sticky.route(key("g7-s0", group="g7", home=0))
    with ExitStack() as stack:
        load(sticky, first, 50, stack)
        assert {sticky.route(key(f"g7-s{i}", group="g7", home=0)) for i in range(4)} == {first}
    assert Router(2, "pinned").route(key("g0-s0", home=1)) == 1


def test_a_disabled_server_gets_no_request_even_when_it_holds_the_prefix() -> None:
    enabled = {0: True, 1: True}
    router = Router(2, "sticky_least_loaded", saturation_margin=8, available=lambda i: enabled[i])
    assert router.route(key("g0-s0", home=1)) == 1
    enabled[1] = False
    assert router.route(key("g0-s0", home=1)) == 0


def test_unknown_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="'sticky_lol' is not one of pinned, sticky, least_loaded"):
        Router(2, "sticky_lol")


class Echo(MultiTurnEnvironment):
    """Answers every turn with 'go on'; five turns."""

    kwargs_model: ClassVar[type[MultiTurnKwargs]] = MultiTurnKwargs

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("start")]

    async def env_response(self, messages: list[ChatMessage], state: RolloutState) -> list[ChatMessage]:
        return [{"role": "user", "content": "go on"}]

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        return RewardResult(float(state.num_turns))


def run_five_turns_placed_on_server_1(tokenizer: Any, router: Router, clients: list[FakeClient]) -> Any:
    """A five-turn ``Echo`` rollout of group 3, placed on server 1, through a runner routing by ``router``."""
    settings = GenerationSettings(1.0, None, 8, 512, stop_token_ids(tokenizer), False)
    runner = RolloutRunner(tokenizer, settings, Interleaver(tokenizer, ChatOptions()))
    runner.route_requests(router, clients)  # type: ignore[arg-type]
    env = Echo(MultiTurnKwargs(max_turns=5))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "start"}], add_generation_prompt=True)
    task = SampleTask(
        "g3-s0-v0", env, env.samples()[0], list(prompt), "start", None, None, server=1, group_id=3
    )
    return asyncio.run(runner.run(clients[0], task, lambda: None))  # type: ignore[arg-type]


def test_every_turn_of_a_rollout_reaches_the_server_holding_its_conversation(tokenizer: Any) -> None:
    """Through the runner: with both servers idle, least loaded would pick server 0 (the tie); the
    rollout's group was placed on server 1, so all its turns go there."""
    clients = [FakeClient(lambda p, rid: tokenizer.encode("ok", add_special_tokens=False)) for _ in range(2)]
    router = Router(2, "sticky_least_loaded", saturation_margin=1)
    sample = run_five_turns_placed_on_server_1(tokenizer, router, clients)
    assert sample.num_turns == 5
    assert len(clients[1].requests) == 5 and not clients[0].requests
    # each turn's prompt extends the previous one: the server that answered holds it
    prompts = [r["prompt"] for r in clients[1].requests]
    assert all(b[: len(a)] == a for a, b in zip(prompts, prompts[1:], strict=False))
    assert router.sessions(1) == 0 and router.running == [0, 0]  # released, nothing in flight


def test_prefix_cache_hit_rate_is_over_the_interval_between_scrapes() -> None:
    first = {"prefix_cache_queries_total": 1000.0, "prefix_cache_hits_total": 400.0}
    later = {"prefix_cache_queries_total": 1600.0, "prefix_cache_hits_total": 940.0}
    assert prefix_cache_hit_rate(None, first) == pytest.approx(0.4)
    assert prefix_cache_hit_rate(first, later) == pytest.approx(540 / 600)
    restarted = {"prefix_cache_queries_total": 100.0, "prefix_cache_hits_total": 10.0}
    assert prefix_cache_hit_rate(later, restarted) == pytest.approx(0.1)  # counters started again
    assert prefix_cache_hit_rate(later, later) is None  # nothing looked up
    assert prefix_cache_hit_rate(None, {"num_requests_running": 1.0}) is None  # no such counters


def test_each_servers_own_cache_size_decides_and_a_step_counts_its_moves_and_sticky_requests() -> None:
    """Per-server sizes: server 0 holds 10,000 tokens, server 1's size is unknown (load alone moves
    its turns). Counts by hand: step 1 = 3 requests on the server holding their prefix, none moved;
    step 2 = 1 sticky (a new group's first request), 2 moved (off 0 once over its cache, off 1 for
    load alone, though it holds 4,600 tokens only)."""
    router = Router(3, "sticky_least_loaded", saturation_margin=2, cache_tokens=[10_000, None, 10_000])
    assert router.route(key("g0-s0", home=0), prompt_tokens=4_000) == 0  # sticky 1
    assert router.route(key("g0-s1", home=0), prompt_tokens=4_000) == 0  # sticky 2: the group's prompt
    with ExitStack() as stack:
        load(router, 0, 3, stack)  # saturated (3 > 2 beyond 0)
        # 8,000 held <= 10,000: the turn stays (sticky 3), server 0 now holds 4,300 + 4,000
        assert router.route(key("g0-s0", home=0), prompt_tokens=4_300) == 0
        assert router.take_counts() == (0, 3) and router.held_tokens(0) == 8_300
        assert router.route(key("g1-s0", group="g1", home=0), prompt_tokens=3_000) == 0  # sticky 1
        # 11,300 > 10,000: moved to the least loaded (1)
        assert router.route(key("g0-s0", home=0), prompt_tokens=4_600) == 1
    with ExitStack() as stack:
        load(router, 1, 3, stack)  # server 1 saturated; it holds only 4,600 tokens, but its size is unknown
        # idle 0 and 2 tie on load; 2 holds fewer conversations (0 holds g0-s1 and g1-s0)
        assert router.route(key("g0-s0", home=0), prompt_tokens=4_900) == 2
    assert router.take_counts() == (2, 1) and router.take_counts() == (0, 0)
    assert (router.moves, router.sticky) == (2, 4)  # run-wide
    assert [router.held_tokens(i) for i in range(3)] == [4_000 + 3_000, 0, 4_900]


def test_routing_metrics_are_a_steps_counts_for_the_sticky_policies_only() -> None:
    from telescope.core.runtime.step_metrics import routing_metrics

    router = Router(2, "sticky_least_loaded", saturation_margin=0)
    router.route(key("g0-s0", home=0), prompt_tokens=300)
    router.route(key("g0-s1", home=0), prompt_tokens=200)
    with router.request(0):
        router.route(key("g0-s0", home=0), prompt_tokens=700)  # 1 beyond server 1 > margin 0: moved
    assert routing_metrics(router) == {
        "routing/moves": 1.0,
        "routing/sticky": 2.0,
        "routing/held_tokens_max": 700.0,  # server 1: g0-s0's 700; server 0: g0-s1's 200
    }
    again = routing_metrics(router)  # nothing routed since: no move, nothing sticky
    assert again == {"routing/moves": 0.0, "routing/sticky": 0.0, "routing/held_tokens_max": 700.0}
    assert routing_metrics(None) == {}
    least = Router(2, "least_loaded")
    least.route(key("g0-s0"))
    assert routing_metrics(least) == {} and routing_metrics(Router(2, "pinned")) == {}


def test_cache_sizes_must_be_one_per_server_and_positive() -> None:
    with pytest.raises(ValueError, match="cache_tokens has 2 sizes for 3 servers; pass one per server"):
        Router(3, cache_tokens=[1_000, 1_000])
    with pytest.raises(ValueError, match="must be positive, got -5; pass None when server 1's is not known"):
        Router(2, cache_tokens=[1_000, -5])
    assert Router(2, cache_tokens=7).cache_tokens == [7, 7] and Router(2).cache_tokens == [None, None]
