"""ALFWorld's offline agents: the expert (the planner's plan), a noisy expert, a searcher that
acts on what it has seen, a decoy that first makes a near miss, and a random agent.

They read what the environment offers in ``Observation.info``: ``admissible`` (the commands the
game accepts) and, when the environment plays with its expert, ``expert_plan`` (the plan from the
current state, replanned when the agent leaves it).
"""

from __future__ import annotations

import random
from typing import Any

from dreamgym_agents.adapters.alfworld.belief import PROPERTY, TOOLS, Belief, Rules, kind_of
from dreamgym_agents.adapters.alfworld.goals import Goal
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
    """The expert, but with probability ``noise`` a random admissible command instead: a detour
    the expert then recovers from. Its reasoning says so, and the warm start does not imitate
    it."""

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


_NEEDS_TOOL = {PROPERTY[verb]: tool for tool, verb in TOOLS.items()}


class SearcherAgent:
    """An expert that knows only what it has seen: it reads the goal from the instruction and
    the state (:class:`~.belief.Belief`), looks in the receptacles it has not seen (those that
    can hold the object first), opens closed ones, takes the object, cleans, heats or cools
    it, and puts it in place (or turns on the lamp). It needs no planner and no hidden layout,
    so it plays the dream as it plays a real game: what it does in each is a closed-loop test
    of the experience model (the expert replays a plan made from the real game's layout)."""

    name = "searcher"
    needs_expert = False

    def __init__(self) -> None:
        self.rules = Rules.alfred()

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        options = list(observation.info.get("admissible") or [])
        belief = Belief.parse(observation.state)
        goal = Goal.parse(task.intent)
        command = self.choose(belief, goal) if goal else None
        if command is None or (options and command not in options):
            return Decision(action="look", reasoning=f"nothing to do ({command or 'no goal'})")
        return Decision(action=command, reasoning="searching" if command.startswith(
            ("go to", "open")) else "acting on what it has seen")

    def choose(self, b: Belief, goal: Goal) -> str | None:
        held = b.holding
        if held and kind_of(held) == goal.kind:
            if goal.needs and goal.needs not in b.properties.get(held, []):
                tool = next((r for r in b.receptacles
                             if kind_of(r) == _NEEDS_TOOL[goal.needs]), None)
                if tool is None:
                    return None
                if b.at != tool:
                    return f"go to {tool}"
                return f"{TOOLS[kind_of(tool)]} {held} with {tool}"
            if goal.lamp:
                lamp = next(((name, item) for name, place in b.places.items()
                             for item in place.items or () if kind_of(item) == goal.lamp),
                            None)
                if lamp is None:
                    return self.explore(b, goal.lamp)
                return f"use {lamp[1]}" if b.at == lamp[0] else f"go to {lamp[0]}"
            target = next((r for r in b.receptacles if kind_of(r) == goal.receptacle), None)
            if target is None:
                return None
            if b.at != target:
                return f"go to {target}"
            if b.places.get(target) and b.places[target].status == "closed":
                return f"open {target}"
            return f"move {held} to {target}"
        if held:  # something else: put it down here
            return f"move {held} to {b.at}" if b.at else None
        placed = {item for name, place in b.places.items() if kind_of(name) == goal.receptacle
                  for item in place.items or ()}
        seen = [(name, item) for name, place in b.places.items()
                if place.status != "closed" and kind_of(name) != goal.receptacle
                for item in place.items or () if kind_of(item) == goal.kind
                and item not in placed]
        here = [item for name, item in seen if name == b.at]
        if here:
            return f"take {here[0]} from {b.at}"
        if seen:
            return f"go to {seen[0][0]}"
        return self.explore(b, goal.kind)

    def explore(self, b: Belief, kind: str) -> str | None:
        """Open what is closed here, else go to the next receptacle not seen inside: those that
        can hold ``kind`` first, surfaces before what must be opened (one step, not two), then
        the room's order."""
        here = b.places.get(b.at)
        if b.at and here is not None and here.status == "closed":
            return f"open {b.at}"
        unseen = [r for r in b.receptacles if r != b.at and
                  (r not in b.places or b.places[r].items is None)]
        unseen.sort(key=lambda r: (kind not in self.rules.can_contain.get(kind_of(r), ()),
                                   kind_of(r) in self.rules.openable))
        return f"go to {unseen[0]}" if unseen else None


