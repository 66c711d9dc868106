"""``dg-agents doctor``: what is installed, what is missing and how to get it.

API keys are reported as set or not set, never with their values; site URLs are shown without
any credentials they may embed.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import urllib.parse

EXTRAS: tuple[tuple[str, str, str], ...] = (
    ("browsergym-core", "browsergym.core", "web"),
    ("playwright", "playwright", "web"),
    ("torch", "torch", "train"),
    ("transformers", "transformers", "train"),
    ("trl", "trl", "train"),
    ("peft", "peft", "train"),
    ("datasets", "datasets", "train"),
)
"""(distribution, import name, extra that installs it)."""

API_KEYS: tuple[str, ...] = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "AZURE_API_KEY", "MISTRAL_API_KEY",
    "GROQ_API_KEY", "TOGETHERAI_API_KEY", "OPENROUTER_API_KEY", "DEEPSEEK_API_KEY", "HF_TOKEN",
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _public_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def chromium_report() -> tuple[bool, str]:
    """(found, one line): the Chromium BrowserGym will use, with its version."""
    from dreamgym_agents.adapters.chromium import find_chromium

    path = find_chromium()
    if path is None:
        return False, ("not found: install one (Debian/Ubuntu: apt-get install chromium) or set "
                       "DG_CHROMIUM=/path/to/chrome")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
        version = out.stdout.strip() or out.stderr.strip().splitlines()[-1]
    except (OSError, subprocess.TimeoutExpired, IndexError) as exc:
        return False, f"{path} does not start ({exc})"
    return True, f"{path} ({version})"


def bundle_report() -> str:
    """One line: the embedded bundle runs use, and whether it is this code's."""
    from dreamgym_agents.bundle import shipped_bundle
    from dreamgym_agents.embedded import EmbeddedRecipe
    from dreamgym_agents.errors import ConfigError

    try:
        bundle = shipped_bundle()
    except ConfigError as exc:
        return f"[red]{exc}"
    if bundle is None:
        return "[yellow]none: the defaults are built on first use (~2 h on 2 cores)"
    stale = "" if bundle.experience_key == EmbeddedRecipe().key else \
        " [red](stale: this code's recipe differs; rebuild with dg-agents build-embedded)"
    return f"[green]{bundle.id}[/] ({bundle.manifest['bytes'] / 1e6:.0f} MB){stale}"


def run_doctor() -> int:
    """Print the report; return 0 when the main job (a web eval) can run, 1 otherwise."""
    from rich.console import Console
    from rich.table import Table

    from dreamgym_agents import __version__
    from dreamgym_agents.adapters.webarena import SITE_VARIABLES, configured_sites

    console = Console()
    ok = True
    table = Table(title=f"dreamgym-agents {__version__} (Python {sys.version.split()[0]})")
    table.add_column("check")
    table.add_column("status")
    found, line = chromium_report()
    ok &= found
    table.add_row("chromium", ("[green]" if found else "[red]") + line)
    for dist, _module, extra in EXTRAS:
        version = _version(dist)
        if version is None and extra == "web":
            ok = False
        table.add_row(
            f"{dist} [{extra}]",
            f"[green]{version}" if version else f"[yellow]missing: pip install "
            f"'dreamgym-agents[{extra}]'",
        )
    table.add_row("embedded bundle", bundle_report())
    for key in API_KEYS:
        table.add_row(key, "[green]set" if os.environ.get(key) else "not set")
    sites = configured_sites()
    for variable in SITE_VARIABLES.values():
        url = sites.get(variable)
        table.add_row(f"site {variable}", _public_url(url) if url else "not set (bundled site)"
                      if variable == "SHOPPING" else "not set")
    console.print(table)
    if not ok:
        console.print("[red]the web environment cannot run: install what is marked above")
    return 0 if ok else 1
