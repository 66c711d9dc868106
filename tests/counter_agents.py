"""Agents for the counter environment of conftest (used in-process and by subprocess tests)."""

from __future__ import annotations

import asyncio
import re

from dreamgym_agents.episodes.agent import Decision


class CounterSolver:
    """Increments until the target, then stops; optionally slow (to be killed mid-run)."""

    name = "counter-solver"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    async def act(self, task, observation, history, episode_id):
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        value = int(re.search(r"value (-?\d+)", observation.state).group(1))
        target = task.config["target"]
        action = f"stop [{value}]" if value == target else "inc"
        return Decision(action=action, reasoning=f"value {value}, target {target}")


class Babbler:
    """Answers garbage first: the environment must record an invalid step, not crash."""

    name = "babbler"

    async def act(self, task, observation, history, episode_id):
        return Decision(action="dance wildly" if not history else "stop [0]")
