"""LoRA checkpoints exported: a PEFT adapter folder (loads with peft) and, with --merge, merged weights
(load with transformers alone); both give the trainer's logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from ckpt_helpers import make_backend, resume_config, run_steps  # noqa: E402

from telescope.core.checkpoint import CheckpointManager, ConversionError, convert_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_group")

IDS = torch.tensor([[5, 17, 42, 8, 91, 3, 60, 11, 29, 77], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])


@torch.no_grad()
def trainer_logits(backend: Any) -> Any:
    positions = torch.arange(IDS.shape[1])[None]
    rows = [
        backend.state.model(input_ids=r[None], position_ids=positions, use_cache=False).logits for r in IDS
    ]
    return torch.cat(rows).float()


def base_model(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")


def test_adapter_and_merged_exports_give_the_trainer_logits(builtin_tiny_dir: str, tmp_path: Path) -> None:
    from peft import PeftModel

    cfg = resume_config(builtin_tiny_dir, lora_rank=4, lora_alpha=8.0, learning_rate=5e-2)
    backend = make_backend(cfg)
    run_steps(backend, cfg, range(2))
    mgr = CheckpointManager(tmp_path / "ckpts")
    partial = mgr.begin(2)
    backend.save_checkpoint(str(partial))
    src = mgr.commit(partial, 2)
    want = trainer_logits(backend)
    with torch.no_grad():
        base = base_model(builtin_tiny_dir)(input_ids=IDS, use_cache=False).logits.float()
    assert (want - base).abs().max() > 1e-3  # the adapters changed the model

    adapter = convert_checkpoint(src, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    assert sorted(config["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    peft_model = PeftModel.from_pretrained(base_model(builtin_tiny_dir), str(adapter))
    with torch.no_grad():
        got = peft_model(input_ids=IDS, use_cache=False).logits.float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    merged = convert_checkpoint(src, tmp_path / "merged", merge=True)
    assert not (merged / "adapter_config.json").exists()
    with torch.no_grad():
        got = base_model(str(merged))(input_ids=IDS, use_cache=False).logits.float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_merge_refuses_a_full_checkpoint(builtin_tiny_dir: str, tmp_path: Path) -> None:
    cfg = resume_config(builtin_tiny_dir)
    backend = make_backend(cfg)
    mgr = CheckpointManager(tmp_path / "ckpts")
    partial = mgr.begin(0)
    backend.save_checkpoint(str(partial))
    src = mgr.commit(partial, 0)
    with pytest.raises(ConversionError, match="--merge.*lora_rank: 0"):
        convert_checkpoint(src, tmp_path / "out", merge=True)
