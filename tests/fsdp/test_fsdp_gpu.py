"""FSDP backend on CUDA (NCCL, one rank): runs whenever a GPU is present."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fsdp_helpers import make_samples, tiny_config  # noqa: E402

from telescope.core.packing import Packer  # noqa: E402
from telescope.core.trainer import RankBatch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("one_rank_group")]


def cuda_backend(cfg: Any, **kwargs: Any) -> Any:
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs

    backend = FSDPBackend(cfg, FSDPBackendKwargs(device="cuda", **kwargs))
    info = backend.init()
    assert info["device"].startswith("cuda")
    return backend


def test_cuda_packed_logprobs_equal_per_sequence(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from telescope.core.algorithms.logprobs import token_logprobs
    from telescope.core.training.tensors import to_device
    from telescope.fsdp.microbatch import packed_logits
    from telescope.fsdp.model import pick_attn_implementation

    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    attn = pick_attn_implementation("auto", device)  # flash_attention_2 when installed
    dtype = torch.bfloat16 if attn == "flash_attention_2" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype, attn_implementation=attn).to(
        device
    )
    samples = make_samples(6, seed=3)
    (row,) = Packer(seq_len=256, pad_to_multiple_of=8).pack(samples).per_rank[0]
    mb = to_device(row, device)
    packed = token_logprobs(packed_logits(model, mb), mb.targets)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for i, s in enumerate(samples):
        ids = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)], device=device)
        single = token_logprobs(model(input_ids=ids, use_cache=False).logits[0, :-1], ids[0, 1:])
        mask = torch.tensor([j == i for j in row.sample_index[1:]], device=device) & (mb.loss_mask > 0)
        torch.testing.assert_close(packed[mask], single[len(s.prompt_ids) - 1 :], atol=tol, rtol=0)


def test_cuda_train_step_bf16_mixed_precision(tiny_model_dir: str) -> None:
    cfg = tiny_config(tiny_model_dir, mixed_precision_dtype="bfloat16", number_of_minibatches=2)
    backend = cuda_backend(cfg)
    before = {k: v.clone() for k, v in backend.iter_weights_for_inference()}
    assert all(v.is_cuda and v.dtype == torch.float32 for v in before.values())
    packer = Packer(cfg.seq_len, cfg.pad_to_multiple_of, 1, num_minibatches=2)
    metrics = backend.train_step(RankBatch.from_packed(packer.pack(make_samples(10, seed=1)), 0))
    assert metrics["train/optimizer_steps"] == 2
    for key in (
        "loss",
        "entropy",
        "kl_divergence_inference",
        "grad_norm",
        "memory/peak_allocated_gb",
        "timing_forward_total",
        "timing_backward_microbatch_mean",
    ):
        assert math.isfinite(metrics[key]), key
    after = dict(backend.iter_weights_for_inference(dtype=torch.bfloat16))
    assert all(v.dtype == torch.bfloat16 for v in after.values())
    assert any((after[k].float() - before[k]).abs().max() > 1e-3 for k in after)
