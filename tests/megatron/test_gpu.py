"""Megatron backend on a CUDA GPU with megatron-core installed (one rank, TP=PP=EP=1).

These are the issue's GPU acceptance tests. They have NOT been run yet: the session that wrote
them had neither a GPU nor Python >= 3.12. Run on a GPU machine with
``pip install 'telescope-megatron[megatron]'`` (and transformer-engine for the TE cases):
``pytest tests/megatron/test_gpu.py -s`` (``-s`` shows the printed step times).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.megatron.availability import unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"megatron: {unavailable_reason()}"),
]

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))  # shared tiny-model helpers


def _has_te() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fsdp_helpers import save_tiny_qwen2

    return save_tiny_qwen2(Path(tmp_path_factory.mktemp("tiny_qwen2_megatron")), tied=False)


@pytest.fixture(autouse=True)
def fresh_groups() -> Iterator[None]:
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _cfg(model_dir: str, **overrides: Any) -> Any:
    from fsdp_helpers import tiny_config

    return tiny_config(model_dir, train_backend="megatron", trainer_num_workers=1, **overrides)


def _batch(seed: int, cfg: Any) -> Any:
    from fsdp_helpers import make_samples

    from telescope.core.packing import Packer
    from telescope.core.trainer import RankBatch

    packed = Packer(seq_len=cfg.seq_len, pad_to_multiple_of=8).pack(make_samples(8, seed=seed))
    return RankBatch.from_packed(packed, 0)


def _megatron(cfg: Any, **kwargs: Any) -> Any:
    from telescope.megatron.backend import MegatronBackend
    from telescope.megatron.options import MegatronBackendKwargs

    backend = MegatronBackend(cfg, MegatronBackendKwargs(**kwargs))
    assert backend.init()["device"].startswith("cuda")
    return backend


@pytest.mark.parametrize(
    "use_te", [False, pytest.param(True, marks=pytest.mark.skipif(not _has_te(), reason="no TE"))]
)
def test_one_step_loss_matches_fsdp_bf16(tiny_model_dir: str, use_te: bool) -> None:
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs

    cfg = _cfg(tiny_model_dir, mixed_precision_dtype="bfloat16", megatron_use_transformer_engine=use_te)
    batch = _batch(1, cfg)
    fsdp = FSDPBackend(cfg, FSDPBackendKwargs(device="cuda"))
    fsdp.init()
    ref = fsdp.train_step(batch)
    got = _megatron(cfg).train_step(batch)
    print(
        f"\n[megatron te={use_te}] loss {got['loss']:.6f} vs fsdp {ref['loss']:.6f}; step "
        f"{got['timing_step_total'] * 1e3:.1f} ms vs fsdp {ref['timing_step_total'] * 1e3:.1f} ms"
    )
    assert abs(got["loss"] - ref["loss"]) <= 1e-3
    assert got["entropy"] == pytest.approx(ref["entropy"], abs=2e-2)
    assert got["train/optimizer_steps"] == 1.0 and got["grad_norm"] > 0


@pytest.mark.parametrize(
    "use_te", [False, pytest.param(True, marks=pytest.mark.skipif(not _has_te(), reason="no TE"))]
)
def test_logprobs_after_conversion_match_hf(tiny_model_dir: str, use_te: bool) -> None:
    from fsdp_helpers import make_samples
    from transformers import AutoModelForCausalLM

    from telescope.core.algorithms.logprobs import token_logprobs
    from telescope.core.packing import Packer
    from telescope.megatron.step import prepare_rows

    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = _cfg(tiny_model_dir, megatron_use_transformer_engine=use_te)  # fp32 everywhere
    st = _megatron(cfg).state
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda().eval()
    samples = make_samples(5, seed=4)
    rows = Packer(seq_len=256, pad_to_multiple_of=8).pack(samples).per_rank[0]
    vocab = st.built.spec.vocab_size
    got: list[torch.Tensor] = []
    with torch.no_grad():
        for item in prepare_rows(st, rows):
            out = st.built.chunks[0](
                item.mb.input_ids, item.mb.position_ids, None, packed_seq_params=item.packed_seq_params
            )
            lp = token_logprobs(out[0, :-1, :vocab].float(), item.mb.targets)
            got.append(lp[item.mb.loss_mask > 0])
        expected = []
        for row in rows:  # HF per sample, in the row order prepare_rows used
            for i in dict.fromkeys(j for j in row.sample_index if j >= 0):
                s = samples[i]
                ids = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)], device="cuda")
                ref = token_logprobs(hf(input_ids=ids, use_cache=False).logits[0, :-1].float(), ids[0, 1:])
                expected.append(ref[len(s.prompt_ids) - 1 :])
    torch.testing.assert_close(torch.cat(got), torch.cat(expected), atol=1e-4, rtol=0)


def test_weights_stream_back_to_hf_exactly(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    backend = _megatron(_cfg(tiny_model_dir))
    streamed = dict(backend.iter_weights_for_inference())
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert set(streamed) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(streamed[name].cpu(), tensor), name


def test_checkpoint_round_trip(tiny_model_dir: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cfg = _cfg(tiny_model_dir)
    backend = _megatron(cfg)
    backend.train_step(_batch(1, cfg))
    backend.save_checkpoint(str(tmp_path / "step_1"))
    saved = {k: v.clone() for k, v in backend.iter_weights_for_inference()}
    after_save = backend.train_step(_batch(2, cfg))
    assert any(not torch.equal(saved[k], v) for k, v in backend.iter_weights_for_inference())
    backend.load_checkpoint(str(tmp_path / "step_1"))
    restored = dict(backend.iter_weights_for_inference())
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
    again = backend.train_step(_batch(2, cfg))  # optimizer state and LR step restored too
    assert again["loss"] == pytest.approx(after_save["loss"], abs=1e-6)
    assert again["grad_norm"] == pytest.approx(after_save["grad_norm"], rel=1e-5)
    hf_files = sorted((tmp_path / "step_1" / "hf").glob("*.safetensors"))
    on_disk = {k: v for f in hf_files for k, v in load_file(str(f)).items()}
    assert set(on_disk) == set(saved) and all(torch.equal(on_disk[k], saved[k].cpu()) for k in saved)
