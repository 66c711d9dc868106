"""A family nobody in this repository shaped: a tally to bring to a target, written against
:class:`~dreamgym_agents.episodes.env.FamilyBase` with only its five required hooks, and
registered at run time (``conftest.py``). The contract suites run on it as on the shipped
families: the seam is what a stranger can implement.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from dreamgym_agents.episodes.agent import Decision
from dreamgym_agents.episodes.env import Observation, StepResult
from dreamgym_agents.episodes.family_base import FamilyBase
from dreamgym_agents.types import Task


@dataclass(frozen=True)
class TallyAction:
    verb: str
    amount: int = 0

    @property
    def is_terminal(self) -> bool:
        return self.verb == "submit"

    @property
    def answer(self) -> str | None:
        return None


class TallyActions:
    def describe(self) -> str:
        return "add N (N from 1 to 3) | submit"

    def parse(self, text: str) -> list[TallyAction]:
        found = re.fullmatch(r"\s*(?:add (\d+)|(submit))\s*", text)
        if not found:
            raise ValueError(f"expected 'add N' or 'submit', got {text!r}")
        return [TallyAction("submit")] if found.group(2) else [TallyAction("add", int(found[1]))]


class TallyEnv:
    provenance = "real"

    def __init__(self) -> None:
        self.action_set = TallyActions()
        self.task: Task | None = None
        self.value = 0

    def _state(self) -> str:
        return f"Task: {self.task.intent}\nValue: {self.value}"

    def reset(self, task: Task) -> Observation:
        self.task, self.value = task, 0
        return Observation(state=self._state())

    def step(self, action: str) -> StepResult:
        try:
            (act,) = self.action_set.parse(action)
            if act.verb == "add" and not 1 <= act.amount <= 3:
                raise ValueError(f"add takes 1 to 3, not {act.amount}")
        except ValueError as exc:
            return StepResult(Observation(self._state(), error=str(exc)), valid=False,
                              error=str(exc))
        if act.verb == "submit":
            won = self.value == self.task.config["target"]
            return StepResult(Observation(self._state()), reward=float(won), done=True,
                              success=won)
        self.value += act.amount
        return StepResult(Observation(self._state()))

    def close(self) -> None:
        pass


class TallyOracle:
    name = "oracle"

    async def act(self, task, observation, history, episode_id):
        value = int(observation.state.rsplit("Value: ", 1)[1])
        gap = task.config["target"] - value
        return Decision(action="submit" if gap <= 0 else f"add {min(gap, 3)}")


class TallyRandom:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    async def act(self, task, observation, history, episode_id):
        rng = random.Random(f"{self.seed}|{episode_id}|{len(history)}")
        return Decision(action=rng.choice(["add 1", "add 2", "add 3", "submit"]))


class TallyFamily(FamilyBase):
    name = "tally"

    def load_tasks(self, split: str) -> list[Task]:
        first = {"train": 0, "validation": 20, "test": 30}[split]
        return [Task(f"tally-{n}", "tally", f"bring the tally to {4 + n % 7}", split,
                     {"target": 4 + n % 7}) for n in range(first, first + 10)]

    def make_env(self, cfg) -> TallyEnv:
        return TallyEnv()

    def action_set(self) -> TallyActions:
        return TallyActions()

    def offline_agents(self, seed: int = 0, noise: float = 0.3) -> dict:
        return {"oracle": TallyOracle(), "random": TallyRandom(seed)}
