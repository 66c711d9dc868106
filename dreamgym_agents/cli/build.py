"""``dg-agents build-embedded`` and ``dg-agents bundle``: make and inspect the embedded bundle
(no logic here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dreamgym_agents.cli.common import ConfigOpt, SetOpt, TaskOpt, VerboseOpt
from dreamgym_agents.cli.output import make_console, progress_reporter, setup_logging
from dreamgym_agents.errors import ConfigError


def build_embedded_command(
    out: Annotated[Path, typer.Option("--out", help="Build folder (resumable); the bundle is "
                                      "written to OUT/bundle.")],
    time_budget_s: Annotated[
        float | None, typer.Option("--time-budget-s", min=1.0,
                                   help="Stop after this many seconds: what was trained is kept "
                                        "but marked partial, no bundle is written, exit 3.")
    ] = None,
    reuse_episodes: Annotated[
        Path | None, typer.Option("--reuse-episodes",
                                  help="A bundle (or a build folder) whose episodes this build "
                                       "would play again: they are resumed, not replayed "
                                       "(same episode settings only).")
    ] = None,
    task: TaskOpt = "webarena",
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Make a task family's embedded bundle from nothing with its recipe: collect on its train
    split, train the experience model, demonstrate, warm-start the policy, package, measure
    (fidelity, the warm start's test success). How the shipped bundles were made; rerun the
    same command to resume. Ship it: copy OUT/bundle to bundles/<family>/.
    """
    from dreamgym_agents.config import load_config
    from dreamgym_agents.pipeline.bundle import MANIFEST_FILE, Bundle
    from dreamgym_agents.pipeline.bundle_build import BuildConfig, build_embedded

    setup_logging(verbose)
    cfg = load_config(BuildConfig(), config, overrides)
    source = None
    if reuse_episodes is not None:
        built = reuse_episodes / "bundle"
        source = Bundle.open(built if (built / MANIFEST_FILE).is_file() else reuse_episodes)
    with progress_reporter() as reporter:
        bundle = build_embedded(cfg, out, reporter, family=task.split(".", 1)[0],
                                time_budget_s=time_budget_s, reuse=source)
        reporter.say(f"bundle {bundle.id}: {bundle.root} "
                     f"({bundle.manifest['bytes'] / 1e6:.1f} MB)")
    figures = bundle.manifest.get("figures", {})
    print(json.dumps({"bundle": str(bundle.root), "id": bundle.id,
                      "fidelity": figures.get("fidelity"),
                      "warm_start": {k: v for k, v in figures.get("warm_start", {}).items()
                                     if k != "solved"}}))


def bundle_command(
    path: Annotated[
        Path | None, typer.Argument(help="A bundle folder [the one dg-agents uses].")
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check every file's sha256 against the manifest.")
    ] = False,
    task: TaskOpt = "webarena",
) -> None:
    """Show a family's embedded bundle: what it is, how it was built, what was measured on it."""
    from dreamgym_agents.pipeline.bundle import Bundle, shipped_bundle

    bundle = Bundle.open(path) if path else shipped_bundle(task.split(".", 1)[0])
    if bundle is None:
        raise ConfigError(f"no embedded bundle for {task}: this package ships none and "
                          "DG_BUNDLE does not name one (make one with dg-agents "
                          f"build-embedded --task {task})")
    m = bundle.manifest
    console = make_console()
    built = m["built"]
    console.print(f"[bold]{bundle.id}[/] at {bundle.root} ({m['bytes'] / 1e6:.1f} MB, weights "
                  f"{m['weights_dtype']})")
    console.print(f"  built {built['date']} at commit {built.get('commit') or '?'}"
                  f"{' (dirty)' if built.get('dirty') else ''} on {built['machine']}")
    console.print(f"  trained on the {m['split']['trained_on']} split; experience recipe "
                  f"v{m['experience']['recipe_version']} ({m['experience']['key']}), warm start "
                  f"v{m['warm_start']['version']} ({m['warm_start']['key']})")
    for name, figures in m.get("figures", {}).items():
        shown = {k: v for k, v in figures.items() if k not in ("solved", "command")}
        console.print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    if verify:
        bad = bundle.verify()
        if bad:
            raise ConfigError(f"bundle {bundle.root}: {len(bad)} file(s) differ from the "
                              f"manifest: {', '.join(bad[:3])}")
        console.print(f"  {len(m['files'])} files match the manifest")


def register(app: typer.Typer) -> None:
    app.command("build-embedded")(build_embedded_command)
    app.command("bundle")(bundle_command)
