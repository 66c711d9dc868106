"""The code version a result was made with: the package version and, in a git checkout, the
commit and whether the working tree had uncommitted changes."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any


@lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """``{"package": "0.1.0", "commit": "<sha>" | None, "dirty": bool | None}``: the commit and
    dirtiness of the git checkout the package was imported from (None outside one)."""
    try:
        package = metadata.version("dreamgym-agents")
    except metadata.PackageNotFoundError:
        package = "unknown"
    root = Path(__file__).resolve().parent.parent
    commit: str | None = None
    dirty: bool | None = None
    try:
        commit = _git(root, "rev-parse", "HEAD")
        # untracked run folders and caches do not make the code dirty
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        commit = dirty = None
    return {"package": package, "commit": commit, "dirty": dirty}


def describe(version: dict[str, Any]) -> str:
    """``4f3a2b1`` / ``4f3a2b1+dirty`` / ``0.1.0`` (no checkout)."""
    if not version.get("commit"):
        return str(version.get("package", "unknown"))
    return str(version["commit"])[:7] + ("+dirty" if version.get("dirty") else "")


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                         timeout=10, check=True)
    return out.stdout.strip()
