"""``MegatronBackend``: the ``megatron`` trainer backend (Megatron-Core on CUDA/NCCL).

``init()`` (NCCL, CUDA, parallel-state setup) has NEVER RUN: the session that wrote it had no
GPU. ``build_state``, the step, weight export and checkpoints have run on CPU with real
megatron-core 0.19.2 (tests/megatron/test_megatron_core_cpu.py); the GPU acceptance tests are
tests/megatron/test_gpu.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from telescope.core.trainer import RankBatch, TrainerBackend
from telescope.core.training.process_group import init_process_group
from telescope.core.training.schedules import LRSchedule
from telescope.core.training.timing import StepTimer
from telescope.megatron import checkpoint
from telescope.megatron.availability import unavailable_reason
from telescope.megatron.mapping import MegatronToHFStream, model_spec_from_hf_config
from telescope.megatron.mapping.rules import ExpertLayout, inference_expert_layout
from telescope.megatron.options import MegatronBackendKwargs
from telescope.megatron.parallel import ParallelLayout, resolve_parallel_layout

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["MegatronBackend", "build_state", "create_megatron_backend"]

logger = logging.getLogger(__name__)


def create_megatron_backend(
    kwargs: MegatronBackendKwargs | None = None, *, cfg: TelescopeConfig, registry: Any = None
) -> MegatronBackend:
    """Registry factory: ``registry.create("trainer_backend", "megatron", kwargs, cfg=cfg)``."""
    return MegatronBackend(cfg, kwargs, registry=registry)


def build_state(
    cfg: TelescopeConfig,
    kwargs: MegatronBackendKwargs,
    layout: ParallelLayout,
    device: torch.device,
    registry: Any = None,
) -> Any:
    """Model, optimizer and algorithm for this rank (parallel state must be initialised)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from telescope.core.algorithms import get_algorithm
    from telescope.megatron.model import build_model, materialize
    from telescope.megatron.settings import optimizer_config_kwargs
    from telescope.megatron.step import MegatronState

    built = build_model(cfg, kwargs, layout, device)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(**materialize(optimizer_config_kwargs(cfg, kwargs))), built.chunks
    )
    return MegatronState(
        cfg=cfg,
        built=built,
        optimizer=optimizer,
        algorithm=get_algorithm(cfg.algorithm, registry),
        device=device,
        row_multiple=layout.row_pad_multiple(bool(cfg.megatron_fp8)),
        use_te=bool(cfg.megatron_use_transformer_engine),
    )


