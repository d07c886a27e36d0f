"""``telescope envs list``: environments and evals, their kwargs and missing dependencies."""

from __future__ import annotations

import importlib
import json
from importlib.util import find_spec
from typing import Any

import typer
from pydantic_core import PydanticUndefined
from rich.console import Console
from rich.markup import escape

from telescope.cli.commands.env_check import check
from telescope.cli.errors import user_errors
from telescope.cli.style import new_app
from telescope.core.plugins import load_plugins
from telescope.core.registry import Component

__all__ = ["app", "environment_listing"]

app = new_app(help="Inspect environments and evals.", no_args_is_help=True)


@app.callback()
def _envs() -> None:
    """Inspect environments and evals (a group even with one command: ``telescope envs list``)."""


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _kwargs_table(component: Component) -> list[dict[str, Any]]:
    model = component.kwargs_model
    if model is None:
        return []
    rows = []
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default: Any = field.default_factory()  # type: ignore[call-arg]
        else:
            default = None if field.default is PydanticUndefined else field.default
        rows.append(
            {
                "name": name,
                "type": _type_name(field.annotation),
                "default": default,
                "required": field.is_required(),
                "description": field.description or "",
            }
        )
    return rows


def _missing_optional(meta: dict[str, Any]) -> list[str]:
    """Optional packages (pip names) whose modules are not importable here."""
    return [pkg for pkg in meta.get("optional", []) if find_spec(pkg.replace("-", "_")) is None]


def _choices(comp: Component) -> dict[str, list[str]]:
    """The values a kwarg takes here, from the component's ``choices`` meta (``{kwarg: "module:function"}``,
    called only for an available component: it may import the library it lists)."""
    if not comp.available:
        return {}
    out = {}
    for kwarg, source in dict(comp.meta.get("choices") or {}).items():
        module, _, attr = str(source).partition(":")
        try:
            out[kwarg] = [str(v) for v in getattr(importlib.import_module(module), attr)()]
        except Exception as exc:  # noqa: BLE001 - a listing never fails because one library is broken
            out[kwarg] = [f"(cannot list: {type(exc).__name__}: {exc})"]
    return out


def environment_listing() -> list[dict[str, Any]]:
    """One entry per environment and eval (the ``--json`` payload)."""
    _, registry = load_plugins()
    out = []
    for kind in ("environment", "eval"):
        for comp in registry.components(kind):
            meta = dict(comp.meta)
            missing = _missing_optional(meta)
            out.append(
                {
                    "name": comp.name,
                    "kind": kind,
                    "turns": "multi" if meta.get("multi_turn") else "single",
                    "description": comp.description,
                    "plugin": comp.plugin.name,
                    "distribution": comp.plugin.distribution,
                    "available": comp.available,
                    "unavailable": comp.unavailable,
                    "install": meta.get("install") if not comp.available else None,
                    "requires": meta.get("requires", []),
                    "missing_optional": missing,
                    "optional_install": meta.get("optional_install") if missing else None,
                    "kwargs": _kwargs_table(comp),
                    "choices": _choices(comp),
                }
            )
    return out


def _print_entry(console: Console, e: dict[str, Any], show_kwargs: bool) -> None:
    status = "" if e["available"] else f"  [red]unavailable: {escape(str(e['unavailable']))}[/]"
    console.print(
        f"  [bold]{e['name']}[/] ({e['turns']}-turn)  {escape(e['description'])}  [dim]{e['distribution']}[/]{status}"
    )
    if e["missing_optional"]:
        console.print(
            f"      [yellow]optional, not installed: {', '.join(e['missing_optional'])}[/] "
            f"(hub datasets; install: {escape(str(e['optional_install']))})"
        )
    for kwarg, values in e["choices"].items():
        console.print(f"      {kwarg} ({len(values)}): {escape(', '.join(values))}")
    if show_kwargs:
        for k in e["kwargs"]:
            req = "required" if k["required"] else f"default {k['default']!r}"
            console.print(
                f"      {k['name']}: {escape(k['type'])} ({escape(req)})  [dim]{escape(k['description'])}[/]"
            )


@app.command("list")
@user_errors
def list_envs(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    brief: bool = typer.Option(False, "--brief", help="Names and descriptions only, no kwargs."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """List environments and evals: single/multi-turn, kwargs with types and defaults, missing deps."""
    listing = environment_listing()
    if as_json:
        typer.echo(json.dumps(listing, indent=2, default=str))
        return
    console = Console(soft_wrap=True, highlight=False)
    for kind, title in (
        ("environment", "Environments"),
        ("eval", "Evals (any environment can also be an eval)"),
    ):
        entries = [e for e in listing if e["kind"] == kind]
        console.print(f"[bold underline]{title}[/] ({len(entries)})")
        for e in entries:
            _print_entry(console, e, show_kwargs=not brief)


app.command("check")(check)
