"""Every Telescope hook, documented.

Plugins implement these with ``@telescope.core.hookimpl``. Registration hooks are called
once per plugin manager, in plugin order (core built-ins first, then entry points), each
with a ``register`` object bound to the calling plugin so every component records where it
came from.

Run hooks are the one channel through which a run reports: the driver, the orchestrator,
the checkpointer and the evals call them, and nothing else. The built-in loggers (run
directory, console, W&B, ...) see the run through them too: the driver registers the run's
``LoggerHub`` as a plugin for the run's lifetime (``core.logger_hub``), so a third-party
plugin sees exactly what they see. They are called in the driver process, from its event
loop (``telescope_run_end`` and a failure's ``telescope_run_info`` from the main thread);
they return nothing and must be quick (a few are called for every sample). An exception in
one ends the run, like a failure of the run's own code.

Always call hooks with keyword arguments (pluggy's rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent
    from telescope.core.registry import Register
    from telescope.core.rollouts.groups import RolloutGroup

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
# Run: called by the driver process while a run trains, in this order: ``run_start``, then
# any number of the others, then ``run_end``.
# --------------------------------------------------------------------------------------


@hookspec
def telescope_run_start(config: TelescopeConfig, run_dir: str) -> None:
    """Called once after the config is resolved and the run directory exists.

    Args:
        config: the resolved, frozen ``TelescopeConfig`` every process of the run receives.
        run_dir: absolute path of the run directory.
    """


@hookspec
def telescope_run_info(info: dict[str, Any]) -> None:
    """Run-level facts, merged into ``run.json``'s ``info`` (later keys replace earlier ones).

    Args:
        info: JSON-ready facts, one or a few top-level keys per call: ``setup`` (engine,
            plugins, start-up summary), ``resume``, ``environments`` and ``evals`` (reward ranges, dataset sizes),
            ``torch_threads``, ``restarts`` (the run restarted from a checkpoint), ``failure``
            (why the run failed, with the log's last lines).
    """


@hookspec
def telescope_group_end(group: RolloutGroup, step: int) -> None:
    """A rollout group is done with: trained on, discarded, or cancelled in flight.

    Every group the run generated is reported once (a group re-queued from a drained server
    is reported when its retry ends). ``group.discard_reason`` is None for a kept group, one
    of ``DISCARD_REASONS`` for a finished one not trained on, or one of ``CANCEL_REASONS``
    for one stopped in flight (``group.info["cancelled_samples"]`` samples were running; its
    ``samples`` are the ones that had finished).

    Args:
        group: the ``RolloutGroup`` (its samples with rewards, advantages and timings).
        step: the 1-based training step it belongs to: the step that trains it, or the step
            being filled when it was discarded. Its records are in that step's
            ``telescope_step_end`` ``rollouts``.
    """


@hookspec
def telescope_events(events: list[TimelineEvent]) -> None:
    """Points on the run's timeline (``events/`` in the run directory, the dashboard), in order.

    Spans are a ``start`` and an ``end`` event with the same fields. Core types are
    ``EVENT_TYPES``: per sample ``generation`` and ``reward`` spans, per step ``trainer`` and
    ``weight_sync`` spans, ``checkpoint`` spans, ``eval`` instants (``attrs["scores"]``),
    ``run`` instants (``inference_restart``, ``inference_drop``) and, with vLLM tracing, a
    ``vllm_request`` span per request as vLLM traced it (handed over when its step is logged).

    The driver hands over the events of one turn of its event loop at once (a run makes four
    per sample: one call per event cost a 64-server driver a fifth of its time, ``bench/scale.py``);
    each event's ``time`` is when it happened, not when it was handed over.

    Args:
        events: the ``TimelineEvent`` records, oldest first; ``step`` is the 1-based step each
            belongs to.
    """


@hookspec
def telescope_step_end(step: int, metrics: dict[str, float], rollouts: list[RolloutRecord]) -> None:
    """Called after every training step, once its metrics are final.

    Args:
        step: the 1-based step that just finished.
        metrics: that step's metrics (flat ``section/group/metric`` keys): trainer, weight
            sync, batch, timing, rollout (``reward/mean``, ``discarded/<reason>/count`` ...)
            and throughput metrics.
        rollouts: one ``RolloutRecord`` per rollout of the groups reported for ``step``
            (``telescope_group_end``): kept, discarded and cancelled ones.
    """


@hookspec
def telescope_eval_end(step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
    """One eval finished: its scores and per-sample rows (``evals/`` in the run directory).

    Args:
        step: the trainer step whose weights were evaluated (0 = before training).
        name: the eval's name (an ``evals`` entry).
        metrics: its scores, e.g. ``{"pass@1": 0.4, "avg@2": 0.35}``.
        rows: one dict per evaluated sample (prompt, completion, reward, ...).
    """


@hookspec
def telescope_system_sample(sample: dict[str, Any]) -> None:
    """One system-metrics sample (``system.jsonl`` in the run directory).

    Called from background threads (the CPU/GPU sampler every
    ``system_metrics_collection_interval_seconds``, the vLLM ``/metrics`` scraper, the
    trainers' torch-memory drain), not from the event loop: an implementation that keeps
    state shared with other hooks needs a lock. Unlike the other hooks, an exception here
    does not end the run: the sampling thread logs it and goes on (a monitoring hiccup
    should not stop training).

    Args:
        sample: ``{"time", "node", "source", "metrics": {name: value}}``.
    """


@hookspec
def telescope_warning(message: str) -> None:
    """Something the user should see while the run goes on (e.g. a checkpoint that failed
    with ``checkpoint_failure: warn``). The console shows it; the run directory records it.

    Args:
        message: one line that names the problem and what happens next.
    """


@hookspec
def telescope_run_end(status: str, error: BaseException | None) -> None:
    """Called once when a run ends, however it ends, after its processes stopped.

    The run's ``LoggerHub`` finishes after every plugin's call: ``run.json`` gets its final status
    then (a plugin raising here turns a completed run into a failed one), so a plugin reading the
    run directory here sees it not yet finished; ``status`` is the ending. Each plugin is called
    on its own; one that raises is reported naming it and this hook, and never replaces the run's
    own error (a run that had completed ends failed instead).

    Args:
        status: ``"completed"``, ``"interrupted"`` or ``"failed"``.
        error: the root-cause exception when ``status == "failed"``, else ``None``.
    """