class DecoyAgent:
    """A near miss first, then the expert: the steps a learning policy takes and the expert
    never does, with the game's own verdict on them.

    It reads the goal from the task and acts on what it has seen (as :class:`SearcherAgent`)
    towards a decoy of it, until the decoy's last command (a ``move`` or a ``use``), one of:

    - ``other``: another kind of object (the first it holds or sees that the goal's receptacle
      can hold) put in the goal's receptacle, or held under the goal's lamp;
    - ``elsewhere``: the goal's object put in a receptacle of another kind that can hold it;
    - ``skip`` (clean / heat / cool tasks): the goal's object put in place as it is;
    - ``lamp first`` (examine in light): the lamp turned on before anything is held.

    Then it plays the expert's plan (which the environment makes again from the new state), so
    the episode usually ends at the goal. The game scores each step: none of the decoy's moves
    meets the goal, and such near misses are what an experience model trained only on the
    expert's, a noisy expert's and a random agent's steps rewards in a learning policy's dream
    (evidence: docs/history/results-2026-11-to-12.md). With ``then="searcher"`` the second
    part is the searcher's, so the agent plays the dream too (no expert there).
    """

    name = "decoy"

    def __init__(self, seed: int = 0, then: str = "oracle") -> None:
        self.seed = seed
        self.rules = Rules.alfred()
        self.searcher = SearcherAgent()
        self.then: Any = ExpertAgent() if then == "oracle" else self.searcher
        self.needs_expert = then == "oracle"

    def mode(self, goal: Goal, episode_id: str) -> str:
        """The episode's kind of near miss (see the class docstring)."""
        draw = random.Random(f"decoy|{self.seed}|{episode_id}").random()
        if goal.lamp:
            return "other" if draw < 0.6 else "lamp first"
        if goal.needs:
            return "skip" if draw < 0.4 else "other" if draw < 0.8 else "elsewhere"
        return "other" if draw < 0.6 else "elsewhere"

    def decoy(self, goal: Goal, belief: Belief, mode: str) -> Goal | None:
        """The goal the episode pretends to have now (None: look for something first)."""
        if mode == "skip":
            return Goal(goal.kind, goal.receptacle)
        if mode == "elsewhere":
            places = sorted({kind_of(r) for r in belief.receptacles
                             if kind_of(r) != goal.receptacle and kind_of(r) not in TOOLS
                             and goal.kind in self.rules.can_contain.get(kind_of(r), ())})
            return Goal(goal.kind, places[0], needs=goal.needs) if places else goal
        # other: what it holds, else the first other object it has seen that fits the place
        def fits(kind: str) -> bool:
            return kind != goal.kind and kind not in self.rules.lamps and bool(
                goal.lamp or kind in self.rules.can_contain.get(goal.receptacle, ()))

        held = kind_of(belief.holding) if belief.holding else ""
        kind = held if held and fits(held) else next(
            (kind_of(item) for name, place in belief.places.items()
             if place.status != "closed" and kind_of(name) != goal.receptacle
             for item in place.items or () if fits(kind_of(item))), "")
        if not kind:
            return None
        return Goal(kind, goal.receptacle, lamp=goal.lamp)

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        goal = Goal.parse(task.intent)
        done = any(t.valid and t.action.startswith(("move ", "use ")) for t in history)
        if goal is None or done:
            return await self.then.act(task, observation, history, episode_id)
        belief = Belief.parse(observation.state)
        options = list(observation.info.get("admissible") or [])
        mode = self.mode(goal, episode_id)
        if mode == "lamp first":
            lamp = next(((name, item) for name, place in belief.places.items()
                         for item in place.items or () if kind_of(item) == goal.lamp), None)
            command = (self.searcher.explore(belief, goal.lamp) if lamp is None
                       else f"use {lamp[1]}" if belief.at == lamp[0] else f"go to {lamp[0]}")
        else:
            decoy = self.decoy(goal, belief, mode)
            command = (self.searcher.choose(belief, decoy) if decoy is not None
                       else self.searcher.explore(belief, goal.kind))
        if command is None or (options and command not in options):
            return await self.then.act(task, observation, history, episode_id)
        return Decision(action=command, reasoning=f"{EXPLORATION}: a near miss ({mode})")


def offline_agents(seed: int = 0, noise: float = 0.3) -> dict[str, Any]:
    """The family's offline agents by name (``--agent oracle`` …): ``decoy`` follows the
    expert after its near miss, ``decoy-searcher`` the searcher (it plays the dream too)."""
    return {"oracle": ExpertAgent(), "noisy": NoisyExpertAgent(seed=seed, noise=noise),
            "searcher": SearcherAgent(), "random": RandomAgent(seed=seed),
            "decoy": DecoyAgent(seed=seed),
            "decoy-searcher": DecoyAgent(seed=seed, then="searcher")}
