"""Real megatron-core on CPU: our mapping and training step inside Megatron's own modules.

Runs only where ``megatron.core`` imports (not in default CI: megatron-core declares Python
>= 3.12, though its wheel imports on 3.11 - e.g. unzip the megatron-core and triton wheels into
a folder on PYTHONPATH). Megatron hard-codes CUDA in a few places; ``megatron_cpu_shims``
redirects them to CPU, inside spawned worker processes only (the patches are process-wide).

Checks: every Megatron parameter gets a tensor of the right shape from ``load_hf_weights``;
Megatron's logits equal the HF model's; the export path (TP gather + ``MegatronToHFStream``)
gives back the HF weights exactly; the same with tensor parallel 2 over two gloo ranks; and two
training steps through ``forward_backward_func`` + Megatron's DDP and optimizer give the FSDP
backend's loss and grad norm, on one rank and with data parallel 2.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # ~4 min on 2 CPU cores (spawned ranks, real Megatron modules)
torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # megatron_helpers, also in spawned workers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(kind: str, model_dir: str, tp: int, pp: int = 1, ep: int = 1) -> tuple[Any, Any, Any]:
    """(HF model, Megatron GPTModel with our weights, ModelSpec) on this rank."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer import TransformerConfig
    from megatron_helpers import build_tiny_hf as build_hf

    from telescope.core.testing import make_config
    from telescope.megatron.mapping import model_spec_from_hf_config
    from telescope.megatron.model import gpt_with_hf_weights, materialize
    from telescope.megatron.options import MegatronBackendKwargs
    from telescope.megatron.parallel import resolve_parallel_layout
    from telescope.megatron.settings import transformer_config_kwargs

    hf = build_hf(kind)
    cfg = make_config(
        model=model_dir,
        train_backend="megatron",
        trainer_num_workers=tp * pp * ep,
        megatron_tensor_parallel_size=tp,
        megatron_pipeline_parallel_size=pp,
        megatron_expert_parallel_size=ep,
        mixed_precision_dtype=None,
        model_dtype="float32",
    )
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
    )
    spec = model_spec_from_hf_config(hf.config)
    layout = resolve_parallel_layout(cfg, tp * pp * ep, spec.num_experts)
    kw = materialize(transformer_config_kwargs(spec, cfg, layout, MegatronBackendKwargs()))
    if spec.num_experts:  # the alltoall dispatcher creates CUDA streams; allgather runs on CPU
        kw.update(moe_token_dispatcher_type="allgather", variable_seq_lengths=False)
    tc = TransformerConfig(**kw)
    padded = spec.padded_vocab_size(128, tp)
    gpt = gpt_with_hf_weights(spec, cfg, tc, False, padded)
    return hf, gpt.eval(), spec


