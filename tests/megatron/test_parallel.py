"""Parallel sizes vs world size, feature rules and the global batch size default."""

from __future__ import annotations

import pytest

from telescope.core.testing import make_config
from telescope.megatron.parallel import MegatronConfigError, resolve_parallel_layout


def _layout(world: int | None = None, num_experts: int | None = None, **overrides):  # type: ignore[no-untyped-def]
    return resolve_parallel_layout(make_config(train_backend="megatron", **overrides), world, num_experts)


def test_defaults_resolve() -> None:
    layout = _layout()  # trainer_num_workers default 2, all sizes 1
    assert (layout.world_size, layout.tensor, layout.pipeline, layout.data) == (2, 1, 1, 2)
    assert layout.sequence_parallel is False  # seed default true, TP=1 -> ignored, noted
    assert any("sequence_parallel ignored" in note for note in layout.notes)
    assert layout.global_batch_size == 16  # prompts_batch_size_for_trainer


@pytest.mark.parametrize(
    "world,tp,pp,dp",
    [(8, 2, 2, 2), (8, 8, 1, 1), (6, 3, 1, 2), (4, 1, 4, 1)],
)
def test_data_parallel_is_world_over_model_parallel(world: int, tp: int, pp: int, dp: int) -> None:
    layout = _layout(
        trainer_num_workers=world, megatron_tensor_parallel_size=tp, megatron_pipeline_parallel_size=pp
    )
    assert layout.data == dp and layout.model_parallel == tp * pp


def test_indivisible_world_is_rejected_with_the_fix() -> None:
    with pytest.raises(MegatronConfigError) as err:
        _layout(trainer_num_workers=6, megatron_tensor_parallel_size=2, megatron_pipeline_parallel_size=2)
    assert "trainer_num_workers=6 is not divisible by tensor x pipeline x context parallel = 4" in str(
        err.value
    )


def test_explicit_world_size_overrides_config() -> None:
    assert _layout(world=4, megatron_tensor_parallel_size=4).data == 1
    with pytest.raises(MegatronConfigError):
        _layout(world=3, megatron_tensor_parallel_size=2)


def test_sequence_parallel_kept_with_tp() -> None:
    layout = _layout(
        trainer_num_workers=4, megatron_tensor_parallel_size=2, megatron_use_transformer_engine=True
    )
    assert layout.sequence_parallel and not layout.notes
    assert layout.row_pad_multiple(fp8=False) == 2
    assert layout.row_pad_multiple(fp8=True) == 16
    off = _layout(trainer_num_workers=4, megatron_tensor_parallel_size=2, megatron_sequence_parallel=False)
    assert not off.sequence_parallel and off.row_pad_multiple(fp8=False) == 1 and not off.notes
    local = _layout(trainer_num_workers=4, megatron_tensor_parallel_size=2)  # local spec: no SP
    assert not local.sequence_parallel and "needs megatron_use_transformer_engine" in local.notes[0]


def test_expert_parallel_rules() -> None:
    ok = _layout(
        trainer_num_workers=8, num_experts=8, megatron_tensor_parallel_size=2, megatron_expert_parallel_size=4
    )
    assert ok.expert == 4 and ok.data == 4 and ok.expert_data == 1
    with pytest.raises(MegatronConfigError, match="needs a mixture-of-experts model"):
        _layout(trainer_num_workers=4, megatron_expert_parallel_size=2)
    with pytest.raises(MegatronConfigError, match="does not divide the model's 6 experts"):
        _layout(trainer_num_workers=4, num_experts=6, megatron_expert_parallel_size=4)
    with pytest.raises(MegatronConfigError, match="tensor x pipeline x expert parallel = 8"):
        _layout(
            trainer_num_workers=4,
            num_experts=8,
            megatron_tensor_parallel_size=2,
            megatron_expert_parallel_size=4,
        )


def test_feature_rules_are_all_reported_together() -> None:
    with pytest.raises(MegatronConfigError) as err:
        _layout(
            megatron_fp8=True,
            megatron_optimizer_cpu_offload=True,
            megatron_use_distributed_optimizer=False,
            megatron_exp_avg_dtype="bfloat16",
            megatron_context_parallel_size=2,
        )
    problems = err.value.problems
    assert len(problems) == 4
    assert any("megatron_fp8: true needs megatron_use_transformer_engine" in p for p in problems)
    assert any("megatron_optimizer_cpu_offload" in p for p in problems)
    assert any("megatron_exp_avg_dtype='bfloat16'" in p for p in problems)
    assert any("context parallelism is not implemented" in p for p in problems)


def test_precision_aware_optimizer_dtypes() -> None:
    ok = _layout(
        megatron_use_precision_aware_optimizer=True,
        megatron_exp_avg_dtype="bfloat16",
        megatron_main_grads_dtype="bfloat16",
    )
    assert ok.data == 2
    with pytest.raises(MegatronConfigError, match="main_params_dtype='bfloat16' is not supported"):
        _layout(megatron_use_precision_aware_optimizer=True, megatron_main_params_dtype="bfloat16")


def test_global_batch_size_default_and_explicit() -> None:
    assert _layout(prompts_batch_size_for_trainer=32, number_of_minibatches=4).global_batch_size == 8
    assert _layout(prompts_batch_size_for_trainer=32, megatron_global_batch_size=32).global_batch_size == 32
    with pytest.raises(MegatronConfigError, match="leave it null or set it to 16"):
        _layout(prompts_batch_size_for_trainer=32, number_of_minibatches=2, megatron_global_batch_size=8)
    with pytest.raises(MegatronConfigError, match="not divisible by number_of_minibatches=3"):
        _layout(prompts_batch_size_for_trainer=16, number_of_minibatches=3)
