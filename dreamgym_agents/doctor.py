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
