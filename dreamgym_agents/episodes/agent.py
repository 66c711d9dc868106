"""Agents: the policy side of an episode.

An agent turns (task, observation, history) into a :class:`Decision`: an action text plus the
reasoning behind it. The core's agent is :class:`LLMAgent`: any model through the gateway,
prompted from ``prompts/agent.md`` or the family's ``agent_prompt`` to answer
``<think>…</think><action>…</action>``. The agents that need no model (oracle, random, …) belong
to each family (``TaskFamily.offline_agents``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dreamgym_agents.episodes.env import Observation
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.prompts import load_prompt
from dreamgym_agents.prompts.programs import PromptProgram, load_program
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


_HOW_TO_ACT = re.compile(r"^# How to act\n(.+?)\n\n", re.S | re.M)
DEMO_STATE_LINES = 30
"""A worked example's state is cut to this many lines (a prompt holds several)."""


def template_instruction(template: str) -> str:
    """The instruction of an agent template: the paragraph under its ``# How to act`` heading
    (what ``dg-agents optimize`` rewrites).

    Raises:
        ConfigError: The template has no such paragraph.
    """
    found = _HOW_TO_ACT.search(template)
    if not found:
        raise ConfigError("the agent template has no '# How to act' paragraph to optimise")
    return found.group(1)


def render_demo(demo: dict[str, str]) -> str:
    """One worked example: the task, the state, and the answer given there."""
    state = "\n".join(demo.get("state", "").strip().splitlines()[:DEMO_STATE_LINES])
    history = demo.get("history") or "(none: this is the first step)"
    return (f"Task: {demo.get('intent', '')}\nPrevious steps:\n{history}\nState:\n{state}\n"
            f"Answer:\n<think>{demo.get('reasoning', '')}</think>\n"
            f"<action>{demo.get('action', '')}</action>")


def render_agent_prompt(template: str, fields: dict[str, str], *, instruction: str | None = None,
                        demos: list[dict[str, str]] | tuple = ()) -> str:
    """An agent template filled with ``fields`` (``intent``, ``action_space``, ``options``,
    ``history``, ``state``), its instruction replaced by ``instruction`` when given, and
    ``demos`` shown as worked examples before the task. The one renderer of the agent's
    prompt: the agent plays with it and the DSPy adapter optimises through it.
    """
    text = template
    if instruction is not None:  # literal braces of a written instruction survive str.format
        new = instruction.strip().replace("{", "{{").replace("}", "}}")
        text = text.replace(template_instruction(template), new, 1)
    if demos:
        examples = "\n\n".join(f"## Example {i}\n{render_demo(d)}"
                                 for i, d in enumerate(demos, 1))
        head, sep, rest = text.partition("# Task\n")
        # literal braces in the examples must survive str.format
        examples = examples.replace("{", "{{").replace("}", "}}")
        text = f"{head}# Worked examples\n{examples}\n\n{sep}{rest}" if sep else text
    return text.format(**fields)


def agent_fields(task: Task, observation: Observation, history: list[Transition],
                 action_space: str, history_steps: int = 5) -> dict[str, str]:
    """An agent template's fields at this step: the last action's error follows the state;
    ``options`` lists the commands the environment accepts now, when it says."""
    state = observation.state
    if observation.error:
        state += f"\n\nError from the last action: {observation.error}"
    admissible = observation.info.get("admissible") or []
    options = ("\n# Actions you can take now\n" + "\n".join(map(str, admissible)) + "\n"
               if admissible else "")
    return {"intent": task.intent, "action_space": action_space, "options": options,
            "history": render_history(history, history_steps), "state": state}


class LLMAgent:
    """A model through the gateway, prompted from a template (``prompts/agent.md``, or the
    family's ``agent_prompt``: the web's ``web_agent.md``) with ``{intent}``,
    ``{action_space}``, ``{options}``, ``{history}`` and ``{state}``. ``{options}`` lists the
    commands the environment accepts now when it says (``Observation.info["admissible"]``: a
    text game's), else it is empty. A saved prompt program (``dg-agents optimize``) replaces
    the template's instruction and adds its worked examples.

    Args:
        gateway: The model gateway.
        action_space: Description of the action grammar (from the environment's action set).
        prompt: Template name (:func:`~dreamgym_agents.prompts.load_prompt`).
        history_steps: How many previous steps the prompt shows.
        program: An optimised prompt program for this agent (None: the template as written).
    """

    def __init__(
        self,
        gateway: Gateway,
        action_space: str,
        prompt: str = "agent.md",
        history_steps: int = 5,
        program: PromptProgram | None = None,
    ) -> None:
        self.gateway = gateway
        self.name = gateway.cfg.model
        self.action_space = action_space
        self.template = load_prompt(prompt)
        self.history_steps = history_steps
        self.program = program

    def messages(self, task: Task, observation: Observation, history: list[Transition]) -> list:
        program = self.program
        content = render_agent_prompt(
            self.template,
            agent_fields(task, observation, history, self.action_space, self.history_steps),
            instruction=program.instruction if program else None,
            demos=program.demos if program else ())
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
               gateway: Gateway | None = None, program: str | None = None) -> Agent:
    """The agent ``name``: one of the family's offline agents (``oracle``, ``random`` …), else
    an :class:`LLMAgent` of that model string (through ``gateway``, or a default one for it),
    prompted in the family's terms (its ``agent_prompt`` and action set), or by the saved
    prompt ``program`` (:func:`~dreamgym_agents.prompts.programs.load_program`).

    Raises:
        ConfigError: Not an offline agent and not a valid model string; a program given to an
            offline agent, or made for another family.
    """
    offline = family.offline_agents(seed)
    if name in offline:
        if program:
            raise ConfigError(f"--program prompts a model; {name!r} is an offline agent")
        return offline[name]
    saved = load_program(program).check("agent", family.name) if program else None
    if gateway is None:
        from dreamgym_agents.gateway import llm

        llm.check_model_string(name)
        gateway = llm.Gateway(llm.LLMConfig(model=name))
    return LLMAgent(gateway, action_space=family.action_set().describe(),
                    prompt=getattr(family, "agent_prompt", "agent.md"), program=saved)
