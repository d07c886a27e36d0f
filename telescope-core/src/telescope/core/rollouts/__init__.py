"""The sample pipeline shared by training and evals: prompt scheduling, prompts, lanes, rollouts,
token bookkeeping, rollout groups and batching.

Its records (``RolloutSample``, ``RolloutGroup``) are the public types the run hooks receive.
It sits below both ``runtime/`` and ``evals/`` (docs/architecture.md). Light at import.
"""
