"""Evals: resolving eval names, running them like training rollouts, pass@k, held-out samples.

- ``resolve_eval(name, kwargs, registry)``: a registered eval, else an environment as an eval.
- ``EvalRunner(cfg, registry, tokenizer)``: ``due(step)`` and ``await run(entries, clients, step)``.
- ``EvalResult`` / ``flat_metrics``: metrics per eval, ``eval/<name>/<metric>`` for loggers.
- ``training_exclusions(cfg, registry)``: training indices reserved by ``separate_eval_samples``.
The standalone ``telescope eval`` lives in ``telescope.core.evals.standalone``. Torch-free.
"""

from __future__ import annotations

from telescope.core.evals.aggregate import CompletionOutcome, EvalResult, aggregate, flat_metrics
from telescope.core.evals.resolve import LoadedEval, eval_indices, load_eval, resolve_eval
from telescope.core.evals.runner import EvalRunner, eval_settings
from telescope.core.evals.separation import sample_key, training_exclusions

__all__ = [
    "CompletionOutcome",
    "EvalResult",
    "EvalRunner",
    "LoadedEval",
    "aggregate",
    "eval_indices",
    "eval_settings",
    "flat_metrics",
    "load_eval",
    "resolve_eval",
    "sample_key",
    "training_exclusions",
]
