"""Shared fixtures: a scripted text environment, and markers' skip reasons."""

from __future__ import annotations

import os
import shutil

import pytest
from stranger_family import TallyFamily

from dreamgym_agents.episodes.env import Observation, StepResult, register_family
from dreamgym_agents.types import Task

register_family("tally", TallyFamily)  # a family the repository does not ship (its suites run it)


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test``), each worker's torch computes with its share of the
    cores: torch's own default, every core in every worker, oversubscribes the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1 and not os.environ.get("DG_TORCH_THREADS"):
        os.environ["DG_TORCH_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


_share_the_cores()


def has_chromium() -> bool:
    return bool(os.environ.get("DG_CHROMIUM") or shutil.which("chromium")
                or shutil.which("chromium-browser") or os.path.exists("/usr/bin/chromium"))


def pytest_collection_modifyitems(config, items):  # noqa: D103 - pytest hook
    skip_browser = pytest.mark.skip(reason="no Chromium on this machine (apt-get install chromium)")
    for item in items:
        if "browser" in item.keywords and not has_chromium():
            item.add_marker(skip_browser)


class CounterActions:
    """Action set of :class:`CounterEnv`: ``inc``, ``dec`` or ``stop [n]``."""

    def describe(self) -> str:
        return "inc | dec | stop [n]"

    def parse(self, text: str) -> tuple[str, int | None]:
        text = text.strip()
        if text in ("inc", "dec"):
            return text, None
        if text.startswith("stop [") and text.endswith("]"):
            return "stop", int(text[6:-1])
        raise ValueError(f"expected inc, dec or stop [n], got {text!r}")


class CounterEnv:
    """A tiny deterministic environment: reach ``task.config['target']`` and say it."""

    provenance = "real"

    def __init__(self) -> None:
        self.action_set = CounterActions()
        self.value = 0
        self.task: Task | None = None
        self.closed = False
        self.resets = 0

    def _obs(self, error: str = "") -> Observation:
        state = f"[1] button 'inc'\n[2] button 'dec'\nStaticText 'value {self.value}'"
        return Observation(state=state, error=error)

    def reset(self, task: Task) -> Observation:
        self.task, self.value = task, 0
        self.resets += 1
        return self._obs()

    def step(self, action: str) -> StepResult:
        try:
            op, n = self.action_set.parse(action)
        except ValueError as exc:
            return StepResult(self._obs(str(exc)), valid=False, error=str(exc))
        if op == "stop":
            ok = n == self.task.config["target"]
            return StepResult(self._obs(), reward=float(ok), done=True, success=ok)
        self.value += 1 if op == "inc" else -1
        return StepResult(self._obs())

    def close(self) -> None:
        self.closed = True


def counter_tasks(n: int) -> list[Task]:
    return [Task(task_id=str(i), family="counter", intent=f"reach {i % 3}", split="test",
                 config={"target": i % 3}) for i in range(n)]


@pytest.fixture
def counter_env_factory():
    made: list[CounterEnv] = []

    def make() -> CounterEnv:
        env = CounterEnv()
        made.append(env)
        return env

    make.made = made
    return make
