"""τ²'s offline agents: the oracle (the task's gold actions, then what it must tell the
customer), a noisy oracle, a quitter (a part of the gold actions, then the end), a meddler (fixes it
was not asked for) and a random agent.

The oracle reads the task's evaluation criteria from τ²'s own task (by the τ² id in the
task's config); the criteria are never in a :class:`~dreamgym_agents.types.Task`, a state or
an observation, so no policy and no experience model prompt sees them.
"""

from __future__ import annotations

import random
import re
from typing import Any

from dreamgym_agents.adapters.tau2.actions import STOP, call_text
from dreamgym_agents.adapters.tau2.data import SOLO_DOMAINS, domain_tasks, domain_tools
from dreamgym_agents.episodes.agent import EXPLORATION, Decision
from dreamgym_agents.episodes.env import Observation
from dreamgym_agents.types import Task, Transition

DONE = f"{STOP}()"
_TOKEN = re.compile(r"[#A-Za-z0-9_][\w#@.\-]{2,}")


def gold_plan(task: Task) -> list[str]:
    """The oracle's actions for ``task``: τ²'s gold tool calls in order, then (with a
    customer) one message saying every ``communicate_info`` string, else (solo) ``done()``."""
    domain = str(task.config["domain"])
    criteria = domain_tasks(domain)[str(task.config["tau2_id"])].evaluation_criteria
    plan = [call_text(a.name, dict(a.arguments or {})) for a in (criteria.actions or [])]
    if domain in SOLO_DOMAINS:
        return [*plan, DONE]
    said = [str(s) for s in (criteria.communicate_info or [])]
    plan.append("Done: " + "; ".join(said) + "." if said else "Your request has been completed.")
    return plan


def _next_of(plan: list[str], history: list[Transition]) -> str:
    """The first plan action not yet played (the plan read in order through the history's
    valid actions: a detour in between does not count)."""
    at = 0
    for step in history:
        if at < len(plan) and step.valid and step.action.strip() == plan[at]:
            at += 1
    return plan[at] if at < len(plan) else DONE


class OracleAgent:
    """Plays the task's gold actions (:func:`gold_plan`)."""

    name = "oracle"

    def __init__(self) -> None:
        self._plans: dict[str, list[str]] = {}

    def plan(self, task: Task) -> list[str]:
        if task.task_id not in self._plans:
            self._plans[task.task_id] = gold_plan(task)
        return self._plans[task.task_id]

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        return Decision(action=_next_of(self.plan(task), history), reasoning="the gold actions")


class RandomAgent:
    """A random tool of the domain with its required arguments filled from words of the
    transcript (ids, names, numbers), now and then a message or ``done()``: the floor."""

    name = "random"

    def __init__(self, domain: str, seed: int = 0) -> None:
        self.domain = domain
        self.solo = domain in SOLO_DOMAINS
        self.seed = seed

    def choose(self, state: str, rng: random.Random) -> str:
        draw = rng.random()
        if draw < 0.1:
            return DONE
        if not self.solo and draw < 0.25:
            return "Could you tell me more about your request?"
        tools = domain_tools(self.domain, self.solo)
        name = rng.choice(sorted(tools.by_name))
        params = tools.schema(name).get("parameters") or {}
        words = _TOKEN.findall(state) or ["unknown"]
        args: dict[str, Any] = {}
        for arg in params.get("required") or ():
            kind = (params.get("properties") or {}).get(arg, {}).get("type", "string")
            args[arg] = {"integer": 1, "number": 1.0, "boolean": True, "array": [],
                         "object": {}}.get(kind, rng.choice(words))
        return call_text(name, args)

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        # seeded by the episode and the step: a resumed or concurrent run repeats itself
        rng = random.Random(f"{self.seed}|{episode_id}|{len(history)}")
        return Decision(action=self.choose(observation.state, rng), reasoning="random")


