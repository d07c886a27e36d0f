"""``FSDPBackend``: the ``fsdp`` trainer backend (FSDP2 ``fully_shard``, CUDA/NCCL or CPU/gloo)."""

from __future__ import annotations

import logging
import resource
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from telescope.core.packing import share_prefixes
from telescope.core.trainer import RankBatch, TrainerBackend
from telescope.core.training.process_group import init_process_group, pick_device
from telescope.core.training.schedules import LRSchedule
from telescope.core.training.tensors import move_to_device, prepare_tensors
from telescope.core.training.timing import StepTimer
from telescope.fsdp import checkpoint
from telescope.fsdp.attention import PACKED_SDPA
from telescope.fsdp.model import build_model
from telescope.fsdp.options import FSDPBackendKwargs
from telescope.fsdp.steps import TrainState, run_minibatches

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["FSDPBackend", "create_fsdp_backend", "parameter_counts"]

logger = logging.getLogger(__name__)


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable and total parameter counts of the whole model (FSDP shards report global shapes)."""
    total = trainable = 0
    for param in model.parameters():
        total += param.numel()
        trainable += param.numel() if param.requires_grad else 0
    return {"trainable_parameters": trainable, "total_parameters": total}


def create_fsdp_backend(
    kwargs: FSDPBackendKwargs | None = None, *, cfg: TelescopeConfig, registry: Any = None
) -> FSDPBackend:
    """Registry factory: ``registry.create("trainer_backend", "fsdp", kwargs, cfg=cfg)``."""
    return FSDPBackend(cfg, kwargs, registry=registry)


class FSDPBackend(TrainerBackend):
    """One trainer rank. Build with the run config, then call ``init()`` on every rank."""

    def __init__(
        self, cfg: TelescopeConfig, kwargs: FSDPBackendKwargs | None = None, *, registry: Any = None
    ) -> None:
        if not cfg.temperature > 0:
            raise ValueError(
                f"temperature is {cfg.temperature!r}: training logprobs use logits / temperature, so the "
                "FSDP backend needs temperature > 0 (sample with temperature 1.0 for on-policy RL)"
            )
        self.cfg = cfg
        self.kwargs = kwargs or FSDPBackendKwargs()
        self._registry = registry
        self.state: TrainState | None = None
        self._rank, self._world_size = 0, 1
        self._gather_seconds = 0.0

    # --- setup -------------------------------------------------------------------------
    def init(self) -> dict[str, Any]:
        from torch.distributed.device_mesh import init_device_mesh

        from telescope.core.algorithms import get_algorithm

        device = pick_device(self.kwargs.device)
        init_process_group(device)
        self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(self.cfg.seed)
        mesh = init_device_mesh(device.type, (self._world_size,))
        model = build_model(self.cfg, self.kwargs, device, mesh)
        optimizer = self._build_optimizer(model)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, LRSchedule.from_config(self.cfg))
        algorithm = get_algorithm(self.cfg.algorithm, self._registry)
        self.state = TrainState(
            self.cfg, self.kwargs, model, optimizer, scheduler, algorithm, device, self._world_size
        )
        counts = parameter_counts(model)
        if self._rank == 0:
            logger.info(
                "trainable parameters: %d of %d (lora_rank %d)",
                counts["trainable_parameters"],
                counts["total_parameters"],
                self.cfg.lora_rank,
            )
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
            "device": str(device),
            **counts,
        }

    def _build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The optimizer over the trainable parameters only (with LoRA: the adapters)."""
        lr, wd = self.cfg.learning_rate, self.cfg.weight_decay
        params = [p for p in model.parameters() if p.requires_grad]
        if self.kwargs.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, weight_decay=wd)
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd, betas=(0.9, 0.999), eps=1e-8)

    def _require_state(self) -> TrainState:
        if self.state is None:
            raise RuntimeError("FSDPBackend.init() must be called before training, weights or checkpoints")
        return self.state

    # --- training ----------------------------------------------------------------------
    def train_step(self, batch: RankBatch) -> dict[str, float]:
        """One step: per minibatch forward/backward/clip/optimizer, then one scheduler step."""
        st = self._require_state()
        self._check_equal_row_counts([mb.minibatch for mb in batch.micro_batches])
        timer = StepTimer(st.device)
        timer.num_micro_batches = len(batch.micro_batches)
        if st.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(st.device)
        lr = float(st.optimizer.param_groups[0]["lr"])
        with timer.track("step"):
            mbs, shared = [], 0
            for mb in batch.micro_batches:
                with timer.track("prepare_tensors", micro_batch=True):
                    if self._share_prefixes(st):
                        before = mb.num_real_tokens
                        mb = share_prefixes(
                            mb, self.cfg.pad_to_multiple_of, mb.input_ids[-1] if mb.input_ids else 0
                        )
                        shared += before - mb.num_real_tokens
                    host = prepare_tensors(mb)
                with timer.track("data_to_device", micro_batch=True):
                    mbs.append(move_to_device(mb, host, st.device))
            metrics = run_minibatches(st, mbs, [mb.minibatch for mb in batch.micro_batches], timer)
            with warnings.catch_warnings():
                # a step whose optimizer updates were all skipped still advances the schedule
                warnings.filterwarnings(
                    "ignore", message="Detected call of `lr_scheduler.step", category=UserWarning
                )
                st.scheduler.step()
        if self._gather_seconds:
            timer.add_seconds("weight_gather", self._gather_seconds)
            self._gather_seconds = 0.0
        metrics.update(timer.metrics())
        metrics.update(batch.metrics)
        metrics.update(self._memory_metrics(st.device))
        metrics["learning_rate"] = lr
        metrics["packing/shared_prefix_tokens"] = float(shared)
        return metrics

    def _share_prefixes(self, st: TrainState) -> bool:
        """Whether rows are trained with their shared prompt tokens written once (packed_sdpa only)."""
        attn = getattr(getattr(st.model, "config", None), "_attn_implementation", None)
        return self.kwargs.share_prompt_prefixes and attn == PACKED_SDPA

    def _check_equal_row_counts(self, minibatch_of_row: list[int]) -> None:
        """Every rank must run the same number of rows per minibatch (FSDP collectives pair up)."""
        if self._world_size == 1:
            return
        n = self.cfg.number_of_minibatches
        counts = [sum(1 for k in minibatch_of_row if k == j) for j in range(n)] + [len(minibatch_of_row)]
        t = torch.tensor(counts + [-c for c in counts], dtype=torch.long, device=self._require_state().device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if t[: n + 1].tolist() != [-x for x in t[n + 1 :].tolist()]:
            raise ValueError(
                "ranks got different numbers of rows per minibatch; pack with telescope.core.packing.Packer("
                f"dp_world_size={self._world_size}, num_minibatches={n}) so every rank gets the same counts"
            )

    @staticmethod
    def _memory_metrics(device: torch.device) -> dict[str, float]:
        if device.type == "cuda":
            return {"memory/peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30}
        # Linux reports ru_maxrss in KiB: the process's peak resident memory so far.
        return {"memory/peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}

    # --- weights and checkpoints --------------------------------------------------------
    def iter_weights_for_inference(
        self, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, full tensor)`` on rank 0, one all-gather per tensor on every rank.

        Tied weights are yielded once, under their first name (e.g. ``model.embed_tokens.weight``);
        ``dtype`` casts each tensor after the gather (e.g. bf16 to halve the broadcast).
        """
        st = self._require_state()
        for name, tensor in self._tensors_for_inference(st.model):
            t0 = time.perf_counter()
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            full = full.detach().to(dtype) if dtype is not None else full.detach()
            self._gather_seconds += time.perf_counter() - t0
            if self._rank == 0:
                yield name, full
            del full

    def _tensors_for_inference(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """``(wire name, local tensor)``: the adapters under PEFT's names with LoRA, else the whole
        state dict with tied weights once."""
        if self.cfg.lora_rank > 0:
            from telescope.core.weights.lora import is_adapter_name, wire_name

            for name, param in model.named_parameters():
                if is_adapter_name(name):
                    yield wire_name(name), param
            return
        first_names = {name for name, _ in model.named_parameters()}  # one name per shared tensor
        tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - first_names
        for name, tensor in model.state_dict().items():
            if name not in tied:
                yield name, tensor

    def save_checkpoint(self, directory: str, *, training_state: bool = True) -> None:
        """Sharded model (+ optimizer, scheduler with ``training_state``), RNG, hf_meta (collective)."""
        checkpoint.save(self._require_state(), directory, self._rank, training_state=training_state)

    def load_checkpoint(self, directory: str, *, training_state: bool = True) -> dict[str, Any]:
        """Restore a checkpoint (collective); see ``telescope.fsdp.checkpoint``."""
        return checkpoint.load(self._require_state(), directory, self._rank, training_state=training_state)

    # --- ranks -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size
