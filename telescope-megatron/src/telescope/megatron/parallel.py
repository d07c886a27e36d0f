"""Parallel layout of the Megatron backend, resolved and checked from the run config (torch-free).

Rules (each violation is one message naming the field, the value and the fix; all are
reported together in one ``MegatronConfigError``):

- ``trainer_num_workers`` must be divisible by TP x PP x CP; the quotient is the data-parallel size.
- Expert parallelism (EP > 1) needs a MoE model whose expert count EP divides, and
  ``trainer_num_workers`` divisible by TP x PP x EP (experts are sharded across the DP x CP ranks,
  with expert tensor parallel = TP).
- Sequence parallelism needs TP > 1 and the TransformerEngine spec (the local spec's torch norms
  do not support it). The seed default is ``megatron_sequence_parallel: true`` with TP = 1, so
  when it cannot apply the flag is **ignored** (effective ``sequence_parallel=False``, recorded in
  ``notes``) rather than rejected: an error would make the default config invalid.
- Context parallelism (CP > 1) is rejected: it needs per-sample load-balanced splitting of packed
  rows across CP ranks, which this backend does not implement yet.
- ``megatron_fp8`` needs ``megatron_use_transformer_engine``.
- ``megatron_optimizer_cpu_offload`` needs ``megatron_use_distributed_optimizer`` (Megatron's
  HybridDeviceOptimizer runs inside the distributed optimizer).
- Non-float32 optimizer dtypes need ``megatron_use_precision_aware_optimizer``; main params
  may only be float32 or float16 (Megatron has no bf16 master weights).
- ``megatron_global_batch_size`` counts prompt groups per optimizer step. Its default is
  ``prompts_batch_size_for_trainer / number_of_minibatches`` (= ``prompts_batch_size_for_trainer``
  with the default single minibatch, as the seed table says); an explicit value must equal it,
  because the packer, not Megatron, decides how a step is split into optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["MegatronConfigError", "ParallelLayout", "resolve_parallel_layout"]


class MegatronConfigError(ValueError):
    """One or more ``megatron_*`` settings cannot work together; ``problems`` lists them."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid Megatron settings:\n- " + "\n- ".join(problems))


@dataclass(frozen=True)
class ParallelLayout:
    """Resolved parallel sizes of one Megatron run."""

    world_size: int
    tensor: int
    pipeline: int
    context: int
    expert: int
    data: int
    sequence_parallel: bool
    global_batch_size: int
    notes: list[str] = field(default_factory=list)

    @property
    def model_parallel(self) -> int:
        """Ranks holding one copy of the model (TP x PP x CP)."""
        return self.tensor * self.pipeline * self.context

    @property
    def expert_data(self) -> int:
        """Data-parallel size of the expert weights ((DP x CP) / EP)."""
        return self.data * self.context // self.expert

    def row_pad_multiple(self, fp8: bool) -> int:
        """Packed rows are padded to this many tokens: TP with sequence parallel (the sequence
        is scattered over TP ranks), 2 x CP for CP chunks, and 16 for FP8 GEMMs."""
        multiple = 1
        if self.sequence_parallel:
            multiple = math.lcm(multiple, self.tensor)
        if self.context > 1:
            multiple = math.lcm(multiple, 2 * self.context)
        if fp8:
            multiple = math.lcm(multiple, 16)
        return multiple


