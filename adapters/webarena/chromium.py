"""Run BrowserGym (and plain Playwright) on the system Chromium.

Playwright cannot download its own browser on machines without internet, so every launch must
name an ``executable_path`` and, when running as root in a container, a few flags. BrowserGym
0.14 launches *two* browsers per environment (the page and its chat window) through the shared
Playwright object returned by ``browsergym.core._get_global_playwright()``, and passing ``args``
through its ``pw_chromium_kwargs`` raises a ``TypeError``; so the fix is to wrap ``launch`` of the
Playwright ``chromium`` browser type itself.

Threads: a sync Playwright instance (and every browser, page and locator it creates) may only be
used from the thread that started it. BrowserGym keeps one module-level instance, which breaks as
soon as two threads run environments. :func:`patch_browsergym_launch` therefore replaces
BrowserGym's getter with a thread-local one: each thread lazily starts its own sync Playwright,
patched with :func:`patch_playwright`, on its first ``env.reset()``. Call
:func:`stop_thread_playwright` at the end of a worker thread (after closing its environments) to
stop that thread's driver.

Typical use::

    exe = find_chromium()
    patch_browsergym_launch(exe)          # once, before any BrowserGym env is reset
    # ... or, with a Playwright instance of your own:
    with sync_playwright() as pw:
        patch_playwright(pw, exe)
        browser = pw.chromium.launch()
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
from typing import Any

from dreamgym_agents.errors import EnvError, MissingExtraError

logger = logging.getLogger(__name__)

CHROMIUM_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
)
"""Launch flags that work headless as root in a container without network."""

_CANDIDATES: tuple[str, ...] = ("chromium", "chromium-browser", "google-chrome")
_FALLBACK = "/usr/bin/chromium"
_PATCH_MARK = "_dreamgym_patched"

_local = threading.local()
_patch_lock = threading.Lock()
_browsergym_executable: str | None = None


def find_chromium() -> str | None:
    """Locate a Chromium executable.

    Looks at the ``DG_CHROMIUM`` environment variable first, then ``chromium``,
    ``chromium-browser`` and ``google-chrome`` on ``PATH``, then ``/usr/bin/chromium``.

    Returns:
        The path, or None when no browser was found.
    """
    env_value = os.environ.get("DG_CHROMIUM", "").strip()
    if env_value:
        found = shutil.which(env_value) or (env_value if os.path.isfile(env_value) else None)
        if found:
            return found
        logger.warning("DG_CHROMIUM=%s is not an executable; searching PATH", env_value)
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    if os.path.isfile(_FALLBACK) and os.access(_FALLBACK, os.X_OK):
        return _FALLBACK
    return None


def require_chromium() -> str:
    """Like :func:`find_chromium`, but raise :class:`EnvError` with a fix when none is found."""
    exe = find_chromium()
    if exe is None:
        raise EnvError(
            "no Chromium found: install it (apt-get install -y chromium) or set DG_CHROMIUM "
            "to the browser executable"
        )
    return exe


def _merge_args(given: Any, extra: tuple[str, ...]) -> list[str]:
    """Append the flags of ``extra`` that ``given`` does not already contain."""
    args = list(given or [])
    for flag in extra:
        if flag not in args:
            args.append(flag)
    return args


def patch_playwright(pw: Any, executable: str, *, args: tuple[str, ...] = CHROMIUM_ARGS) -> Any:
    """Make every ``pw.chromium.launch(...)`` of one Playwright instance use ``executable``.

    The wrapper sets ``executable_path`` (unless the caller gave one) and appends ``args`` to the
    caller's flags. It is installed on this instance's ``chromium`` object only, so other
    Playwright instances (other threads) are unaffected; patching twice is a no-op.

    Args:
        pw: A ``playwright.sync_api.Playwright`` instance.
        executable: Path of the Chromium executable.
        args: Extra command-line flags for every launch.

    Returns:
        ``pw`` itself, for chaining.
    """
    browser_type = pw.chromium
    if getattr(browser_type, _PATCH_MARK, False):
        return pw
    original = browser_type.launch

    @functools.wraps(original)
    def launch(*a: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("executable_path", executable)
        kwargs["args"] = _merge_args(kwargs.get("args"), args)
        return original(*a, **kwargs)

    browser_type.launch = launch
    setattr(browser_type, _PATCH_MARK, True)
    return pw


def thread_playwright() -> Any:
    """Return this thread's sync Playwright instance, starting (and patching) it on first use.

    Used as BrowserGym's ``_get_global_playwright`` once :func:`patch_browsergym_launch` ran.
    """
    pw = getattr(_local, "pw", None)
    if pw is None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise MissingExtraError("playwright", "web") from None
        pw = sync_playwright().start()
        executable = _browsergym_executable or require_chromium()
        patch_playwright(pw, executable)
        _local.pw = pw
        logger.debug("started Playwright for thread %s", threading.current_thread().name)
    return pw


def stop_thread_playwright() -> None:
    """Stop this thread's Playwright instance, if one was started (close its envs first)."""
    pw = getattr(_local, "pw", None)
    if pw is not None:
        _local.pw = None
        pw.stop()


def patch_browsergym_launch(executable: str) -> None:
    """Make every BrowserGym launch (env page and chat window) use ``executable`` and flags.

    Replaces BrowserGym's global-Playwright getter (in ``browsergym.core`` and in the modules that
    imported it by name) with :func:`thread_playwright`, so each thread gets its own patched
    Playwright instance. Idempotent; a later call changes the executable for instances started
    afterwards.

    Args:
        executable: Path of the Chromium executable (see :func:`find_chromium`).

    Raises:
        MissingExtraError: BrowserGym is not installed.
    """
    global _browsergym_executable
    try:
        import browsergym.core as bg_core
        import browsergym.core.chat as bg_chat
        import browsergym.core.env as bg_env
    except ImportError:
        raise MissingExtraError("browsergym-core", "web") from None
    with _patch_lock:
        _browsergym_executable = executable
        for module in (bg_core, bg_env, bg_chat):
            if getattr(module, "_get_global_playwright", None) is not thread_playwright:
                module._get_global_playwright = thread_playwright
    # An instance BrowserGym may already have started in this thread keeps working, patched.
    existing = getattr(bg_core, "_PLAYWRIGHT", None)
    if existing is not None and getattr(_local, "pw", None) is None:
        patch_playwright(existing, executable)