def _check_forward_and_export(kind: str, model_dir: str, tp: int) -> None:
    from telescope.megatron.export import iter_full_megatron_params
    from telescope.megatron.mapping import MegatronToHFStream
    from telescope.megatron.model import BuiltModel

    hf, gpt, spec = _build(kind, model_dir, tp)
    ids = torch.randint(0, spec.vocab_size, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        local = gpt(ids, torch.arange(11)[None], None)  # [1, 11, padded_vocab / tp]
        shards = [torch.empty_like(local) for _ in range(tp)]
        dist.all_gather(shards, local.contiguous())
        logits = torch.cat(shards, dim=-1)[..., : spec.vocab_size]
        torch.testing.assert_close(logits, hf(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    built = BuiltModel([gpt], gpt, gpt.config, spec, hf.config, spec.padded_vocab_size(128, tp))
    stream = MegatronToHFStream(spec)
    exported = dict(stream.convert_all(iter_full_megatron_params(built)))
    if dist.get_rank() == 0:
        expected = _hf_params_exported(hf, spec)
        assert set(exported) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(exported[name], tensor), name
    else:
        assert exported == {}


def _hf_params_exported(hf: Any, spec: Any) -> dict[str, Any]:
    """The HF state dict an export must reproduce (no ``lm_head.weight`` when it is tied)."""
    return {
        k: v for k, v in hf.state_dict().items() if not (spec.tie_word_embeddings and k == "lm_head.weight")
    }


def _check_load_and_export(kind: str, model_dir: str, pp: int, ep: int) -> None:
    """Pipeline stages load their own layers and export sends them to rank 0 (no forward)."""
    from telescope.megatron.export import iter_full_megatron_params
    from telescope.megatron.mapping import MegatronToHFStream
    from telescope.megatron.model import BuiltModel

    hf, gpt, spec = _build(kind, model_dir, 1, pp, ep)
    built = BuiltModel([gpt], gpt, gpt.config, spec, hf.config, spec.padded_vocab_size(128, 1))
    exported = dict(MegatronToHFStream(spec).convert_all(iter_full_megatron_params(built)))
    if dist.get_rank() == 0:
        expected = _hf_params_exported(hf, spec)
        assert set(exported) == set(expected)
        assert all(torch.equal(exported[k], v) for k, v in expected.items())
    else:
        assert exported == {}


def _worker(rank: int, world: int, port: int, target: Any, args: tuple[Any, ...], errors: Any) -> None:
    from megatron_cpu_shims import apply_cpu_shims

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        apply_cpu_shims()
        target(*args)
    except BaseException as exc:  # reported to the parent, which fails the test
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise
    finally:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        dist.destroy_process_group()


def _spawn(world: int, target: Any, *args: Any) -> None:
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, target, args, errors)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    messages = []
    while not errors.empty():
        messages.append(errors.get())
    assert all(p.exitcode == 0 for p in procs), messages


@pytest.mark.parametrize("kind", ["qwen2", "qwen2_tied", "qwen3", "llama", "qwen3_moe"])
def test_megatron_forward_and_export_match_hf(kind: str, tmp_path: Path) -> None:
    from megatron_helpers import build_tiny_hf

    build_tiny_hf(kind).save_pretrained(tmp_path)
    _spawn(1, _check_forward_and_export, kind, str(tmp_path), 1)


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_tensor_parallel_2_forward_and_export(kind: str, tmp_path: Path) -> None:
    from megatron_helpers import build_tiny_hf

    build_tiny_hf(kind).save_pretrained(tmp_path)
    _spawn(2, _check_forward_and_export, kind, str(tmp_path), 2)


@pytest.mark.parametrize("kind,pp,ep", [("qwen3", 2, 1), ("qwen3_moe", 1, 2)])
def test_pipeline_and_expert_parallel_load_and_export(kind: str, pp: int, ep: int, tmp_path: Path) -> None:
    from megatron_helpers import build_tiny_hf

    build_tiny_hf(kind).save_pretrained(tmp_path)
    _spawn(pp * ep, _check_load_and_export, kind, str(tmp_path), pp, ep)


def _steps_match_fsdp(model_dir: str, world: int) -> None:
    """Two steps of the Megatron step code and of the FSDP backend on the same rows: same loss
    (validates loss shares and the num_microbatches x DP scaling) and grad norm (gradients)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))
    from fsdp_helpers import make_samples, tiny_config
    from megatron.core import parallel_state as ps

    from telescope.core.packing import Packer
    from telescope.core.trainer import RankBatch
    from telescope.core.training.timing import StepTimer
    from telescope.fsdp.backend import FSDPBackend
    from telescope.fsdp.options import FSDPBackendKwargs
    from telescope.megatron.backend import build_state
    from telescope.megatron.options import MegatronBackendKwargs
    from telescope.megatron.parallel import resolve_parallel_layout
    from telescope.megatron.step import run_minibatches

    cfg = tiny_config(
        model_dir,
        train_backend="megatron",
        trainer_num_workers=world,
        number_of_minibatches=2,
        megatron_gradient_checkpointing=False,
        megatron_use_distributed_optimizer=False,  # CUDA-only in Megatron
    )
    ps.initialize_model_parallel(1)
    st = build_state(cfg, MegatronBackendKwargs(), resolve_parallel_layout(cfg, world), torch.device("cpu"))
    for group in st.optimizer.param_groups:
        group["lr"] = cfg.learning_rate  # lr_scheduler: none
    fsdp = FSDPBackend(cfg, FSDPBackendKwargs(device="cpu", gradient_checkpointing=False))
    fsdp.init()
    packer = Packer(seq_len=cfg.seq_len, pad_to_multiple_of=8, dp_world_size=world, num_minibatches=2)
    for step in range(2):
        packed = packer.pack(make_samples(12, seed=10 + step))
        ref = fsdp.train_step(RankBatch.from_packed(packed, dist.get_rank(), step))
        got = run_minibatches(st, packed.per_rank[dist.get_rank()], StepTimer(torch.device("cpu")))
        assert got["loss"] == pytest.approx(ref["loss"], abs=1e-5), (step, got["loss"], ref["loss"])
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), (step, got, ref)
        assert got["entropy"] == pytest.approx(ref["entropy"], abs=1e-5)
        assert got["train/optimizer_steps"] == ref["train/optimizer_steps"] == 2.0


@pytest.mark.parametrize("world", [1, 2])
def test_training_steps_match_fsdp_backend(world: int, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))
    from fsdp_helpers import save_tiny_qwen2

    model_dir = save_tiny_qwen2(tmp_path / "tiny", tied=False)
    _spawn(world, _steps_match_fsdp, model_dir, world)


def _checkpoint_round_trip(model_dir: str, out: str) -> None:
    """Save after a step, train on, load: weights, optimizer state (same next update) and the HF
    copy on disk all come back exactly."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))
    from fsdp_helpers import make_samples, tiny_config
    from megatron.core import parallel_state as ps
    from safetensors.torch import load_file

    from telescope.core.packing import Packer
    from telescope.core.training.timing import StepTimer
    from telescope.megatron.backend import MegatronBackend, build_state
    from telescope.megatron.options import MegatronBackendKwargs
    from telescope.megatron.parallel import resolve_parallel_layout
    from telescope.megatron.step import run_minibatches

    cfg = tiny_config(
        model_dir,
        train_backend="megatron",
        trainer_num_workers=1,
        megatron_gradient_checkpointing=False,
        megatron_use_distributed_optimizer=False,
    )
    ps.initialize_model_parallel(1)
    backend = MegatronBackend.__new__(MegatronBackend)  # __init__/init() need CUDA; the rest is plain
    backend.cfg, backend.kwargs, backend._gather_seconds = cfg, MegatronBackendKwargs(), 0.0
    backend.layout = resolve_parallel_layout(cfg, 1)
    backend.state = st = build_state(cfg, backend.kwargs, backend.layout, torch.device("cpu"))
    for group in st.optimizer.param_groups:
        group["lr"] = cfg.learning_rate

    def step(seed: int) -> dict[str, float]:
        rows = Packer(seq_len=cfg.seq_len, pad_to_multiple_of=8).pack(make_samples(8, seed=seed)).per_rank[0]
        return run_minibatches(st, rows, StepTimer(torch.device("cpu")))

    step(1)
    backend.save_checkpoint(out)
    saved = {k: v.clone() for k, v in backend.iter_weights_for_inference()}
    first = step(2)
    after_first = dict(backend.iter_weights_for_inference())
    assert any(not torch.equal(saved[k], after_first[k]) for k in saved)
    backend.load_checkpoint(out)
    assert all(torch.equal(saved[k], v) for k, v in backend.iter_weights_for_inference())
    again = step(2)
    assert (again["loss"], again["grad_norm"]) == (first["loss"], first["grad_norm"])
    assert all(torch.equal(after_first[k], v) for k, v in backend.iter_weights_for_inference())
    on_disk = load_file(str(Path(out) / "hf" / "model-00001.safetensors"))
    assert set(on_disk) == set(saved) and all(torch.equal(on_disk[k], saved[k]) for k in saved)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))
    from fsdp_helpers import save_tiny_qwen2

    model_dir = save_tiny_qwen2(tmp_path / "tiny", tied=False)
    _spawn(1, _checkpoint_round_trip, model_dir, str(tmp_path / "step_1"))


def test_attention_backend_is_megatrons_enum_in_a_real_transformer_config() -> None:
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    from telescope.megatron.model import materialize

    kw = materialize(
        {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "attention_backend": "local"}
    )
    assert TransformerConfig(**kw).attention_backend is AttnBackend.local
    assert {m.name for m in AttnBackend} >= {"flash", "fused", "unfused", "local", "auto"}
