"""Checks before anything starts: settings that cannot work together are refused, never ignored."""

from __future__ import annotations

from telescope.core.config import ConfigError, TelescopeConfig

__all__ = ["check_supported", "unsupported_problems"]


def unsupported_problems(cfg: TelescopeConfig) -> list[str]:
    """Settings this run cannot honour (each names the fix)."""
    from telescope.core.inference.settings import num_servers

    problems = []
    servers = num_servers(cfg)
    periodic = bool(cfg.evals) and cfg.eval_num_servers > 0
    if periodic and cfg.eval_num_servers >= servers:
        problems.append(
            f"eval_num_servers: {cfg.eval_num_servers} leaves no server for training rollouts (the run has "
            f"{servers} inference server(s)); use at most {servers - 1}, add servers (inference_num_workers), "
            "or set eval_num_servers: 0 to run only the evals before and after training"
        )
    if cfg.evals and cfg.eval_num_servers == 0 and not cfg.eval_start_end_use_all_servers:
        problems.append(
            "evals are configured but no server may run them (eval_num_servers: 0 and "
            "eval_start_end_use_all_servers: false); set eval_num_servers >= 1 or "
            "eval_start_end_use_all_servers: true"
        )
    if cfg.use_wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            problems.append(
                "use_wandb: true but wandb is not installed; `pip install wandb` or set use_wandb: false"
            )
    return problems


def check_supported(cfg: TelescopeConfig) -> None:
    """Raise ``ConfigError`` listing every setting that cannot work."""
    problems = unsupported_problems(cfg)
    if problems:
        raise ConfigError(problems)
