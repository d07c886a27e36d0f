"""Every Telescope hook, documented.

Plugins implement these with ``@telescope.core.hookimpl``. Registration hooks are called
once per plugin manager, in plugin order (core built-ins first, then entry points), each
with a ``register`` object bound to the calling plugin so every component records where it
came from. Lifecycle hooks let plugins observe a run; they return nothing.

Always call hooks with keyword arguments (pluggy's rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from telescope.core.registry import Register

hookspec = pluggy.HookspecMarker("telescope")

# --------------------------------------------------------------------------------------
# Registration: called once when a registry is built from a plugin manager.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_register_algorithms(register: Register) -> None:
    """Register RL algorithms (advantage estimator + policy loss).

    Args:
        register: call ``register.add(name, factory, kwargs_model=None, description="")``.
            ``factory`` is a ``"module:attribute"`` import string (preferred: imported only
            when the algorithm is selected) or a callable returning an ``Algorithm``.
    """


@hookspec
def telescope_register_trainer_backends(register: Register) -> None:
    """Register trainer backends (selected by the ``train_backend`` config field).

    Args:
        register: as for ``telescope_register_algorithms``; the factory builds an object
            with ``init``, ``train_step``, ``iter_weights_for_inference``,
            ``save_checkpoint`` and ``load_checkpoint``. Pass ``unavailable="reason"`` when a
            required dependency is missing: the backend is listed but cannot be selected.
            Pass ``checkpoint_converter="module:function"`` so ``telescope checkpoint convert``
            can turn its checkpoints into HF folders: ``function(src, out, max_shard_bytes)``
            writes the weight files of checkpoint ``src`` into ``out`` (core does the rest).
    """


@hookspec
def telescope_register_inference_engines(register: Register) -> None:
    """Register inference engines (selected by the ``inference_engine`` config field).

    Args:
        register: as for ``telescope_register_algorithms``; the factory launches servers
            that speak Telescope's OpenAI-compatible completions protocol.
    """


@hookspec
def telescope_register_environments(register: Register) -> None:
    """Register training environments (named in the ``environments`` config list).

    Args:
        register: as for ``telescope_register_algorithms``; ``kwargs_model`` is the pydantic
            model that validates the entry's ``kwargs`` (unknown keys are errors).
    """


@hookspec
def telescope_register_evals(register: Register) -> None:
    """Register dedicated evals (named in the ``evals`` config list).

    Any registered environment can also be named as an eval; this hook is for evals that are
    not training environments (e.g. ``math500``).

    Args:
        register: as for ``telescope_register_environments``.
    """


@hookspec
def telescope_register_sandbox_providers(register: Register) -> None:
    """Register sandbox providers (named by an environment's sandbox ``provider`` kwarg).

    Args:
        register: as for ``telescope_register_algorithms``; ``kwargs_model`` validates the
            provider's own settings.
    """


@hookspec
def telescope_register_loggers(register: Register) -> None:
    """Register metric/rollout loggers (console, local run directory, W&B, ...).

    Args:
        register: as for ``telescope_register_algorithms``.
    """


# --------------------------------------------------------------------------------------
# Run lifecycle: observers, called by the driver process.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_run_start(config: Any, run_dir: str) -> None:
    """Called once after the config is resolved and the run directory exists.

    Args:
        config: the resolved, frozen ``TelescopeConfig``.
        run_dir: absolute path of the run directory.
    """


@hookspec
def telescope_step_end(step: int, metrics: dict[str, float]) -> None:
    """Called after every training step, once its metrics are final.

    Args:
        step: the 1-based step that just finished.
        metrics: that step's metrics (flat ``section/group/metric`` keys).
    """


@hookspec
def telescope_run_end(status: str, error: BaseException | None) -> None:
    """Called once when a run ends, however it ends.

    Args:
        status: ``"completed"``, ``"interrupted"`` or ``"failed"``.
        error: the root-cause exception when ``status == "failed"``, else ``None``.
    """