def resolve_parallel_layout(
    cfg: TelescopeConfig, world_size: int | None = None, num_experts: int | None = None
) -> ParallelLayout:
    """Check the ``megatron_*`` fields of ``cfg`` and return the layout.

    ``world_size`` defaults to ``cfg.trainer_num_workers``; ``num_experts`` (from the model's HF
    config; ``None``/0 = dense) enables the expert-parallel checks.
    """
    world = cfg.trainer_num_workers if world_size is None else world_size
    tp, pp = cfg.megatron_tensor_parallel_size, cfg.megatron_pipeline_parallel_size
    cp, ep = cfg.megatron_context_parallel_size, cfg.megatron_expert_parallel_size
    problems = _size_problems(world, tp, pp, cp, ep, num_experts)
    problems += _feature_problems(cfg)
    gbs, gbs_problems = _global_batch_size(cfg)
    problems += gbs_problems
    if problems:
        raise MegatronConfigError(problems)
    notes = []
    sequence_parallel = (
        bool(cfg.megatron_sequence_parallel) and tp > 1 and cfg.megatron_use_transformer_engine
    )
    if cfg.megatron_sequence_parallel and tp == 1:
        notes.append("megatron_sequence_parallel ignored: it needs megatron_tensor_parallel_size > 1")
    elif cfg.megatron_sequence_parallel and not sequence_parallel:
        notes.append("megatron_sequence_parallel ignored: it needs megatron_use_transformer_engine: true")
    return ParallelLayout(world, tp, pp, cp, ep, world // (tp * pp * cp), sequence_parallel, gbs, notes)


def _size_problems(world: int, tp: int, pp: int, cp: int, ep: int, num_experts: int | None) -> list[str]:
    problems = []
    if world % (tp * pp * cp):
        problems.append(
            f"trainer_num_workers={world} is not divisible by tensor x pipeline x context parallel = "
            f"{tp * pp * cp} (TP={tp}, PP={pp}, CP={cp}): set trainer_num_workers to a multiple of "
            f"{tp * pp * cp} or lower the parallel sizes"
        )
    if cp > 1:
        problems.append(
            f"megatron_context_parallel_size={cp}: context parallelism is not implemented in the "
            "telescope megatron backend yet; set it to 1"
        )
    if ep > 1:
        if not num_experts:
            problems.append(
                f"megatron_expert_parallel_size={ep} needs a mixture-of-experts model, but the model has "
                "no experts; set megatron_expert_parallel_size: 1"
            )
        elif num_experts % ep:
            problems.append(
                f"megatron_expert_parallel_size={ep} does not divide the model's {num_experts} experts; "
                f"use a divisor of {num_experts}"
            )
        if world % (tp * pp * ep):
            problems.append(
                f"trainer_num_workers={world} is not divisible by tensor x pipeline x expert parallel = "
                f"{tp * pp * ep} (experts are sharded over the data-parallel ranks); use a multiple of {tp * pp * ep}"
            )
    return problems


def _feature_problems(cfg: TelescopeConfig) -> list[str]:
    problems = []
    if cfg.megatron_fp8 and not cfg.megatron_use_transformer_engine:
        problems.append(
            "megatron_fp8: true needs megatron_use_transformer_engine: true (FP8 GEMMs come from "
            "TransformerEngine); enable it or turn FP8 off"
        )
    if cfg.megatron_optimizer_cpu_offload and not cfg.megatron_use_distributed_optimizer:
        problems.append(
            "megatron_optimizer_cpu_offload: true needs megatron_use_distributed_optimizer: true "
            "(Megatron offloads the distributed optimizer's shards); enable it or turn offload off"
        )
    dtype_fields = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    if not cfg.megatron_use_precision_aware_optimizer:
        for name in dtype_fields:
            value = getattr(cfg, f"megatron_{name}")
            if value != "float32":
                problems.append(
                    f"megatron_{name}={value!r} only takes effect with megatron_use_precision_aware_optimizer: "
                    "true; enable it or use float32"
                )
    if cfg.megatron_main_params_dtype == "bfloat16":
        problems.append(
            "megatron_main_params_dtype='bfloat16' is not supported by Megatron's precision-aware "
            "optimizer; use float32 or float16"
        )
    return problems


def _global_batch_size(cfg: TelescopeConfig) -> tuple[int, list[str]]:
    prompts, minibatches = cfg.prompts_batch_size_for_trainer, cfg.number_of_minibatches
    if prompts % minibatches:
        return 0, [
            f"prompts_batch_size_for_trainer={prompts} is not divisible by number_of_minibatches="
            f"{minibatches}: the Megatron global batch (prompt groups per optimizer step) must be whole"
        ]
    per_step = prompts // minibatches
    gbs = cfg.megatron_global_batch_size
    if gbs is not None and gbs != per_step:
        return 0, [
            f"megatron_global_batch_size={gbs} disagrees with prompts_batch_size_for_trainer / "
            f"number_of_minibatches = {prompts}/{minibatches} = {per_step} prompt groups per optimizer step; "
            f"leave it null or set it to {per_step} (change number_of_minibatches to change it)"
        ]
    return per_step, []
