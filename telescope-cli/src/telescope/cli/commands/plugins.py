"""``telescope plugins list``: every plugin, where it comes from, and what it registers."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from telescope.cli.errors import user_errors
from telescope.cli.style import new_app
from telescope.core.plugins import load_plugins
from telescope.core.registry import KINDS

app = new_app(help="Inspect installed plugins.", no_args_is_help=True)


def plugin_listing() -> list[dict[str, Any]]:
    """One entry per loaded plugin with its components by kind (the --json payload)."""
    pset, registry = load_plugins()
    out = []
    for name, info in pset.infos.items():
        comps: dict[str, list[dict[str, Any]]] = {}
        for comp in registry.components():
            if comp.plugin.name != name:
                continue
            entry: dict[str, Any] = {
                "name": comp.name,
                "description": comp.description,
                "available": comp.available,
            }
            if comp.unavailable:
                entry["unavailable"] = comp.unavailable
            comps.setdefault(comp.kind, []).append(entry)
        out.append(
            {
                "plugin": name,
                "distribution": info.distribution,
                "version": info.version,
                "module": info.module,
                "components": comps,
            }
        )
    return out


@app.command("list")
@user_errors
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """List installed plugins and the components each registers, grouped by kind."""
    listing = plugin_listing()
    if as_json:
        typer.echo(json.dumps(listing, indent=2))
        return
    console = Console(soft_wrap=True, highlight=False)
    for p in listing:
        console.print(
            f"[bold]{escape(p['plugin'])}[/]  {escape(p['distribution'])} {p['version']}  [dim]{p['module']}[/]"
        )
        if not p["components"]:
            console.print("    [dim](registers no components)[/]")
        for kind in KINDS:
            comps = p["components"].get(kind, [])
            if not comps:
                continue
            names = [
                escape(c["name"])
                if c["available"]
                else f"{escape(c['name'])} [red](unavailable: {escape(c['unavailable'])})[/]"
                for c in comps
            ]
            console.print(f"    {kind.replace('_', ' ')}: " + ", ".join(names))
