"""The τ² environment: τ²'s own Gymnasium environment (``tau2.gym.AgentGymEnv``: its
orchestrator, tools, user simulator and evaluator) behind the project's environment contract.

The state is the episode's transcript as keyed lines, the agent's knowledge and nothing else::

    Domain: telecom
    Ticket: <the ticket>                      (solo mode; with a customer: ``User 0: <opening>``)
    Call 1: toggle_airplane_mode()
    Result 1: Airplane Mode is now OFF. / Status Bar: …
    Said 2: <a message to the customer>
    User 2: <the customer's reply>

Each step adds its two lines at the end (the experience model writes them as two ``+`` edits).
The reward is τ²'s evaluation of the simulation (``evaluate_simulation``: database, end-state
assertions, actions, what was communicated) on the step that ends it (``done()``, the
customer's ``###STOP###``); 0 on every other step. The evaluation criteria (the gold answers)
never enter a state, an observation or a step's info: only the reward and its breakdown by
component do.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dreamgym_agents.adapters.tau2.actions import Tau2ActionSet
from dreamgym_agents.adapters.tau2.data import (
    SOLO_DOMAINS,
    domain_tasks,
    domain_tools,
    last_error,
    require,
)
from dreamgym_agents.episodes.env import Observation, StepResult, normalize_text
from dreamgym_agents.errors import EnvError
from dreamgym_agents.types import Task

logger = logging.getLogger(__name__)

TAU2_MAX_STEPS = 1000
"""τ²'s own message limit per simulation: far above any episode here, so the run's
``max_steps`` is the limit that ends an episode."""
_ROLES = ("tool: ", "user: ", "assistant: ")


def _one_line(reason: str) -> str:
    """τ²'s error text cut to its first line (it dumps whole messages after it)."""
    return reason.strip().splitlines()[0] if reason.strip() else ""


def initial_state(task: Task) -> str:
    """The state an episode of ``task`` starts in before any message (solo: the ticket)."""
    domain = str(task.config.get("domain", ""))
    lines = [f"Domain: {domain}"]
    ticket = task.config.get("ticket")
    if ticket:
        lines.append(f"Ticket: {normalize_text(str(ticket))}")
    return "\n".join(lines)


def messages_of(observation: str) -> list[tuple[str, str]]:
    """τ²'s observation text (``role: content`` per message, a content's further lines
    following it) as ``(role, content)`` pairs, each content on one line (`` / `` between its
    lines)."""
    out: list[tuple[str, list[str]]] = []
    for line in observation.splitlines():
        role = next((r for r in _ROLES if line.startswith(r)), None)
        if role is not None:
            out.append((role[:-2], [line[len(role):]]))
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            out.append(("tool", [line]))
    return [(role, normalize_text(" / ".join(p for p in parts if p.strip())))
            for role, parts in out]


def _gym_class() -> type:
    require()
    from tau2.gym.gym_agent import AgentGymEnv

    class CachedTaskEnv(AgentGymEnv):
        """τ²'s environment with its task read once. Stock τ² re-reads and re-validates the
        domain's whole task file at every reset, step and scoring, slow on a domain as large
        as telecom."""

        def _get_task(self) -> Any:
            return domain_tasks(self.domain)[self.task_id]

    return CachedTaskEnv


