"""``dg-agents doctor``: what is installed, what is missing and how to get it.

API keys are reported as set or not set, never with their values; site URLs are shown without
any credentials they may embed.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import urllib.parse

EXTRAS: tuple[tuple[str, str, str], ...] = (
    ("torch", "torch", "train"),
    ("transformers", "transformers", "train"),
    ("trl", "trl", "train"),
    ("peft", "peft", "train"),
    ("datasets", "datasets", "train"),
)
"""(distribution, import name, extra that installs it): what the core uses beyond its base
dependencies (each family reports its own in ``requirements``)."""

API_KEYS: tuple[str, ...] = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "AZURE_API_KEY", "MISTRAL_API_KEY",
    "GROQ_API_KEY", "TOGETHERAI_API_KEY", "OPENROUTER_API_KEY", "DEEPSEEK_API_KEY", "HF_TOKEN",
)


def dist_version(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def training_devices() -> str:
    """Where training runs, in words: the visible CUDA GPUs, or the CPU."""
    if dist_version("torch") is None:
        return "[yellow]no torch: pip install 'dreamgym-agents[train]'"
    import torch

    if not torch.cuda.is_available():
        return "cpu (no CUDA GPU visible)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"[green]cuda: {len(names)} × {names[0]}" + (
        " (several: accelerate launch, docs/GPU.md)" if len(names) > 1 else "")


def public_url(url: str) -> str:
    """``url`` without credentials, query or fragment (safe to print)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def bundle_report(family: str) -> str:
    """One line: the embedded bundle runs of ``family`` use, and whether it is this code's."""
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.pipeline.bundle import shipped_bundle
    from dreamgym_agents.pipeline.embedded import family_recipe

    try:
        bundle = shipped_bundle(family)
        recipe = family_recipe(family)
    except ConfigError as exc:
        return f"[red]{exc}"
    if bundle is None:
        return "[yellow]none: the defaults are built on first use (hours on 2 cores)"
    stale = "" if bundle.experience_key == recipe.key else \
        " [red](stale: this code's recipe differs; rebuild with dg-agents build-embedded)"
    return f"[green]{bundle.id}[/] ({bundle.manifest['bytes'] / 1e6:.0f} MB){stale}"


def run_doctor(task: str = "webarena") -> int:
    """Print the report; return 0 when family ``task`` (the CLI's default: a web eval) can run,
    1 otherwise. Every installed family is reported; only ``task``'s decides the exit code."""
    from rich.console import Console
    from rich.table import Table

    from dreamgym_agents import __version__
    from dreamgym_agents.episodes.env import family_names, make_family
    from dreamgym_agents.errors import DreamGymError

    console = Console()
    table = Table(title=f"dreamgym-agents {__version__} (Python {sys.version.split()[0]})")
    table.add_column("check")
    table.add_column("status")
    for dist, _module, extra in EXTRAS:
        version = dist_version(dist)
        table.add_row(
            f"{dist} \\[{extra}]",  # escaped: not a rich style
            f"[green]{version}" if version else f"[yellow]missing: pip install "
            f"'dreamgym-agents[{extra}]'",
        )
    table.add_row("training device", training_devices())
    vllm = dist_version("vllm")
    table.add_row("vllm \\[vllm]", f"[green]{vllm}" if vllm else
                  "not installed (optional: GRPO's rollouts on vLLM, docs/GPU.md)")
    for key in API_KEYS:
        table.add_row(key, "[green]set" if os.environ.get(key) else "not set")
    usable: dict[str, bool] = {}
    for name in family_names():
        try:
            family = make_family(name)
            try:
                rows = family.requirements()
            finally:
                family.close()
        except DreamGymError as exc:
            usable[name] = False
            table.add_row(f"family {name}", f"[red]{exc}")
            continue
        usable[name] = all(r.ok is not False for r in rows)
        table.add_row(f"{name}: embedded bundle", bundle_report(name))
        for r in rows:
            colour = {True: "[green]", False: "[red]", None: ""}[r.ok]
            table.add_row(f"{name}: {r.name}", colour + r.detail)
    console.print(table)
    family = task.split(".", 1)[0]
    if not usable.get(family, False):
        console.print(f"[red]the {family} environment cannot run: install what is marked above")
        return 1
    return 0