class MegatronBackend(TrainerBackend):
    """One trainer rank. Build with the run config, then call ``init()`` on every rank."""

    def __init__(
        self, cfg: TelescopeConfig, kwargs: MegatronBackendKwargs | None = None, *, registry: Any = None
    ) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"the megatron trainer backend cannot run here: {reason}")
        if not cfg.temperature > 0:
            raise ValueError(f"temperature is {cfg.temperature!r}: training logprobs need temperature > 0")
        self.cfg = cfg
        self.kwargs = kwargs or MegatronBackendKwargs()
        self._registry = registry
        self.state: Any = None
        self.layout: ParallelLayout = resolve_parallel_layout(cfg)  # config errors before any GPU work
        self._schedule = LRSchedule.from_config(cfg)
        self._gather_seconds = 0.0

    # --- setup -------------------------------------------------------------------------
    def init(self) -> dict[str, Any]:
        from transformers import AutoConfig

        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        if not torch.cuda.is_available():
            raise RuntimeError("the megatron trainer backend needs CUDA GPUs; use train_backend: fsdp on CPU")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        init_process_group(torch.device("cuda", torch.cuda.current_device()))
        spec = model_spec_from_hf_config(AutoConfig.from_pretrained(self.cfg.model))
        self.layout = resolve_parallel_layout(self.cfg, dist.get_world_size(), spec.num_experts)
        for note in self.layout.notes:
            logger.info(note)
        if ps.model_parallel_is_initialized():  # one backend per process; a re-init replaces the groups
            ps.destroy_model_parallel()
        ps.initialize_model_parallel(
            tensor_model_parallel_size=self.layout.tensor,
            pipeline_model_parallel_size=self.layout.pipeline,
            context_parallel_size=self.layout.context,
            expert_model_parallel_size=self.layout.expert,
        )
        tensor_parallel.model_parallel_cuda_manual_seed(
            self.cfg.seed + 100 * ps.get_pipeline_model_parallel_rank()
        )
        torch.manual_seed(self.cfg.seed)
        device = torch.device("cuda", torch.cuda.current_device())
        self.state = build_state(self.cfg, self.kwargs, self.layout, device, self._registry)
        self._set_lr()
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
            "device": str(self.state.device),
        }

    def _set_lr(self) -> float:
        st = self.require_state()
        lr = self.cfg.learning_rate * self._schedule(st.scheduler_step)
        for group in st.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def require_state(self) -> Any:
        """The training state; raises if ``init()`` has not run."""
        if self.state is None:
            raise RuntimeError(
                "MegatronBackend.init() must be called before training, weights or checkpoints"
            )
        return self.state

    # --- training ----------------------------------------------------------------------
    def train_step(self, batch: RankBatch) -> dict[str, float]:
        """One step: per minibatch forward/backward/optimizer, then one LR-schedule step."""
        from telescope.megatron.step import run_minibatches

        st = self.require_state()
        timer = StepTimer(st.device)
        torch.cuda.reset_peak_memory_stats(st.device)
        lr = self._set_lr()
        with timer.track("step"):
            metrics = run_minibatches(st, batch.micro_batches, timer)
        st.scheduler_step += 1
        if self._gather_seconds:
            timer.add_seconds("weight_gather", self._gather_seconds)
            self._gather_seconds = 0.0
        metrics.update(timer.metrics())
        metrics.update(batch.metrics)
        metrics["memory/peak_allocated_gb"] = torch.cuda.max_memory_allocated(st.device) / 2**30
        metrics["learning_rate"] = lr
        return metrics

    # --- weights and checkpoints --------------------------------------------------------
    def iter_weights_for_inference(
        self, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, full tensor)`` on global rank 0; every rank must iterate to the end.

        TP/EP all-gathers and PP sends happen per parameter; with
        ``weight_broadcast_free_grad_buffers`` the DDP gradient buffers are released meanwhile.
        """
        import transformers

        layout = inference_expert_layout(str(self.cfg.inference_engine), transformers.__version__)
        return self.iter_hf_weights(dtype, expert_layout=layout)

    def iter_hf_weights(
        self, dtype: torch.dtype | None = None, *, expert_layout: ExpertLayout = "per_expert"
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``iter_weights_for_inference`` with MoE experts in ``expert_layout`` (collective)."""
        from telescope.megatron.export import grad_buffers_freed, iter_full_megatron_params

        st = self.require_state()
        stream = MegatronToHFStream(st.built.spec, te_spec=st.use_te, expert_layout=expert_layout)
        free = bool(self.cfg.weight_broadcast_free_grad_buffers)
        with grad_buffers_freed(st.built.chunks, free):
            t0 = time.perf_counter()
            for gname, tensor in iter_full_megatron_params(st.built, dtype):
                for item in stream.feed(gname, tensor):
                    self._gather_seconds += time.perf_counter() - t0
                    yield item
                    t0 = time.perf_counter()
            if self.rank == 0:
                stream.finish()

    def save_checkpoint(self, directory: str, *, training_state: bool = True) -> None:
        """Dist-checkpoint model (+ optimizer), trainer state, RNG, hf_meta (collective)."""
        checkpoint.save(self, directory, training_state=training_state)

    def load_checkpoint(self, directory: str, *, training_state: bool = True) -> dict[str, Any]:
        """Restore a checkpoint (collective); see ``telescope.megatron.checkpoint``."""
        info = checkpoint.load(self, directory, training_state=training_state)
        if training_state:
            self._set_lr()  # the LR of the next step, from the restored schedule step
        return info

    # --- ranks -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    @property
    def dp_rank(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank() if ps.model_parallel_is_initialized() else 0

    @property
    def dp_world_size(self) -> int:
        return self.layout.data
