"""Core built-in plugin: the seven RL algorithms, registered exactly as a third-party one would be.

Metadata read by the config validator (a plugin's own algorithm declares the same keys):
``supports_ppo_clip`` (may ``use_ppo_clip`` be on), ``advantage_norms`` (allowed values of
``advantage_norm``), ``default_advantage_norm`` (used when the user sets none) and
``uses_ratio`` (the loss weights tokens by π/ref without PPO clip, so ``use_tis`` needs
``ppo_clip_ref_logprobs: batch``) and ``token_advantages`` (the loss reads each token's own
advantage, so on-policy distillation's per-token signal can train it).
Factories are import strings, so nothing here imports torch.
"""

from __future__ import annotations

from telescope.core import hookimpl
from telescope.core.registry import Register

_MODULE = "telescope.core.algorithms"

#: name -> (factory, description, supports_ppo_clip, advantage_norms, default_advantage_norm)
ALGORITHMS: dict[str, tuple[str, str, bool, tuple[str, ...], str]] = {
    "grpo": (
        f"{_MODULE}.reinforce:Grpo",
        "GRPO: group z-score advantages, REINFORCE loss",
        True,
        ("group", "batch"),
        "group",
    ),
    "rloo": (f"{_MODULE}.reinforce:Rloo", "RLOO: leave-one-out baseline", True, ("group",), "group"),
    "reinforce_pp": (
        f"{_MODULE}.reinforce:ReinforcePlusPlus",
        "REINFORCE++: batch-whitened advantages",
        True,
        ("batch",),
        "batch",
    ),
    "dr_grpo": (
        f"{_MODULE}.reinforce:DrGrpo",
        "DR-GRPO: mean-centred advantages, no std",
        True,
        ("group",),
        "group",
    ),
    "cispo": (
        f"{_MODULE}.cispo:Cispo",
        "CISPO: clipped stop-gradient IS weight on the REINFORCE term",
        False,
        ("group", "batch"),
        "group",
    ),
    "gspo": (
        f"{_MODULE}.gspo:Gspo",
        "GSPO: sequence-level clipped importance ratio",
        False,
        ("group", "batch"),
        "group",
    ),
    "sapo": (
        f"{_MODULE}.sapo:Sapo",
        "SAPO: soft sigmoid gate on the importance ratio",
        False,
        ("group", "batch"),
        "group",
    ),
}

#: Algorithms whose loss always reads an importance ratio (their class's ``uses_ratio``).
RATIO_ALGORITHMS = frozenset({"cispo", "gspo", "sapo"})
#: Algorithms whose loss averages the advantage over each sequence (no per-token advantage).
SEQUENCE_ADVANTAGE_ALGORITHMS = frozenset({"gspo"})


@hookimpl
def telescope_register_algorithms(register: Register) -> None:
    """Register grpo, rloo, reinforce_pp, dr_grpo, cispo, gspo and sapo."""
    for name, (factory, description, ppo_clip, norms, default_norm) in ALGORITHMS.items():
        register.add(
            name,
            factory,
            description=description,
            supports_ppo_clip=ppo_clip,
            advantage_norms=norms,
            default_advantage_norm=default_norm,
            uses_ratio=name in RATIO_ALGORITHMS,
            token_advantages=name not in SEQUENCE_ADVANTAGE_ALGORITHMS,
        )
