"""The web family's own CLI commands (registered through the ``dreamgym_agents.commands`` entry
point): ``dg-agents site`` serves the bundled shopping site."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from dreamgym_agents.errors import DreamGymError


def register(app: typer.Typer) -> None:
    app.command("site")(site_command)


def site_command(
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 7770,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Serve the bundled shopping site (WebArena's SHOPPING) until interrupted."""
    from dreamgym_agents.adapters.shopping.server import ShoppingSite

    site = ShoppingSite(seed=seed)
    try:
        root = site.start(host=host, port=port)
    except OSError as exc:
        raise DreamGymError(f"cannot serve on {host}:{port}: {exc.strerror}") from None
    typer.echo(f"bundled shopping site at {root} (seed {seed}); Ctrl-C to stop")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()
