"""ALFWorld's offline agents: the expert (the planner's plan), a noisy expert and a random agent.

They read what the environment offers in ``Observation.info``: ``admissible`` (the commands the
game accepts) and, when the environment plays with its expert, ``expert_plan`` (the plan from the
current state, replanned when the agent leaves it).
"""

from __future__ import annotations

import random
from typing import Any

from dreamgym_agents.episodes.agent import EXPLORATION, Decision
from dreamgym_agents.episodes.env import Observation
from dreamgym_agents.types import Task, Transition


class ExpertAgent:
    """Plays the first command of the expert's plan (needs an environment with its expert)."""

    name = "oracle"
    needs_expert = True

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        plan = observation.info.get("expert_plan") or []
        if not plan:  # nothing left to do (or no expert): look, a harmless step
            return Decision(action="look", reasoning="no expert plan from here")
        return Decision(action=str(plan[0]), reasoning="the expert's next command")


class NoisyExpertAgent:
    """The expert, but with probability ``noise`` a random admissible command instead (a detour
    the expert then recovers from: its reasoning says so, and the warm start does not imitate
    it)."""

    name = "noisy"
    needs_expert = True

    def __init__(self, seed: int = 0, noise: float = 0.3) -> None:
        self.seed = seed
        self.noise = noise
        self.expert = ExpertAgent()

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        options = list(observation.info.get("admissible") or [])
        rng = random.Random(f"noise|{self.seed}|{episode_id}|{len(history)}")
        if options and rng.random() < self.noise:
            return Decision(action=rng.choice(options),
                            reasoning=f"{EXPLORATION}: a random command")
        return await self.expert.act(task, observation, history, episode_id)


class RandomAgent:
    """A uniformly random admissible command: the floor."""

    name = "random"
    needs_expert = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        # seeded by the episode and the step: a resumed or concurrent run repeats itself
        rng = random.Random(f"{self.seed}|{episode_id}|{len(history)}")
        options = list(observation.info.get("admissible") or ["look"])
        return Decision(action=rng.choice(options), reasoning="random")


def offline_agents(seed: int = 0, noise: float = 0.3) -> dict[str, Any]:
    """The family's offline agents by name (``--agent oracle`` …)."""
    return {"oracle": ExpertAgent(), "noisy": NoisyExpertAgent(seed=seed, noise=noise),
            "random": RandomAgent(seed=seed)}
