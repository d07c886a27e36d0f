"""``telescope checkpoint convert CKPT --out DIR``: native checkpoints -> Hugging Face folders.

``CKPT`` is one checkpoint (``step_<N>``, written to ``DIR``) or a folder of them (each
committed ``step_<N>`` goes to ``DIR/step_<N>``; outputs that already exist are skipped).
Bad input (an HF folder, a missing path, an existing output without ``--overwrite``, a
conversion that is not implemented) prints one message and exits with code 2.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

from telescope.cli.errors import debug_enabled, err_console, escape, say
from telescope.cli.style import new_app

__all__ = ["app", "convert"]

app = new_app(help="Work with training checkpoints.", no_args_is_help=True)
console = Console(highlight=False)


@app.callback()
def _checkpoint() -> None:
    """Work with training checkpoints (a callback keeps ``convert`` a subcommand)."""


def _fail(message: str, debug: bool) -> typer.Exit:
    if debug:
        err_console.print_exception()
    say("error:", message)
    return typer.Exit(code=2)


@app.command("convert")
def convert(
    ckpt: Path = typer.Argument(..., help="A checkpoint folder (step_N) or a folder of checkpoints."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output folder (for a folder of checkpoints: one step_N each)."
    ),
    max_shard_size: str = typer.Option(
        "5GB", "--max_shard_size", "--max-shard-size", help="Largest safetensors file, e.g. 5GB, 500MB."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace outputs that already exist."),
    merge: bool = typer.Option(
        False,
        "--merge",
        help="LoRA checkpoints: write the base model with the adapters merged in "
        "(default: a PEFT adapter folder).",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Convert native checkpoints to Hugging Face format (safetensors, config, tokenizer)."""
    from telescope.core.checkpoint import is_native_checkpoint
    from telescope.core.checkpoint.convert import (
        ConversionError,
        ConvertResult,
        convert_all,
        convert_checkpoint,
    )

    debug = debug_enabled(debug)

    def report(result: ConvertResult) -> None:
        verb = "exists, skipped" if result.skipped else "converted"
        console.print(f"  {escape(result.src.name)} -> {escape(str(result.out))}  [dim]({verb})[/]")

    start = time.perf_counter()
    try:
        if is_native_checkpoint(ckpt):
            console.print(f"converting {ckpt} ...", markup=False)
            path = convert_checkpoint(
                ckpt, out, max_shard_size=max_shard_size, overwrite=overwrite, merge=merge
            )
            console.print(f"wrote {path} in {time.perf_counter() - start:.1f} s", markup=False)
            return
        console.print(f"converting every checkpoint under {ckpt} ...", markup=False)
        results = convert_all(
            ckpt, out, max_shard_size=max_shard_size, overwrite=overwrite, on_checkpoint=report, merge=merge
        )
    except (ConversionError, NotImplementedError, FileNotFoundError) as exc:
        raise _fail(str(exc), debug) from None
    except ImportError as exc:
        raise _fail(
            f"checkpoint conversion needs torch, safetensors and transformers ({exc}); "
            "pip install telescope-fsdp",
            debug,
        ) from None
    done = sum(not r.skipped for r in results)
    console.print(f"{done} converted, {len(results) - done} skipped, in {time.perf_counter() - start:.1f} s")
