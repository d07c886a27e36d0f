"""One registry of the known step-metric keys, a sentence each (from docs/run-directory.md),
shown as the dashboard's chart tooltips, and the keys that repeat another one.

A pattern is a key with ``<name>`` placeholders (one path part each: ``reward/<env>/mean``);
``*`` at the end matches any rest (``timing_*``). The first matching pattern wins, so specific
patterns come before general ones.
"""

from __future__ import annotations

import re
from functools import cache

__all__ = ["DUPLICATE_OF", "METRIC_DOCS", "describe", "without_duplicates"]

METRIC_DOCS: tuple[tuple[str, str], ...] = (
    (
        "reward/gini_mean",
        "Gini of rewards within each prompt group, averaged over groups (0: equal rewards).",
    ),
    ("reward/<env>/errors", "Rollouts of this environment whose reward raised or timed out (kept or not)."),
    (
        "reward/<stat>",
        "Reward of the kept samples as the environment returned it (raw_reward): {stat} over the step.",
    ),
    ("reward/<env>/<stat>", "Reward of this environment's kept samples (raw_reward): {stat} over the step."),
    ("reward_normalized/gini_mean", "Gini of the normalised rewards within each group, averaged."),
    (
        "reward_normalized/<stat>",
        "The reward training used, mapped onto [0, 1] by the declared range: {stat}.",
    ),
    ("reward_normalized/<env>/<stat>", "This environment's reward as training used it (normalised): {stat}."),
    ("advantage/<stat>", "Advantage of the kept samples: {stat} over the step."),
    (
        "sample_metrics/<name>/gini_mean",
        "Gini of this sample metric within each prompt group, averaged over groups.",
    ),
    (
        "sample_metrics/<name>/<stat>",
        "The environment's sample metric (RewardResult.sample_metrics): {stat} over kept samples.",
    ),
    ("tokens/<kind>/<stat>", "Tokens per kept sample ({kind}): {stat}."),
    ("rollouts/count", "Kept samples trained on in this step."),
    ("rollouts/groups", "Kept prompt groups in this step."),
    (
        "rollouts/stop_reason_length_pct",
        "% of kept samples that stopped at the token limit (length or truncated).",
    ),
    ("rollouts/group_length_gini_mean", "Gini of completion lengths within each group, averaged."),
    ("rollouts/group_length_max_median_ratio_mean", "Max/median completion length per group, averaged."),
    ("discarded/count", "Finished rollouts not trained on in this step."),
    ("discarded/pct", "% of finished rollouts not trained on (of kept + discarded)."),
    (
        "discarded/max_async/<n>",
        "Rollouts generated more than max_async_rollout versions before their step ({n}).",
    ),
    ("discarded/rollout_error/<n>", "Rollouts whose group had a failed request ({n})."),
    (
        "discarded/prompt_too_long/<n>",
        "Rollouts whose prompt left no room to generate within max_model_len ({n}).",
    ),
    ("discarded/reward_error/<n>", "Rollouts whose group's every reward raised or timed out ({n})."),
    ("discarded/zero_advantage/reward_mean", "Mean reward of the zero-advantage samples."),
    (
        "discarded/zero_advantage/<kind>_groups",
        "Zero-advantage groups whose rewards were {kind} (all the same).",
    ),
    ("discarded/zero_advantage/<n>", "Rollouts of groups with equal rewards, discarded ({n})."),
    ("discarded/tokens/<kind>/<stat>", "Tokens per discarded sample ({kind}): {stat}."),
    ("discarded/<reason>/<n>", "Rollouts discarded as {reason} ({n})."),
    ("cancelled/count", "Rollouts stopped in flight in this step."),
    ("cancelled/<reason>/count", "Rollouts stopped in flight because of {reason}."),
    ("perf/step_time_s", "Wall time from the previous step's end to this one's, in seconds."),
    ("perf/tokens", "Tokens (prompt + completion) of the samples trained on in this step."),
    ("perf/tokens_per_s", "Training throughput: the step's tokens over its wall time."),
    (
        "perf/async_level",
        "Inference step minus trainer step when the step was taken (how far generation ran ahead).",
    ),
    ("totals/discarded_groups/<reason>", "Groups discarded as {reason} since the run started."),
    ("totals/cancelled_samples", "Samples cancelled since the run started."),
    ("totals/aborted_requests", "Requests of cancelled samples the servers confirmed aborting."),
    ("totals/rollout_errors", "Failed requests since the run started."),
    ("totals/reward_errors/<env>", "Rewards of {env} that raised or timed out since the run started."),
    ("infra/failed", "Sample attempts an infrastructure failure ended in this step (never scored)."),
    ("infra/retried", "Of them, samples run again after a backoff (infra_max_retries_per_sample)."),
    ("infra/masked", "Of them, samples out of retries, masked: their group trained on the rest."),
    (
        "infra/groups_hit",
        "Groups with an infrastructure failure: what dropping whole groups would regenerate.",
    ),
    ("infra/cause/<cause>", "Infrastructure failures of cause {cause}, counted where they happened."),
    ("infra/env/<env>/<what>", "Samples of environment {env} {what} for the infrastructure."),
    ("infra/provider/<provider>/<what>", "Infrastructure failures of provider {provider}: {what}."),
    ("totals/infra/<what>", "Infrastructure failures under samples since the run started: {what}."),
    ("faults/inference_restarts", "Inference servers restarted after they died, since the run started."),
    ("health/findings", "Health findings raised so far in the run (docs/health.md)."),
    ("health/<finding>", "1 while the health finding {finding} lasts, else 0 (docs/health.md)."),
    (
        "distill/reverse_kl",
        "Distillation: student minus teacher logprob, mean per trained token (reverse KL).",
    ),
    (
        "distill/teacher_logprob_mean",
        "Distillation: the teacher's mean logprob of the sampled, trained tokens.",
    ),
    ("distill/teacher_seconds", "Distillation: mean seconds a sample waited for its teacher logprobs."),
    ("distill/teacher_<what>", "Distillation: the teacher's {what} since the run started."),
    ("entropy", "Mean token entropy of the policy on the trained completions."),
    (
        "kl_divergence_inference",
        "Mismatch KL between the trainer's and the inference engine's token probabilities.",
    ),
    ("grad_norm", "Gradient norm before clipping."),
    ("learning_rate", "Learning rate used for this step."),
    ("timing_step_total", "Trainer: the whole train step, in seconds."),
    ("timing_step_active", "Trainer: the step's busy time (without waiting for data), in seconds."),
    ("timing_waiting_for_data", "Trainer: time waiting for the batch, in seconds."),
    ("timing_weight_sync_trainer_total", "Weight sync, trainer side (gather and send), in seconds."),
    ("timing_weight_sync_inference_total", "Weight sync, inference side (receive and load), in seconds."),
    ("timing_<phase>_microbatch_mean", "Trainer phase {phase}, mean per micro-batch, in seconds."),
    ("timing_<phase>_total", "Trainer phase {phase}, summed over the step's micro-batches, in seconds."),
    ("timing_*", "Trainer timing breakdown, in seconds."),
)

_STAT_WORDS = {
    "mean": "mean",
    "std": "std (population)",
    "min": "minimum",
    "max": "maximum",
    "count": "count",
    "pct": "% of finished rollouts",
}

#: Keys that repeat another key's value: hidden when the other one is present.
DUPLICATE_OF: dict[str, str] = {"async_level": "perf/async_level"}


@cache
def _compiled() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for pattern, text in METRIC_DOCS:
        regex = re.escape(pattern).replace(r"\*", ".*")
        regex = re.sub(r"<(\w+)>", lambda m: f"(?P<{m.group(1)}>[^/]+?)", regex)
        out.append((re.compile(f"^{regex}$"), text))
    return out


def describe(key: str) -> str | None:
    """The sentence for ``key``, or None for a key the registry does not know."""
    for regex, text in _compiled():
        found = regex.match(key)
        if found:
            parts = {k: _STAT_WORDS.get(v, v.replace("_", " ")) for k, v in found.groupdict().items()}
            return text.format(**parts)
    return None


def without_duplicates(keys: list[str]) -> list[str]:
    """``keys`` less those repeating another key that is present (``DUPLICATE_OF``)."""
    present = set(keys)
    return [k for k in keys if DUPLICATE_OF.get(k) not in present]
