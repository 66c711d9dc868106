"""Reasoning annotation of recorded transitions, the experience model's SFT targets (paper §4.1).

With a teacher model (any gateway model), annotation follows the paper's prompt shape: once per
task, a short *tutorial* (the plan, what success looks like, the usual failure modes); then for
each transition a short *transition plan* explaining why the action leads to the recorded next
state and outcome. Without a teacher, a deterministic rationale is derived from the transition
itself by the family's experience codec (which state follows, whether the task is finished:
``ExperienceCodec.rationale``), labelled ``deterministic`` so nobody mistakes it for model
reasoning.

The rationale is stored in ``transition.info["em_rationale"]`` with its source in
``info["em_rationale_source"]`` (``deterministic`` or ``teacher:<model>``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dreamgym_agents.types import Trajectory

if TYPE_CHECKING:
    from dreamgym_agents.experience.codec import ExperienceCodec
    from dreamgym_agents.gateway.llm import Gateway

logger = logging.getLogger(__name__)

DETERMINISTIC = "deterministic"


def annotate_deterministic(trajectories: list[Trajectory], codec: ExperienceCodec) -> int:
    """Give every transition a rationale derived by the family's ``codec``; returns how many
    were annotated."""
    count = 0
    for traj in trajectories:
        for t in traj.transitions:
            t.info["em_rationale"] = codec.rationale(t, traj.task.intent)
            t.info["em_rationale_source"] = DETERMINISTIC
            count += 1
    return count


TUTORIAL_PROMPT = (
    "You are teaching how {environment} responds to an agent. Task: {intent}\n"
    "Write a short tutorial (at most 6 lines): the plan to solve the task there, what the "
    "environment shows when the task is accomplished, and the typical failure modes."
)
STEP_PROMPT = (
    "Tutorial:\n{tutorial}\n\nCurrent state:\n{state}\n\nAgent action: {action}\n\n"
    "Recorded next state:\n{next_state}\nReward {reward:g}, done {done}, success {success}.\n\n"
    "In at most three sentences, explain the causal effect of the action: what it targets, how the "
    "environment responds, and whether the task is now complete. Do not restate the whole state."
)


def annotate_with_teacher(
    trajectories: list[Trajectory], gateway: Gateway, codec: ExperienceCodec, *,
    max_state_lines: int = 60,
) -> int:
    """Annotate with a teacher model through the gateway (one tutorial per task, then steps);
    an empty answer falls back to the ``codec``'s derived rationale."""
    tutorials: dict[str, str] = {}
    count = 0
    source = f"teacher:{gateway.cfg.model}"
    for traj in trajectories:
        intent = traj.task.intent
        if intent not in tutorials:
            reply = gateway.complete([{"role": "user",
                                       "content": TUTORIAL_PROMPT.format(
                                           intent=intent, environment=codec.describe())}])
            tutorials[intent] = reply.text.strip()
        for t in traj.transitions:
            if t.info.get("em_rationale_source") == source:
                continue  # already annotated (a counterfactual variant shares its history)
            clip = "\n".join(t.state.splitlines()[:max_state_lines])
            nxt = "\n".join(t.next_state.splitlines()[:max_state_lines])
            reply = gateway.complete([{"role": "user", "content": STEP_PROMPT.format(
                tutorial=tutorials[intent], state=clip, action=t.action, next_state=nxt,
                reward=t.reward, done=str(t.terminated).lower(), success=str(t.success).lower())}])
            text = reply.text.strip()
            if not text:  # an empty teacher answer: fall back, labelled as such
                t.info["em_rationale"] = codec.rationale(t, intent)
                t.info["em_rationale_source"] = DETERMINISTIC
            else:
                t.info["em_rationale"] = " ".join(text.split())
                t.info["em_rationale_source"] = source
            count += 1
    return count