class NoisyOracleAgent:
    """The oracle, but with probability ``noise`` a random action first, a detour. The plan
    goes on after it, so a detour that changed the database or ended the call costs the
    reward, as it would a real agent."""

    name = "noisy"

    def __init__(self, domain: str, seed: int = 0, noise: float = 0.3) -> None:
        self.oracle = OracleAgent()
        self.random = RandomAgent(domain, seed)
        self.seed = seed
        self.noise = noise

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        rng = random.Random(f"noise|{self.seed}|{episode_id}|{len(history)}")
        if rng.random() < self.noise:
            action = self.random.choose(observation.state, rng)
            if action != DONE:
                return Decision(action=action, reasoning=f"{EXPLORATION}: a random action")
        return await self.oracle.act(task, observation, history, episode_id)


class QuitterAgent:
    """Ends the task before its work is done: a prefix of the gold actions, one of them left
    out now and then, then the end (solo: ``done()``; with a customer, the closing message).
    τ²'s evaluator scores the ending, mostly 0: what the experience model learns an early or
    incomplete ending earns, where the oracle alone would teach it that every ending pays."""

    name = "quitter"

    def __init__(self, seed: int = 0) -> None:
        self.oracle = OracleAgent()
        self.seed = seed
        self._plans: dict[str, list[str]] = {}

    def plan(self, task: Task, episode_id: str) -> list[str]:
        """This episode's actions: a shortened gold plan, drawn once per episode."""
        if episode_id not in self._plans:
            gold = self.oracle.plan(task)
            work, end = gold[:-1], gold[-1]
            rng = random.Random(f"quit|{self.seed}|{episode_id}")
            kept = work[:rng.randrange(len(work))] if work else []
            if len(kept) > 1 and rng.random() < 0.5:
                del kept[rng.randrange(len(kept))]
            self._plans[episode_id] = [*kept, end]
        return self._plans[episode_id]

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        return Decision(action=_next_of(self.plan(task, episode_id), history),
                        reasoning="quitter: an early end")


class MeddlerAgent:
    """Fixes it was not asked for, then the end: half its episodes play the gold actions with
    one to three needless fixes in between (calls from other train tasks' gold actions that
    this task's plan lacks), the other half another train task's fixes for the same ticket
    (telecom's tasks share 5 tickets; their devices differ). τ²'s evaluator scores what they
    did to the customer's world: what the experience model learns a policy that plays the
    fixes it knows for a ticket earns, where the oracle alone would teach it that a fix
    always pays."""

    name = "meddler"

    def __init__(self, domain: str, seed: int = 0) -> None:
        self.domain = domain
        self.oracle = OracleAgent()
        self.seed = seed
        self._plans: dict[str, list[str]] = {}
        self._train: list[tuple[str, list[str]]] | None = None

    def train_plans(self) -> list[tuple[str, list[str]]]:
        """(ticket, gold calls) of every task of this project's train split (never a held-out
        task's)."""
        if self._train is None:
            from dreamgym_agents.adapters.tau2.data import split_ids

            tasks = domain_tasks(self.domain)
            self._train = [(" ".join(str(tasks[i].ticket).split()),
                            [call_text(a.name, dict(a.arguments or {}))
                             for a in (tasks[i].evaluation_criteria.actions or [])])
                           for i in split_ids(self.domain, "train")]
        return self._train

    def fixes(self) -> list[str]:
        """The calls of the train tasks' gold actions."""
        return sorted({call for _, calls in self.train_plans() for call in calls})

    def plan(self, task: Task, episode_id: str) -> list[str]:
        """This episode's actions, drawn once."""
        if episode_id not in self._plans:
            gold = self.oracle.plan(task)
            work, end = list(gold[:-1]), gold[-1]
            rng = random.Random(f"meddle|{self.seed}|{episode_id}")
            others = [calls for ticket, calls in self.train_plans()
                      if ticket == " ".join(task.intent.split()) and calls != work]
            if others and rng.random() < 0.5:
                work = list(rng.choice(others))
            else:
                needless = [c for c in self.fixes() if c not in gold]
                for call in rng.sample(needless, min(len(needless), rng.randint(1, 3))):
                    work.insert(rng.randint(0, len(work)), call)
            self._plans[episode_id] = [*work, end]
        return self._plans[episode_id]

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        return Decision(action=_next_of(self.plan(task, episode_id), history),
                        reasoning=f"{EXPLORATION}: fixes it was not asked for")
