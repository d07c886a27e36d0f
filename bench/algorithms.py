"""Loss + backward time per million tokens for every registered algorithm, on CPU.

Run: ``.venv/bin/python bench/algorithms.py [--tokens N] [--repeats R]``. Each algorithm is
timed on one packed micro-batch of N tokens (samples of 64-1024 tokens, 80 % loss
tokens) with TIS on, plus the PPO-clipped variant where the algorithm allows it. A second
table times ``token_logprobs`` (forward + backward) and ``token_entropy`` on [T, V] logits.
Figures are wall-clock medians; compare them only on the same machine.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from telescope.core.algorithms import Algorithm, LossInputs, get_algorithm, token_entropy, token_logprobs
from telescope.core.testing import make_config, registry_with


def packed_inputs(num_tokens: int, seed: int = 0) -> LossInputs:
    """A realistic packed micro-batch: variable-length samples, prompt tokens masked."""
    g = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < num_tokens:
        n = min(int(torch.randint(64, 1025, (1,), generator=g)), num_tokens - total)
        lengths.append(n)
        total += n
    position_ids = torch.cat([torch.arange(n) for n in lengths])
    loss_mask = torch.cat([(torch.arange(n) >= n // 5).float() for n in lengths])
    advantages = torch.cat([torch.full((n,), float(torch.randn(1, generator=g))) for n in lengths])
    logprobs = -torch.rand(num_tokens, generator=g) * 3
    return LossInputs(
        logprobs=logprobs,
        inference_logprobs=logprobs + 0.1 * torch.randn(num_tokens, generator=g),
        old_logprobs=logprobs + 0.1 * torch.randn(num_tokens, generator=g),
        advantages=advantages,
        loss_mask=loss_mask,
        position_ids=position_ids,
        num_loss_tokens=float(loss_mask.sum()),
        num_samples=len(lengths),
    )


def loss_step(algorithm: Algorithm, inputs: LossInputs, cfg: Any) -> None:
    """One forward + backward of the policy loss, from fresh leaf logprobs."""
    inputs.logprobs = inputs.logprobs.detach().requires_grad_(True)
    algorithm.policy_loss(inputs, cfg).loss.backward()


def timed(fn: Callable[[], None], repeats: int) -> tuple[float, float]:
    """(median, min) seconds of ``repeats`` calls after one warm-up call.

    The min is the figure least disturbed by other processes on a shared machine.
    """
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def bench_losses(num_tokens: int, repeats: int) -> None:
    registry = registry_with()[1]
    base = packed_inputs(num_tokens)
    print(f"policy_loss + backward, {num_tokens} tokens per micro-batch, TIS on, median of {repeats}")
    print(f"{'algorithm':<14}{'variant':<10}{'median ms/M tok':>17}{'min ms/M tok':>14}")
    for name in registry.names("algorithm"):
        algorithm = get_algorithm(name, registry)
        variants = [("plain", False)] + ([("ppo_clip", True)] if algorithm.supports_ppo_clip else [])
        for label, clip in variants:
            cfg = make_config(
                algorithm=name,
                advantage_norm=algorithm.default_advantage_norm,
                use_tis=True,
                use_ppo_clip=clip,
                ppo_clip_ref_logprobs="batch",
            )

            med, best = timed(functools.partial(loss_step, algorithm, base, cfg), repeats)
            per_m = 1e9 / num_tokens  # seconds per call -> ms per million tokens
            print(f"{name:<14}{label:<10}{med * per_m:>17.1f}{best * per_m:>14.1f}")


def bench_logprobs(tokens: int, vocab: int, chunk: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(tokens, vocab, generator=g).requires_grad_(True)
    targets = torch.randint(0, vocab, (tokens,), generator=g)

    def logprobs_step() -> None:
        logits.grad = None
        token_logprobs(logits, targets, 0.7, chunk).sum().backward()

    print(f"\nlogits [{tokens}, {vocab}] float32, chunk {chunk}: seconds per million tokens (median, min)")
    for label, fn in (
        ("token_logprobs fwd+bwd", logprobs_step),
        ("token_entropy (no grad)", lambda: token_entropy(logits, 0.7, chunk)),
    ):
        med, best = timed(fn, repeats)
        print(f"{label:<26}{med * 1e6 / tokens:>10.1f}{best * 1e6 / tokens:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=262_144, help="tokens per packed micro-batch")
    parser.add_argument("--repeats", type=int, default=7, help="timed repetitions (median reported)")
    parser.add_argument("--vocab", type=int, default=32_768, help="vocabulary size for the logprob table")
    parser.add_argument(
        "--logit-tokens", type=int, default=1024, help="rows of the logits for the logprob table"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 = least disturbed by other load)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    bench_losses(args.tokens, args.repeats)
    bench_logprobs(args.logit_tokens, args.vocab, 256, args.repeats)


if __name__ == "__main__":
    main()
