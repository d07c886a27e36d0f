"""Self-healing inference with fakes of the server client and the healer (no Ray).

A server that dies mid-run is restarted, its in-flight groups re-queued under the same group
ids, the weights re-synced to it before it gets work again; nothing is lost or trained twice.
The same on the real runtime (SIGKILL of a transformers server) is in test_faults_e2e.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from fakes import FakeClient, FakeTrainer, ToyEnv
from test_orchestrator import build, varied_reply, varied_reward

from telescope.core.errors import RunStageError
from telescope.core.inference.client import Completion


@dataclass
class MortalClient(FakeClient):
    """A scripted server that can die: then every request (and those in flight) fails."""

    alive: bool = True
    life: int = 0
    """Incremented at each death: a request started in an earlier life fails."""
    synced: bool = True
    """False from a restart until the next weight sync reached the server."""
    unsynced_requests: list[str] = field(default_factory=list)
    frozen: bool = False
    """A stopped process (SIGSTOP): requests and aborts hang, /health is silent, until it is killed."""

    async def complete(self, prompt: list[int], **params: Any) -> list[Completion]:
        life = self.life
        while self.frozen and self.life == life:
            await asyncio.sleep(0.005)
        if self.alive and not self.synced:
            self.unsynced_requests.append(params["request_id"])
        if not self.alive:
            raise ConnectionError("connection refused")
        result = await super().complete(prompt, **params)
        if not self.alive or self.life != life:
            raise ConnectionError("server disconnected")
        return result

    async def health(self) -> bool:
        return self.alive and not self.frozen

    async def abort(self, request_ids: list[str] | None = None) -> int:
        while self.frozen and self.alive:  # a frozen server's connection answers nothing
            await asyncio.sleep(0.005)
        if not self.alive:
            raise ConnectionError("connection refused")
        return await super().abort(request_ids)


@dataclass
class FakeHealer:
    clients: list[MortalClient]
    trainer: FakeTrainer
    restarted: list[tuple[int, int]] = field(default_factory=list)
    """(server, trainer versions synced so far) at each restart."""
    dropped: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    """Frozen servers SIGKILLed (before their restart)."""

    async def healthy(self, server: int) -> bool:
        return await self.clients[server].health()

    async def where(self, server: int) -> str:
        return f"pid {4000 + server} on node 10.0.0.1"

    async def running(self, server: int) -> bool:
        return self.clients[server].alive  # a frozen process still runs

    async def log_tail(self, server: int) -> str:
        return "CUDA error: an illegal memory access was encountered"

    async def restart(self, server: int) -> None:
        await asyncio.sleep(0.05)
        self.restarted.append((server, len(self.trainer.versions)))
        self.clients[server].alive, self.clients[server].synced = True, False
        self.clients[server].frozen = False  # a new process

    async def drop(self, server: int) -> None:
        self.dropped.append(server)

    async def kill(self, server: int) -> None:
        if self.clients[server].frozen:
            self.killed.append(server)
        self.clients[server].alive = False
        self.clients[server].life += 1


def build_servers(tokenizer: Any, servers: int = 2, **overrides: Any) -> tuple[Any, Any, Any, FakeHealer]:
    clients = [MortalClient(varied_reply(tokenizer), delay=lambda rid: 0.01) for _ in range(servers)]
    orch, trainer, observer = build(
        tokenizer, ToyEnv(varied_reward), clients, discard_group_zero_advantage=False, **overrides
    )
    orch.servers.healer = FakeHealer(clients, trainer)
    sync = trainer.sync_weights

    async def sync_and_mark(version: int, hold: frozenset[int] = frozenset()) -> dict[str, float]:
        result = await sync(version, hold)
        for client in clients:
            client.synced = client.synced or client.alive
        return result

    trainer.sync_weights = sync_and_mark  # type: ignore[method-assign]
    return orch, trainer, observer, orch.servers.healer


@pytest.mark.parametrize(("servers", "max_async"), [(1, 0), (2, 0), (2, 2)])
def test_a_killed_server_is_restarted_and_nothing_is_lost_or_trained_twice(
    tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    servers: int,
    max_async: int,
) -> None:
    monkeypatch.setenv("TELESCOPE_FAULTS", "server_kill@3")
    orch, trainer, observer, healer = build_servers(
        tokenizer, servers, number_of_steps=8, max_async_rollout=max_async
    )
    counts = asyncio.run(asyncio.wait_for(orch.run(), timeout=30))
    assert counts.completed_steps == 8 and counts.inference_restarts == 1
    assert [server for server, _ in healer.restarted] == [0]
    trained = [g.group_id for b in trainer.batches for g in b.groups]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    # every prompt drawn was trained, discarded or is still outstanding: none lost
    discarded = {g.group_id for _, g in observer.groups if g.discard_reason is not None}
    pending = {i.group_id for i in orch.prompts.outstanding()}
    drawn = set(trained) | discarded | pending
    assert drawn == set(range(max(drawn) + 1))
    assert counts.rollout_errors == 0 and not discarded  # the dead server's failures were not the samples'
    # after the restart, server 0 generated again, and only once it held the synced weights
    versions_after = {
        s.model_version_start
        for b in trainer.batches[4:]
        for g in b.groups
        for s in g.samples
        if s.server == 0
    }
    assert versions_after and min(versions_after) >= 3
    warning = [r.getMessage() for r in caplog.records if "inference server 0 died" in r.getMessage()]
    assert warning and "illegal memory access" in warning[0]
    # a restarted server got no request before a sync had loaded the current weights into it
    assert healer.clients[0].unsynced_requests == []


def kill_forever(healer: FakeHealer, server: int) -> Any:
    async def loop() -> None:
        while True:
            await asyncio.sleep(0.05)
            await healer.kill(server)

    return loop()


async def run_while(orch: Any, killer: Any) -> Any:
    task = asyncio.create_task(killer)
    try:
        return await orch.run()
    finally:
        task.cancel()


def test_the_last_server_dying_too_often_fails_the_run_with_its_last_log_line(tokenizer: Any) -> None:
    orch, _, _, healer = build_servers(tokenizer, 1, number_of_steps=30, inference_max_restarts=2)
    with pytest.raises(RunStageError) as info:
        asyncio.run(asyncio.wait_for(run_while(orch, kill_forever(healer, 0)), timeout=30))
    message = str(info.value)
    assert "inference server 0 died 3 times (inference_max_restarts=2)" in message
    assert "its last log line: CUDA error: an illegal memory access was encountered" in message


def test_a_server_dying_too_often_is_dropped_while_others_remain(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    orch, trainer, _, healer = build_servers(tokenizer, 2, number_of_steps=12, inference_max_restarts=1)
    counts = asyncio.run(asyncio.wait_for(run_while(orch, kill_forever(healer, 1)), timeout=30))
    assert counts.completed_steps == 12 and healer.dropped == [1] and counts.inference_restarts == 1
    trained = [g.group_id for b in trainer.batches for g in b.groups]
    assert len(trained) == len(set(trained))
    assert not orch.lanes.enabled(1) and any(
        "inference server 1 died 2 times (inference_max_restarts=1): dropped, training goes on with servers [0]"
        in r.getMessage()
        for r in caplog.records
    )
