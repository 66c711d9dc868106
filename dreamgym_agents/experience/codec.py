"""A family's part of the experience model's prompt and answer: the experience codec.

The experience model (:mod:`dreamgym_agents.experience.model`) is the same for every family: it
retrieves demonstrations, prompts a model, reads ``<reasoning>``, ``<reward>``, ``<done>``,
``<success>`` and ``<next_state>`` back. What it shows and how a state is written are the
family's: a web page is long and changes by a few lines (the web codec writes the next page as
a reference plus edits), a text game's state is a few lines (written in full). A family hands
its codec to the core with ``TaskFamily.experience_codec()``; :class:`PlainCodec` is the codec of
a family with short plain-text states, and what a new family starts from.

Training (:mod:`dreamgym_agents.experience.data`) writes its examples with the same
codec the model is prompted with at inference, so the two cannot drift apart.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dreamgym_agents.episodes.env import ActionSet
    from dreamgym_agents.types import Task, Transition


class StateReferenceError(ValueError):
    """A next state written as a reference the prompt did not show (e.g. ``@demo 4`` with three
    demonstrations): an unreadable answer, retried like one."""


class ExperienceCodec(Protocol):
    """What the core asks a family about the experience model's prompt and answer.

    Attributes:
        verdicts: The sentences a derived rationale states its outcome with (their tokens are
            weighted in training: :func:`~dreamgym_agents.experience.data.decision_spans`).
        follows: How a derived rationale of a step that is not an answer opens (which state
            follows), weighted too.
        prompt_file: The full prompt in ``prompts/`` (for hosted and large models; the compact
            prompt is :meth:`render`'s).
    """

    verdicts: tuple[str, ...]
    follows: tuple[str, ...]
    prompt_file: str

    def sampling(self, state: str, action: str) -> dict[str, Any]:
        """How the answer to ``action`` in ``state`` is decoded (``temperature``, ``top_p``,
        ``bad_words``; empty: the gateway's setting, greedy unless set). A step whose next state
        is a draw (what a box shows when first opened) is sampled, one that follows from the
        state is not; ``experience.temperature`` and ``experience.top_p`` override it for every
        step. ``bad_words`` are strings the answer cannot contain to be read back in this
        state: the local provider never writes them, other providers ignore them, and the
        answer is checked as always."""
        ...

    def for_task(self, task: Task | None) -> ExperienceCodec:
        """The codec for one task's steps: what the family knows of the task's world beyond its
        states (ALFWorld's codec 6: the game's hidden layout) bound in; itself when it knows
        nothing more. Training and prediction both call it, so a prompt shows the same either
        way."""
        ...

    def head(self, state: str) -> str:
        """One line naming a state (the full prompt's history shows the state each step led
        to)."""
        ...

    def answer_text(self, action: str) -> str | None:
        """The final answer an action gives, None when it gives none."""
        ...

    def render(self, intent: str, history: list[Transition] | None, state: str, action: str,
               demos: list[Transition] | None, *, history_steps: int, use_reasoning: bool,
               params: dict[str, str] | None = None,
               tally: tuple[int, int] | None = None) -> list[dict[str, str]]:
        """The compact prompt's chat messages (None history or demos: ablated)."""
        ...

    def rank_step_demos(self, state: str, action: str, candidates: list[Transition],
                        k: int) -> list[Transition]:
        """The ``k`` candidates most like this step (not a final answer), best first."""
        ...

    def rank_final_answer_demos(self, intent: str, state: str, action: str,
                                params: dict[str, str], candidates: list[Transition],
                                k: int) -> list[Transition]:
        """The ``k`` recorded final answers (right and wrong) that best tell this one's
        outcome, best first."""
        ...

    def demo_pages(self, demos: Sequence[Any], state: str, action: str) -> list[str]:
        """The demonstrations' next states as the answer may refer to them."""
        ...

    def back_page(self, history: list[Transition]) -> str | None:
        """The state going back returns to (None: there is none)."""
        ...

    def encode_state(self, target: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        """How a training answer writes the next state ``target``."""
        ...

    def expand_state(self, text: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        """The full next state from what the model wrote (raises
        :class:`StateReferenceError` for a reference that was not shown)."""
        ...

    def rationale(self, t: Transition, intent: str = "", *, written_as: str | None = None,
                  pages: list[str] | None = None) -> str:
        """A rationale derived from a recorded transition (no model involved): which state
        follows, then one of :attr:`verdicts`.

        ``written_as`` is the first line of the next state as the answer writes it; ``pages``
        are the demonstrations' next states as :meth:`demo_pages` gives them.
        """
        ...

    def describe(self) -> str:
        """What the environment is, for a teacher's prompt ("a website", "a text game")."""
        ...


# --------------------------------------------------------------------------------------------
# PlainCodec: short plain-text states, written in full or as @state plus line edits
# --------------------------------------------------------------------------------------------

COMPLETE = "The task is complete."
FAILED = "The episode ends without success."
UNFINISHED = "The task is not finished."
SAME_STATE = "@state"
"""The one reference :class:`PlainCodec` reads: the state does not change."""

_WORD = re.compile(r"[a-z0-9]+")


def verdict(t: Transition) -> str:
    """The sentence stating a transition's outcome."""
    return COMPLETE if t.success else FAILED if t.terminated else UNFINISHED


@functools.lru_cache(maxsize=16384)
def _words(text: str) -> frozenset[str]:
    """The words of ``text``, kept for the texts seen last: a dream ranks the same few
    thousand recorded states and actions against each step, and splitting them again would
    cost a noticeable share of a step's CPU time."""
    return frozenset(_WORD.findall(text.lower()))


def _likeness(a: str, b: str) -> float:
    x, y = _words(a), _words(b)
    return len(x & y) / len(x | y) if x | y else 1.0


class PlainCodec:
    """The experience codec of a family whose states are a few lines of plain text.

    The prompt shows the task, the last steps (action → the lines naming the state it led to),
    the demonstrations as what their action changed (``+``/``-`` lines and the outcome), the
    current state in full and the action. The answer writes the next state as ``@state``
    followed by edits when that is shorter than the state, else in full; in the edits
    (:func:`line_edits`) a ``+ Key: …`` line replaces the line with that key, or is added, and
    a ``- line`` removes one.
    Demonstrations are ranked by the same action first (its verb, then its words), then by the
    words the states share; final answers (``action_set``'s actions with an ``answer``) too.

    Args:
        action_set: The family's action set (its actions' ``verb`` and ``answer``).
        environment: What the environment is, in a few words ("a household text game").
        head_prefixes: The lines that name a state in a history (those starting so, joined
            with `` | ``); none: its first line.
    """

    verdicts = (COMPLETE, FAILED, UNFINISHED)
    follows = ("The state stays", "The state changes", "A new state")
    prompt_file = "experience_model_plain.md"

    @staticmethod
    def sampling(state: str, action: str) -> dict[str, Any]:
        return {}  # the gateway's setting

    def __init__(self, action_set: ActionSet, environment: str = "a text environment",
                 head_prefixes: tuple[str, ...] = ()) -> None:
        self.action_set = action_set
        self.environment = environment
        self.head_prefixes = head_prefixes

    def describe(self) -> str:
        return self.environment

    # -- reading states and actions ----------------------------------------------------------
    def head(self, state: str) -> str:
        lines = [ln.strip() for ln in state.splitlines() if ln.strip()]
        named = [ln for ln in lines if ln.startswith(self.head_prefixes)]
        if self.head_prefixes and named:
            return " | ".join(named)
        return lines[0] if lines else "(empty)"

    def _parsed(self, action: str) -> list[Any]:
        try:
            return list(self.action_set.parse(action))
        except ValueError:
            return []

    def answer_text(self, action: str) -> str | None:
        answers = [a.answer for a in self._parsed(action) if a.answer is not None]
        return answers[-1] if answers else None

    def _verb(self, action: str) -> str:
        parsed = self._parsed(action)
        return parsed[0].verb if parsed else ""

    def for_task(self, task: Task | None) -> PlainCodec:
        del task  # plain states show everything
        return self

    # -- the prompt --------------------------------------------------------------------------
    def task_lines(self) -> list[str]:
        """Lines of the prompt under the task's: what a codec bound to a task
        (:meth:`for_task`) knows of its world beyond the states (none here)."""
        return []

    def render(self, intent: str, history: list[Transition] | None, state: str, action: str,
               demos: list[Transition] | None, *, history_steps: int, use_reasoning: bool,
               params: dict[str, str] | None = None,
               tally: tuple[int, int] | None = None) -> list[dict[str, str]]:
        del params, tally  # plain states show everything a verdict needs
        parts = [f"Simulate {self.environment}.", f"task: {intent}", *self.task_lines()]
        if history is not None:
            steps = [f"{t.action} → {self.head(t.next_state) if t.valid else 'invalid'}"
                     for t in history[-history_steps:]] if history_steps > 0 else []
            parts.append("last steps: " + (" || ".join(steps) if steps else "(none)"))
        if demos is not None:
            for i, d in enumerate(demos, 1):
                parts.append(
                    f"demo {i}: {d.action} (in {self.head(d.state)})\n{self.demo_change(d)}\n"
                    f"reward {int(d.reward >= 1)} done {str(d.terminated).lower()} "
                    f"success {str(d.success).lower()}")
        parts.append(f"state:\n{state.strip()}")
        parts.append(f"action: {action.strip()}")
        parts.append("answer:" if use_reasoning else "answer without reasoning:")
        return [{"role": "user", "content": "\n".join(parts)}]

    # -- demonstrations ----------------------------------------------------------------------
    def demo_change(self, demo: Transition) -> str:
        """What a demonstration's action changed, as its prompt shows it: its line edits."""
        edits = line_edits(demo.state, demo.next_state)
        return "\n".join(edits) if edits else "(no change)"

    def _rank(self, state: str, action: str, candidates: list[Transition],
              k: int) -> list[Transition]:
        verb = self._verb(action)

        def key(t: Transition) -> tuple[float, float, float, str, int]:
            same_verb = float(bool(verb) and self._verb(t.action) == verb)
            return (-same_verb, -_likeness(t.action, action), -_likeness(t.state, state),
                    t.episode_id, t.step)

        return sorted(candidates, key=key)[:k]

    def rank_step_demos(self, state: str, action: str, candidates: list[Transition],
                        k: int) -> list[Transition]:
        return self._rank(state, action, candidates, k)

    def rank_final_answer_demos(self, intent: str, state: str, action: str,
                                params: dict[str, str], candidates: list[Transition],
                                k: int) -> list[Transition]:
        del intent, params
        return self._rank(state, action, candidates, k)

    @staticmethod
    def demo_pages(demos: Sequence[Any], state: str, action: str) -> list[str]:
        del state, action
        return [d.next_state for d in demos]

    @staticmethod
    def back_page(history: list[Transition]) -> str | None:
        del history
        return None

    # -- the answer's next state -------------------------------------------------------------
    @staticmethod
    def encode_state(target: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        del pages, previous, action
        edits = line_edits(state, target)
        written = "\n".join([SAME_STATE, *edits])
        if apply_edits(state, edits) == _norm(target) and len(written) < len(target.strip()):
            return written
        return target.strip()

    @staticmethod
    def expand_state(text: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        del pages, previous, action
        body = text.strip()
        if not body.startswith("@"):
            return body
        first, *rest = body.splitlines()
        if first.strip() != SAME_STATE:
            raise StateReferenceError(f"{first.strip()!r}: only {SAME_STATE} (the current "
                                      "state, then edits) is a reference here")
        bad = [ln for ln in rest if ln.strip() and not ln.startswith(("+ ", "- "))]
        if bad:
            raise StateReferenceError(f"{bad[0]!r} is not an edit (+ line or - line)")
        return apply_edits(state, [ln for ln in rest if ln.strip()])

    def rationale(self, t: Transition, intent: str = "", *, written_as: str | None = None,
                  pages: list[str] | None = None) -> str:
        del intent, pages
        if self.answer_text(t.action) is not None:
            return f"{verdict(t)} Final answer."
        if _norm(t.next_state) == _norm(t.state):
            return f"The state stays as it is. {verdict(t)}"
        if written_as is not None and written_as.strip() == SAME_STATE:
            return f"The state changes: {self.head(t.next_state)}. {verdict(t)}"
        return f"A new state: {self.head(t.next_state)}. {verdict(t)}"


def _norm(state: str) -> str:
    return "\n".join(ln.rstrip() for ln in state.strip().splitlines() if ln.strip())


def _key(line: str) -> str | None:
    head, sep, _ = line.partition(": ")
    return head if sep and head and len(head) <= 40 and "\n" not in head else None


def line_edits(state: str, target: str) -> list[str]:
    """The edits that turn ``state`` into ``target`` line by line: ``+ Key: value`` for a
    keyed line whose value changed or that is new, ``- line`` for a line that went, ``+ line``
    for a new unkeyed one (empty: no change)."""
    old = _norm(state).splitlines()
    new = _norm(target).splitlines()
    old_keys = {_key(ln): ln for ln in old if _key(ln)}
    new_keys = {_key(ln): ln for ln in new if _key(ln)}
    edits = [f"- {ln}" for ln in old
             if (_key(ln) and _key(ln) not in new_keys) or (not _key(ln) and ln not in new)]
    for ln in new:
        key = _key(ln)
        if (key and old_keys.get(key) != ln) or (not key and ln not in old):
            edits.append(f"+ {ln}")
    return edits


def apply_edits(state: str, edits: list[str]) -> str:
    """``state`` with ``edits`` applied (see :func:`line_edits`): a ``+`` line replaces the
    line with its key in place, or is added at the end; a ``-`` line removes that line."""
    lines = _norm(state).splitlines()
    for edit in edits:
        sign, body = edit[:1], edit[2:].rstrip()
        key = _key(body)
        if sign == "-":
            lines = [ln for ln in lines if ln != body]
        elif sign == "+":
            at = next((i for i, ln in enumerate(lines) if key and _key(ln) == key), None)
            if at is None:
                lines.append(body)
            else:
                lines[at] = body
    return "\n".join(lines)
