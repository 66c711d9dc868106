"""Reasoning annotation of recorded transitions, the experience model's SFT targets (paper §4.1).

With a teacher model (any gateway model), annotation follows the paper's prompt shape: once per
task, a short *tutorial* (the plan, what success looks like, the usual failure modes); then for
each transition a short *transition plan* explaining why the action leads to the recorded next
state and outcome. Without a teacher, a deterministic rationale is derived from the transition
itself (the action's target, where the page goes, whether the task is finished), labelled
``deterministic`` so nobody mistakes it for model reasoning.

The rationale is stored in ``transition.info["em_rationale"]`` with its source in
``info["em_rationale_source"]`` (``deterministic`` or ``teacher:<model>``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dreamgym_agents.experience_compact import (
    action_verb,
    answer_text,
    head,
    kinds_match,
    target_line,
)
from dreamgym_agents.state_delta import DEMO_REF, PREVIOUS_REF, STATE_REF
from dreamgym_agents.types import Trajectory, Transition

if TYPE_CHECKING:
    from dreamgym_agents.llm import Gateway

logger = logging.getLogger(__name__)

DETERMINISTIC = "deterministic"


def _path(state: str) -> str:
    return head(state).split(" | ")[0]


COMPLETE = "The task is complete."
FAILED = "The episode ends without success."
UNFINISHED = "The task is not finished."
VERDICTS = (COMPLETE, FAILED, UNFINISHED)
"""The sentences a deterministic rationale states its outcome with."""


def deterministic_rationale(t: Transition, intent: str = "", *,
                            written_as: str | None = None,
                            demo_urls: list[str] | None = None) -> str:
    """A short rationale derived from the transition and its task (no model involved).

    A final answer's rationale starts with its verdict: the answer's checks and the tally of
    recorded answers with the same checks are the prompt's last lines
    (:func:`~dreamgym_agents.experience_compact.render_compact`), and a small model
    trained for minutes learns to read a verdict off the lines right before it, not off lines a
    few dozen tokens back (measured: docs/RESULTS.md).

    Another step's rationale says which evidence the next page follows, when the training
    example knows how its next state is written (``written_as``, its first line; ``demo_urls``,
    where each demonstration went as the prompt shows it): ``As in demo 2: the site goes to
    URL.``, ``The page stays; the target changes.``, ``Back to the page before: URL.``, then
    that the task goes on. The page then agrees with it. (Rationales that restated the action
    and its target were copied wrong, and the page followed them: v27 wrote a search submit's
    rationale as the fill before it, 'The page stays and changes', and dreamt no search for 23
    of 50 held-out submits; docs/RESULTS.md.) Without ``written_as``: what the action does,
    where the site goes, then that the task goes on.
    """
    target = target_line(t.state, t.action)
    verb = action_verb(t.action) or "acts"
    answer = answer_text(t.action)
    verdict = COMPLETE if t.success else FAILED if t.terminated else UNFINISHED
    if answer is not None:
        if intent and kinds_match(answer, intent) is None:
            return f"{verdict} Final message; the task asks for an action, so the page decides."
        return f"{verdict} Final answer, checked above."
    if written_as is not None:
        return f"{follows(written_as, t, demo_urls or [])} {verdict}"
    parts = [f"The agent does {verb}" + (f" on {target}." if target else ".")]
    before, after = _path(t.state), _path(t.next_state)
    if verb == "go_back":
        parts.append(f"The browser returns to the page before, {after}.")
    elif after != before:
        parts.append(f"The site goes to {after}.")
    elif t.next_state.strip() != t.state.strip():
        parts.append("The page stays and changes.")
    else:
        parts.append("The page does not change.")
    parts.append(verdict)
    return " ".join(parts)


FOLLOWS = ("As in demo", "The page stays", "Back to the page before", "A new page")
"""How :func:`follows` opens: which page the next one is."""


def follows(written_as: str, t: Transition, demo_urls: list[str]) -> str:
    """The sentence saying which evidence a next state written as ``written_as`` (its first
    line: a reference or ``URL: …``) follows."""
    ref = written_as.strip()
    if ref == STATE_REF:
        same = t.next_state.strip() == t.state.strip()
        return "The page stays as it is." if same else "The page stays; the target changes."
    if ref == PREVIOUS_REF:
        return f"Back to the page before: {_path(t.next_state)}."
    if ref.startswith(DEMO_REF):
        number = ref[len(DEMO_REF):].strip()
        at = int(number) - 1 if number.isdigit() else -1
        url = demo_urls[at] if 0 <= at < len(demo_urls) else _path(t.next_state)
        return f"As in demo {number}: the site goes to {url}."
    return f"A new page: {_path(t.next_state)}."


def annotate_deterministic(trajectories: list[Trajectory]) -> int:
    """Give every transition a deterministic rationale; returns how many were annotated."""
    count = 0
    for traj in trajectories:
        for t in traj.transitions:
            t.info["em_rationale"] = deterministic_rationale(t, traj.task.intent)
            t.info["em_rationale_source"] = DETERMINISTIC
            count += 1
    return count


TUTORIAL_PROMPT = (
    "You are teaching how a website responds to an agent. Task: {intent}\n"
    "Write a short tutorial (at most 6 lines): the plan to solve the task on this site, what the "
    "site shows when the task is accomplished, and the typical failure modes."
)
STEP_PROMPT = (
    "Tutorial:\n{tutorial}\n\nCurrent page:\n{state}\n\nAgent action: {action}\n\n"
    "Recorded result page:\n{next_state}\nReward {reward:g}, done {done}, success {success}.\n\n"
    "In at most three sentences, explain the causal effect of the action: what it targets, how the "
    "site responds, and whether the task is now complete. Do not restate the whole page."
)


def annotate_with_teacher(
    trajectories: list[Trajectory], gateway: Gateway, *, max_state_lines: int = 60
) -> int:
    """Annotate with a teacher model through the gateway (one tutorial per task, then steps)."""
    tutorials: dict[str, str] = {}
    count = 0
    source = f"teacher:{gateway.cfg.model}"
    for traj in trajectories:
        intent = traj.task.intent
        if intent not in tutorials:
            reply = gateway.complete([{"role": "user",
                                       "content": TUTORIAL_PROMPT.format(intent=intent)}])
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
                t.info["em_rationale"] = deterministic_rationale(t, intent)
                t.info["em_rationale_source"] = DETERMINISTIC
            else:
                t.info["em_rationale"] = " ".join(text.split())
                t.info["em_rationale_source"] = source
            count += 1
    return count
