"""The server's side of weight sync: join the group, receive, load between decode steps, verify."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from telescope.core.inference.protocol import WeightSyncInitRequest, WeightUpdateResponse
from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.load import ModelWeightLoader
from telescope.core.weights.receiver import WeightReceiver
from telescope.core.weights.settings import GroupSpec

__all__ = ["ServerWeightSync"]

log = logging.getLogger(__name__)


class ServerWeightSync:
    """Receives syncs while generation continues; the swap itself happens between two decode steps.

    Tensors arrive into fresh buffers on a worker thread (decoding goes on meanwhile), are
    checked against the model (names, shapes, coverage) before anything changes, copied into the
    parameters on the generation thread between steps, and, with ``verify``, fingerprinted
    from the parameters themselves: the fingerprints returned are what the model now holds.
    An update with ``apply=False`` stops after the checks: the model keeps its weights and version.
    """

    def __init__(
        self, engine: Any, verify: bool, *, adapter_only: bool = False, skip_versions: Iterable[int] = ()
    ) -> None:
        """``adapter_only``: the model carries LoRA adapters (``lora_rank > 0``) and every sync
        brings exactly those, under PEFT's names; the base weights never change.
        ``skip_versions``: fault injection (``fault_skip_weight_syncs``), see ``update``."""
        self.engine = engine
        self.verify = verify
        self.skip_versions = frozenset(skip_versions)
        targets = None
        if adapter_only:
            from telescope.core.weights.lora import adapter_parameters

            targets = adapter_parameters(engine.model)
        self.loader = ModelWeightLoader(engine.model, targets)
        self.receiver: WeightReceiver | None = None
        self._lock = threading.Lock()  # one sync at a time

    def join(self, body: WeightSyncInitRequest) -> None:
        """Join the trainer's group as ``body.rank`` (blocks until every member joined)."""
        spec = GroupSpec(
            host=body.host,
            port=body.port,
            world_size=body.world_size,
            backend=body.backend,
            group_name=body.group_name,
            timeout_s=body.timeout_s,
        )
        with self._lock:
            self.receiver = WeightReceiver(WeightSyncGroup(spec, body.rank), verify=self.verify)

    def update(self, version: int, apply: bool = True) -> WeightUpdateResponse:
        """Receive the next sync and serve it as ``version`` (``apply=False``: receive, verify, keep serving)."""
        with self._lock:
            if self.receiver is None:
                raise WeightSyncError("no weight-sync group: POST /telescope/weights/init first")
            start = time.perf_counter()
            named = self.receiver.receive_all()
            last = self.receiver.last_sync
            sent_version = last.version if last else -1
            if sent_version != version:
                raise WeightSyncError(
                    f"asked to load version {version} but the trainer sent version {sent_version}"
                )
            self.loader.check(named)
            # apply=False: the model and its version stay; the received fingerprints go to check_sync
            if not apply:
                return WeightUpdateResponse(
                    version=self.engine.weight_version,
                    received_version=version,
                    applied=False,
                    num_tensors=len(named),
                    seconds=time.perf_counter() - start,
                    fingerprints=last.received_fingerprints if last else None,
                )

            if version in self.skip_versions:  # injected fault: claim the load, keep the old weights
                log.warning("fault injection: weight version %d received but not loaded", version)
                return WeightUpdateResponse(
                    version=version,
                    received_version=version,
                    num_tensors=len(named),
                    seconds=time.perf_counter() - start,
                    fingerprints=last.received_fingerprints if last else None,
                )

            loading: list[float] = []

            def swap() -> None:
                began = time.perf_counter()
                self.loader.apply(named)
                self.engine.weight_version = version
                loading.append(time.perf_counter() - began)

            self.engine.run_between_steps(swap, timeout=600)
            received = last.received_fingerprints if last else None
            fingerprints = (
                self.loader.verify(named, where=f"load, version {version}", received=received)
                if self.verify
                else None
            )
            return WeightUpdateResponse(
                version=version,
                received_version=version,
                num_tensors=len(named),
                seconds=time.perf_counter() - start,
                load_seconds=loading[0] if loading else None,
                fingerprints=fingerprints,
            )
