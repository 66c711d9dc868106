"""The on-disk cache of built models and data (``$DG_CACHE_DIR`` or
``~/.cache/dreamgym-agents``) and the lock that lets one process build an entry while another
waits for it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """Where built models live: ``$DG_CACHE_DIR`` or ``~/.cache/dreamgym-agents``."""
    return Path(os.environ.get("DG_CACHE_DIR") or Path.home() / ".cache" / "dreamgym-agents")



@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a second process waits for the first build
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks (bundles and imported models record it)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
