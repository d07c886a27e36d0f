"""Vocabulary-parallel logprobs/entropy over 2 gloo ranks vs the unsharded computation."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from telescope.megatron.vocab_parallel import vocab_parallel_logprobs_and_entropy

T, VOCAB, PADDED, TEMP = 7, 10, 12, 0.7  # 2 padded columns, 6 columns per rank


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(T, PADDED, generator=g) * 3
    targets = torch.randint(0, VOCAB, (T,), generator=g)
    targets[0], targets[1] = 0, VOCAB - 1  # first column of rank 0, last real column of rank 1
    return logits, targets


def _reference() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, targets = _data()
    full = logits[:, :VOCAB].clone().requires_grad_(True)  # padding columns are not tokens
    logp = torch.log_softmax(full / TEMP, dim=-1)
    lp = logp.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    lp.sum().backward()
    grad = torch.cat([full.grad, torch.zeros(T, PADDED - VOCAB)], dim=1)
    return lp.detach(), entropy.detach(), grad


def _worker(rank: int, port: int, queue) -> None:  # type: ignore[no-untyped-def]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        logits, targets = _data()
        width = PADDED // 2
        local = logits[:, rank * width : (rank + 1) * width].clone().requires_grad_(True)
        lp, ent = vocab_parallel_logprobs_and_entropy(
            local, targets, vocab_start=rank * width, vocab_size=VOCAB, temperature=TEMP
        )
        lp.sum().backward()
        queue.put((rank, lp.detach().tolist(), ent.tolist(), local.grad.tolist()))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_vocab_parallel_matches_full_softmax() -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (lp, ent, g)) for r, lp, ent, g in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ref_lp, ref_ent, ref_grad = _reference()
    for rank in (0, 1):
        lp, ent, grad = (torch.tensor(x) for x in results[rank])
        torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad, ref_grad[:, rank * 6 : (rank + 1) * 6], rtol=1e-5, atol=1e-6)


def test_single_rank_masks_vocab_padding() -> None:
    logits, targets = _data()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        lp, ent = vocab_parallel_logprobs_and_entropy(
            logits, targets, vocab_start=0, vocab_size=VOCAB, temperature=TEMP
        )
    finally:
        dist.destroy_process_group()
    ref_lp, ref_ent, _ = _reference()
    torch.testing.assert_close(lp.detach(), ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
