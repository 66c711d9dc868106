"""ALFWorld's experience codec: the next state written as the game's feedback sentence.

An ALFWorld state is a deterministic function of the game's feedback sentences
(:meth:`~dreamgym_agents.adapters.alfworld.belief.Belief.update`, exact on every collected
transition), so the experience model answers with the sentence and the codec applies it:

    @feedback
    You pick up the @1 from the @2.

``@1``, ``@2`` … are the action's objects and receptacles in the order it names them (``take egg
1 from countertop 1``: ``egg 1``, ``countertop 1``). A small model trained from scratch copies a
name badly (recipe v3 wrote ``You heat the apple 1`` for ``heat egg 1 with microwave 1`` and the
names of a retrieved demonstration for a fifth of the expert's steps: docs/RESULTS.md); written as
references, the sentence of a command is the same in every game, and a demonstration of the same
command shows it word for word. What no model can know (the contents a receptacle shows when
first seen) is still written out. A next state that the sentence does not give is written as
:class:`~dreamgym_agents.experience.codec.PlainCodec` writes it.
"""

from __future__ import annotations

import re
from typing import Any

from dreamgym_agents.adapters.alfworld.belief import Belief
from dreamgym_agents.experience.codec import PlainCodec, StateReferenceError, verdict

FEEDBACK_REF = "@feedback"
"""The reference of a next state written as the game's feedback sentence."""
_NAME = re.compile(r"\b[a-z]+ \d+\b")
_REF = re.compile(r"@(\d+)")


def action_names(action: str) -> list[str]:
    """The objects and receptacles an action names, in its order (``@1``, ``@2`` …)."""
    return _NAME.findall(action)


def with_references(sentence: str, action: str) -> str:
    """``sentence`` with each of the ``action``'s names written as its reference."""
    names = action_names(action)
    for i, name in sorted(enumerate(names, 1), key=lambda p: -len(p[1])):
        sentence = re.sub(rf"\b{re.escape(name)}\b", f"@{i}", sentence)
    return sentence


def without_references(sentence: str, action: str) -> str:
    """The inverse of :func:`with_references`.

    Raises:
        StateReferenceError: A reference to a name the action does not have.
    """
    names = action_names(action)

    def name(m: re.Match[str]) -> str:
        i = int(m.group(1))
        if not 1 <= i <= len(names):
            raise StateReferenceError(f"@{i}: the action {action!r} names {len(names)} "
                                      "object(s) and receptacle(s)")
        return names[i - 1]

    return _REF.sub(name, sentence)


def apply_feedback(state: str, action: str, sentence: str) -> str:
    """The state after ``action`` answered with ``sentence`` (the game's own update)."""
    belief = Belief.parse(state)
    belief.update(action, sentence)
    return belief.render()


class AlfworldCodec(PlainCodec):
    """:class:`~dreamgym_agents.experience.codec.PlainCodec` with the next state written as the
    feedback sentence, its names as the action's references (the module docstring); the
    demonstrations show their sentence the same way."""

    follows = (*PlainCodec.follows, "The game answers")

    @staticmethod
    def encode_state(target: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        sentence = Belief.parse(target).feedback
        if sentence and apply_feedback(state, action, sentence) == target.strip():
            return f"{FEEDBACK_REF}\n{with_references(sentence, action)}"
        return PlainCodec.encode_state(target, state, pages, previous, action)

    @staticmethod
    def expand_state(text: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        body = text.strip()
        first, _, rest = body.partition("\n")
        if first.strip() != FEEDBACK_REF:
            return PlainCodec.expand_state(text, state, pages, previous, action)
        sentence = " ".join(rest.split())
        if not sentence:
            raise StateReferenceError(f"{FEEDBACK_REF} without a sentence")
        return apply_feedback(state, action, without_references(sentence, action))

    def demo_change(self, demo: Any) -> str:
        """A demonstration's change as the answer writes it (its sentence, referenced)."""
        written = self.encode_state(demo.next_state, demo.state, [], None, demo.action)
        return written if written.startswith(FEEDBACK_REF) else super().demo_change(demo)

    def rationale(self, t: Any, intent: str = "", *, written_as: str | None = None,
                  pages: list[str] | None = None) -> str:
        if written_as is not None and written_as.strip() == FEEDBACK_REF:
            return f"The game answers the command. {verdict(t)}"
        return super().rationale(t, intent, written_as=written_as, pages=pages)
