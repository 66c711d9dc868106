"""The web family's derived rationales: which page the next one is, then the outcome.

A deterministic rationale is an experience-model training target derived from the recorded
transition itself (no model involved); see :mod:`dreamgym_agents.experience.annotate`.
"""

from __future__ import annotations

from dreamgym_agents.adapters.webarena.experience_prompt import (
    action_verb,
    answer_text,
    head,
    kinds_match,
    target_line,
)
from dreamgym_agents.adapters.webarena.state_delta import DEMO_REF, PREVIOUS_REF, STATE_REF
from dreamgym_agents.experience.codec import COMPLETE, FAILED, UNFINISHED, verdict
from dreamgym_agents.types import Transition


def _path(state: str) -> str:
    return head(state).split(" | ")[0]


VERDICTS = (COMPLETE, FAILED, UNFINISHED)
"""The sentences a deterministic rationale states its outcome with."""


def deterministic_rationale(t: Transition, intent: str = "", *,
                            written_as: str | None = None,
                            demo_urls: list[str] | None = None) -> str:
    """A short rationale derived from the transition and its task (no model involved).

    A final answer's rationale starts with its verdict: the answer's checks and the tally of
    recorded answers with the same checks are the prompt's last lines
    (:func:`~dreamgym_agents.adapters.webarena.experience_prompt.render_compact`), and a small model
    trained for minutes learns to read a verdict off the lines right before it, not off lines a
    few dozen tokens back.

    Another step's rationale says which evidence the next page follows, when the training
    example knows how its next state is written: ``written_as`` is its first line, and
    ``demo_urls`` where each demonstration went as the prompt shows it. It reads ``As in demo 2:
    the site goes to URL.``, ``The page stays; the target changes.`` or ``Back to the page
    before: URL.``, then says that the task goes on. The page then agrees with it. A rationale
    that restates the action and its target is copied wrong, and the dreamt page follows the
    wrong copy. Without ``written_as``: what the action does, where the site goes, then that the
    task goes on.
    """
    target = target_line(t.state, t.action)
    verb = action_verb(t.action) or "acts"
    answer = answer_text(t.action)
    outcome = verdict(t)
    if answer is not None:
        if intent and kinds_match(answer, intent) is None:
            return f"{outcome} Final message; the task asks for an action, so the page decides."
        return f"{outcome} Final answer, checked above."
    if written_as is not None:
        return f"{follows(written_as, t, demo_urls or [])} {outcome}"
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
    parts.append(outcome)
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
