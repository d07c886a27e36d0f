"""The environment layer's fault seam: rewards that raise or hang on purpose.

``env.resolve`` installs it on every environment it builds, only when ``TELESCOPE_FAULTS`` is
set: ``reward_raise`` and ``reward_hang`` then act inside ``Environment.score``, under the
environment's own ``reward_timeout_s`` and error handling, as a real reward would fail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from telescope.core import faults

if TYPE_CHECKING:
    from telescope.core.env.base import Environment
    from telescope.core.env.types import RewardResult, RolloutState, Sample

__all__ = ["inject_reward_faults"]


def inject_reward_faults(env: Environment) -> None:
    """Make ``env``'s reward calls go through ``faults.on_reward`` first (by its name at call time)."""
    reward_call = env._reward_call

    async def faulty(target: str | RolloutState, sample: Sample, eos_token: str) -> RewardResult:
        await faults.on_reward(env.name)
        return await reward_call(target, sample, eos_token)

    env._reward_call = faulty  # type: ignore[method-assign]
