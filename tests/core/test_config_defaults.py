"""Every field of the seed configuration table exists with its exact name and default."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from telescope.core.config import EnvironmentEntry, EvalEntry, TelescopeConfig, load_config
from telescope.core.config.loader import load_defaults

TABLE = Path(__file__).parent.parent / "data" / "seed_config_table.txt"
ADDED_FIELDS = {
    "plugins": [],
    "seed": 0,
    "inference_engine": "auto",
    "run_dir": None,
    "weight_sync_verify": True,
    "lora_rank": 0,
    "lora_alpha": 16.0,
    "lora_dropout": 0.0,
    "lora_target_modules": None,
    "train_backend_kwargs": {},
    "inference_engine_kwargs": {},
    "trainer_torch_threads": None,
    "inference_torch_threads": None,
    "stall_timeout_s": 1800.0,
    "infra_max_retries_per_sample": 2,
    "infra_retry_backoff_s": 1.0,
    "infra_max_failure_rate": 0.5,
    "infra_failure_window": 200,
    "trainer_overdue_factor": 10.0,
    "trainer_overdue_floor_s": 60.0,
    "ray_network_namespace": "auto",
    "inference_overdue_factor": 10.0,
    "inference_overdue_floor_s": 60.0,
    "overwrite": False,
    "checkpoint_failure": "stop",
    "inference_dtype": None,
    "inference_max_restarts": 3,
    "max_run_restarts": 2,
    "use_tensorboard": False,
    "tensorboard_dir": None,
    "use_mlflow": False,
    "mlflow_tracking_uri": None,
    "mlflow_experiment_name": "telescope",
    "inference_access_log": False,
    "rollout_token_view_max_tokens": 512,
    "agent_tool_call_parser": "xml",
    "vllm_weight_reload": "auto",
    "health_window_steps": 10,
    "health_min_history_steps": 1,
    "health_patience_steps": 2,
    "health_max_rollbacks": 2,
    "health_rollback_lr_factor": 0.5,
    "health_entropy_collapse_action": "warn",
    "health_entropy_collapse_ratio": 0.25,
    "health_kl_spike_action": "warn",
    "health_kl_spike_mads": 10.0,
    "health_kl_spike_min": 0.5,
    "health_kl_spike_max": 1.0,
    "health_grad_norm_spike_action": "warn",
    "health_grad_norm_spike_mads": 10.0,
    "health_length_blowup_action": "warn",
    "health_length_blowup_ratio": 2.0,
    "health_length_blowup_truncated_share": 0.5,
    "health_length_collapse_action": "warn",
    "health_length_collapse_ratio": 0.3,
    "health_reward_saturated_action": "warn",
    "health_reward_saturated_groups": 64,
    "health_reward_saturated_share": 0.95,
    "health_degenerate_outputs_action": "warn",
    "health_degenerate_outputs_share": 0.5,
    "health_nonfinite_action": "warn",
    "routing_policy": "sticky_least_loaded",
    "routing_saturation_margin": 8,
    "context_compaction_at_tokens": None,
    "context_compaction_max_per_rollout": 4,
    "context_compaction_train_summary": True,
    "context_compaction_attempts": 2,
    "distill_teacher_model": None,
    "distill_teacher_base_url": None,
    "distill_teacher_num_workers": 1,
    "distill_kl_coef": 1.0,
    "distill_reward_weight": 1.0,
    "distill_teacher_timeout_s": 120.0,
    "distill_teacher_max_retries": 3,
    "distill_teacher_batch_size": 64,
}


def _parse_table() -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    """(top-level, environment entry, eval entry) defaults as the seed doc states them."""
    top: dict[str, object] = {}
    blocks: list[dict[str, object]] = []
    current = top
    for line in TABLE.read_text().splitlines():
        parts = line.rstrip(" |").split(" | ")
        name, default = parts[0], parts[-2]
        if name == "name":  # an entry table starts (environments, then evals)
            current = {}
            blocks.append(current)
        elif name in ("inference_num_workers", "use_wandb"):  # first fields after each entry table
            current = top
        current[name] = "<required>" if default == "required" else yaml.safe_load(default)
    return top, blocks[0], blocks[1]


SEED_TOP, SEED_ENV, SEED_EVAL = _parse_table()
# Defaults we changed on purpose, with why: the seed binds inference servers to every interface,
# but they have no authentication (one can load weights), so they listen on loopback unless told
# otherwise; a multi-node run that forgets inference_host gets an error naming it (addresses.py).
SAFER_DEFAULTS = {"inference_host": ("0.0.0.0", "127.0.0.1")}


def test_table_parsed_completely() -> None:
    assert len(SEED_TOP) >= 120
    assert set(SEED_ENV) == {"name", "weight", "reward_min", "reward_max", "kwargs"}
    assert "eval_every" in SEED_EVAL and "pass_k" in SEED_EVAL


@pytest.mark.parametrize("name", sorted(SEED_TOP))
def test_seed_field_exists_with_default(name: str) -> None:
    assert name in TelescopeConfig.model_fields, f"seed field {name} missing from the schema"
    default = TelescopeConfig.model_fields[name].get_default(call_default_factory=True)
    expected = SEED_TOP[name]
    if name in SAFER_DEFAULTS:
        seed, expected = SAFER_DEFAULTS[name]
        assert SEED_TOP[name] == seed, f"the seed changed {name}'s default: revisit SAFER_DEFAULTS"
    if name == "wandb_code_exclude_patterns":  # the doc elides the list: [".git", ".venv", ...]
        assert default[:2] == [".git", ".venv"]
    else:
        assert default == expected and type(default) is type(expected), (name, default, expected)


def test_entry_defaults_match_seed() -> None:
    for model, seed in ((EnvironmentEntry, SEED_ENV), (EvalEntry, SEED_EVAL)):
        assert set(model.model_fields) == set(seed)
        for name, expected in seed.items():
            if expected == "<required>":
                assert model.model_fields[name].is_required()
            else:
                assert model.model_fields[name].get_default(call_default_factory=True) == expected


def test_only_documented_additions() -> None:
    extra = set(TelescopeConfig.model_fields) - set(SEED_TOP) - {"environments", "evals"}
    assert extra == set(ADDED_FIELDS)
    for name, default in ADDED_FIELDS.items():
        assert TelescopeConfig.model_fields[name].get_default(call_default_factory=True) == default


def test_packaged_defaults_yaml_equals_schema_defaults() -> None:
    shipped = load_defaults()
    schema = {
        k: f.get_default(call_default_factory=True)
        for k, f in TelescopeConfig.model_fields.items()
        if k != "environments"
    }
    assert shipped == schema


def test_every_field_documented() -> None:
    for model in (TelescopeConfig, EnvironmentEntry, EvalEntry):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no docstring"


def test_resolved_config_is_frozen_and_round_trips() -> None:
    cfg = load_config(None, {"environments": [{"name": "x", "kwargs": {"a": [1, 2]}}], "top_p": 0.9})
    with pytest.raises(ValidationError):
        cfg.learning_rate = 1.0  # type: ignore[misc]
    again = TelescopeConfig.model_validate(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert again == cfg
    assert cfg.resolved_run_dir == "runs/telescope_run"
