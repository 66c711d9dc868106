"""Agents: the policy side of an episode.

An agent turns (task, observation, history) into a :class:`Decision`: an action text plus the
reasoning behind it. The core's agent is :class:`LLMAgent` (any model through the gateway,
prompted from ``prompts/web_agent.md`` to answer ``<think>…</think><action>…</action>``); the
agents that need no model (oracle, random, …) belong to each family
(``TaskFamily.offline_agents``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dreamgym_agents.episodes.env import Observation
from dreamgym_agents.prompts import load_prompt
from dreamgym_agents.types import ModelUsage, Task, Transition

if TYPE_CHECKING:
    from dreamgym_agents.gateway.llm import Gateway


@dataclass
class Decision:
    """What an agent decided at one step.

    Attributes:
        action: The action text handed to the environment.
        reasoning: The agent's reasoning (``<think>`` content), if any.
        raw: The model's whole answer (empty for built-in agents).
        usage: Model usage of this decision.
        seconds: Wall time spent deciding.
    """

    action: str
    reasoning: str = ""
    raw: str = ""
    usage: ModelUsage = field(default_factory=ModelUsage)
    seconds: float = 0.0


class Agent(Protocol):
    """The policy contract. ``name`` is recorded in every trajectory."""

    name: str

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision: ...


EXPLORATION = "exploration"
"""How a noisy agent's random steps begin their reasoning: imitation learning skips them (a
detour inside a successful episode is data for the experience model, not a decision to copy)."""


_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)
_ACTION = re.compile(r"<action>(.*?)(?:</action>|$)", re.S)


def parse_answer(text: str) -> tuple[str, str]:
    """Split a ``<think>…</think><action>…</action>`` answer into (reasoning, action).

    Missing tags are tolerated: without ``<action>`` the text after ``</think>`` (or the whole
    answer) is taken as the action, and the environment judges whether it is one.
    """
    think = _THINK.search(text)
    reasoning = think.group(1).strip() if think else ""
    action = _ACTION.search(text)
    if action:
        return reasoning, action.group(1).strip()
    rest = text.split("</think>", 1)[1] if "</think>" in text else text
    return reasoning, rest.strip()


def render_history(history: list[Transition], last: int = 5) -> str:
    """The last ``last`` steps as short lines for a prompt."""
    if not history:
        return "(none: this is the first step)"
    lines = []
    for t in history[-last:]:
        note = f" -> invalid: {t.error}" if not t.valid else ""
        lines.append(f"step {t.step + 1}: {t.action}{note}")
    return "\n".join(lines)


class LLMAgent:
    """A model through the gateway, prompted from a template (``prompts/agent.md``, or the
    family's ``agent_prompt``: the web's ``web_agent.md``) with ``{intent}``,
    ``{action_space}``, ``{options}``, ``{history}`` and ``{state}``. ``{options}`` lists the
    commands the environment accepts now when it says (``Observation.info["admissible"]``: a
    text game's), else it is empty.

    Args:
        gateway: The model gateway.
        action_space: Description of the action grammar (from the environment's action set).
        prompt: Template name (:func:`~dreamgym_agents.prompts.load_prompt`).
        history_steps: How many previous steps the prompt shows.
    """

    def __init__(
        self,
        gateway: Gateway,
        action_space: str,
        prompt: str = "agent.md",
        history_steps: int = 5,
    ) -> None:
        self.gateway = gateway
        self.name = gateway.cfg.model
        self.action_space = action_space
        self.template = load_prompt(prompt)
        self.history_steps = history_steps

    def messages(self, task: Task, observation: Observation, history: list[Transition]) -> list:
        state = observation.state
        if observation.error:
            state += f"\n\nError from the last action: {observation.error}"
        admissible = observation.info.get("admissible") or []
        options = ("\n# Actions you can take now\n" + "\n".join(map(str, admissible)) + "\n"
                   if admissible else "")
        content = self.template.format(
            intent=task.intent,
            action_space=self.action_space,
            options=options,
            history=render_history(history, self.history_steps),
            state=state,
        )
        return [{"role": "user", "content": content}]

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision:
        start = time.perf_counter()
        completion = await self.gateway.acomplete(self.messages(task, observation, history))
        reasoning, action = parse_answer(completion.full_text)
        return Decision(
            action=action,
            reasoning=reasoning,
            raw=completion.full_text,
            usage=completion.usage,
            seconds=time.perf_counter() - start,
        )


def make_agent(name: str, family: Any, *, seed: int = 0,
               gateway: Gateway | None = None) -> Agent:
    """The agent ``name``: one of the family's offline agents (``oracle``, ``random`` …), else
    an :class:`LLMAgent` of that model string (through ``gateway``, or a default one for it),
    prompted in the family's terms (its ``agent_prompt`` and action set).

    Raises:
        ConfigError: Not an offline agent and not a valid model string.
    """
    offline = family.offline_agents(seed)
    if name in offline:
        return offline[name]
    if gateway is None:
        from dreamgym_agents.gateway import llm

        llm.check_model_string(name)
        gateway = llm.Gateway(llm.LLMConfig(model=name))
    return LLMAgent(gateway, action_space=family.action_set().describe(),
                    prompt=getattr(family, "agent_prompt", "agent.md"))