class Tau2Env:
    """One τ² episode at a time (τ² runs its orchestrator in a thread of its own).

    Args:
        domain: τ²'s domain (telecom plays solo: the agent has the customer's device tools).
        user_model: The customer's LiteLLM model (``dg-user/scripted``, ``hf/<path>``, a hosted
            or served one); unused in solo mode.
        user_args: Extra arguments of the customer's model calls (``api_base``, …).
    """

    provenance = "real"

    def __init__(self, domain: str, user_model: str, user_args: dict[str, Any] | None = None
                 ) -> None:
        self.domain = domain
        self.solo = domain in SOLO_DOMAINS
        self.user_model = user_model
        self.user_args = dict(user_args or {})
        self.action_set = Tau2ActionSet(domain_tools(domain, self.solo))
        self._gym: Any = None
        self._open = False
        self._state = ""
        self._turn = 0
        self._task: Task | None = None
        if not self.solo and user_model.startswith("dg-user/"):
            from dreamgym_agents.adapters.tau2.user import register_scripted_user

            register_scripted_user()
        elif not self.solo and user_model.startswith("hf/"):
            from dreamgym_agents.gateway.local import register_local_provider

            register_local_provider()

    def reset(self, task: Task) -> Observation:
        if str(task.config.get("domain")) != self.domain:
            raise EnvError(f"task {task.task_id} is of τ²'s {task.config.get('domain')} domain;"
                           f" this environment plays {self.domain}")
        self._finish()
        tau2_id = str(task.config["tau2_id"])
        start = time.perf_counter()
        gym = _gym_class()(self.domain, tau2_id, max_steps=TAU2_MAX_STEPS, solo_mode=self.solo,
                           user_llm=None if self.solo else self.user_model,
                           user_llm_args={"temperature": 0.0, **self.user_args})
        observation, _info = gym.reset()
        self._gym, self._task, self._turn = gym, task, 0
        if gym._simulation_done.is_set():  # τ² swallowed an error in its orchestrator thread
            reason = (_one_line(last_error(tau2_id))
                      or "the simulation ended before the agent's first turn")
            raise EnvError(f"τ² episode {task.task_id} could not start"
                           f"{'' if self.solo else f' (customer model {self.user_model})'}: "
                           f"{reason}")
        self._open = True
        lines = [initial_state(task)]
        for role, content in messages_of(observation):
            lines.append(f"{'User' if role == 'user' else 'Result'} 0: {content}")
        self._state = "\n".join(lines)
        logger.debug("τ² %s reset in %.2fs", task.task_id, time.perf_counter() - start)
        return Observation(state=self._state, info={"domain": self.domain})

    def step(self, action: str) -> StepResult:
        if self._gym is None or self._task is None:
            raise EnvError("step before reset")
        if not self._open:
            raise EnvError(f"τ² episode {self._task.task_id} is over: reset first")
        try:
            parsed = self.action_set.parse(action)[0]
        except ValueError as exc:
            obs = Observation(state=self._state, error=str(exc), info={"domain": self.domain})
            return StepResult(obs, valid=False, error=str(exc))
        self._turn += 1
        observation, reward, terminated, _trunc, info = self._gym.step(parsed.written())
        if terminated:
            self._open = False
            if self._gym._simulation_run is None:  # the orchestrator raised (a customer model)
                reason = _one_line(last_error(str(self._task.config["tau2_id"])))
                raise EnvError(f"τ² episode {self._task.task_id} failed at step {self._turn}"
                               f"{'' if self.solo else f' (customer model {self.user_model})'}"
                               f": {reason or 'its simulation ended without a run'}")
        lines = [self._state,
                 (f"Said {self._turn}: {normalize_text(parsed.text)}" if parsed.is_message
                  else f"Call {self._turn}: {parsed.written()}")]
        for role, content in messages_of(observation):
            if role != "assistant":
                lines.append(f"{'User' if role == 'user' else 'Result'} {self._turn}: {content}")
        self._state = "\n".join(lines)
        step_info: dict[str, Any] = {"domain": self.domain}
        if terminated:
            step_info["reward_breakdown"] = _breakdown(info.get("reward_info"))
            step_info["termination"] = str(getattr(self._gym._simulation_run,
                                                   "termination_reason", ""))
        success = bool(terminated and reward >= 1.0 - 1e-9)
        return StepResult(Observation(state=self._state, info={"domain": self.domain}),
                          reward=float(reward) if terminated else 0.0, done=bool(terminated),
                          success=success, info=step_info)

    def _finish(self) -> None:
        """End an episode left unfinished (a step limit): τ²'s thread waits for an action."""
        if self._gym is not None and self._open:
            try:
                self._gym.step("done()")
            except Exception as exc:  # the episode is over either way
                logger.debug("τ² episode left unfinished: %s", exc)
        self._open = False

    def close(self) -> None:
        self._finish()
        self._gym = None


def _breakdown(reward_info: Any) -> dict[str, float]:
    """τ²'s reward by component (``reward_breakdown``), nothing of the criteria it checked."""
    import json

    try:
        found = json.loads(reward_info) if isinstance(reward_info, str) else dict(reward_info)
    except (TypeError, ValueError):
        return {}
    return {str(k): float(v) for k, v in (found.get("reward_breakdown") or {}).items()}
