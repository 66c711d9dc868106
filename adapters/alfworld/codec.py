"""ALFWorld's experience codec: the next state written as the game's feedback sentence.

An ALFWorld state is a deterministic function of the game's feedback sentences
(:meth:`~dreamgym_agents.adapters.alfworld.belief.Belief.update`), so the experience model
answers with the sentence and the codec applies it:

    @feedback
    You pick up the @1 from the @2.

``@1``, ``@2`` … are the action's objects and receptacles in the order it names them (``take egg
1 from countertop 1``: ``egg 1``, ``countertop 1``). A small model trained from scratch copies
names badly; written as references, the sentence of a command is the same in every game, and a
demonstration of the same command shows it word for word. Contents the state already knows (a
receptacle seen before, shown again) are written ``@seen``, so the model does not write a list
of its own for a revisit:

    @feedback
    You arrive at @1. On the @1, you see @seen.

Later codec versions (:data:`CODEC_VERSION`) add to this. Version 3 shows the goal's checks
before the answer (:func:`~dreamgym_agents.adapters.alfworld.goals.goal_checks`). Version 4
writes the object held and the place the player is at, where the action does not name them, as
``@held`` and ``@at`` (``You are facing the @at.``), and the game's help text as ``@help``.
Version 5 ends the checks with the goal's state if the command works (``if it works: done``).

What no model can know from the states is the contents a receptacle shows when first seen.
Up to version 5 the answer writes them out, in the game's order. From version 6 the prompt of a
step that may show them has the game's hidden layout for that receptacle (``here: a soapbar 1,
and a cloth 2``), read from the game without playing it by the family's
:meth:`~dreamgym_agents.adapters.alfworld.family.AlfworldFamily.layout`; the answer writes the
list it shows as :data:`LAYOUT_REF`:

    @feedback
    You open the @1. The @1 is open. In it, you see @here.

The model still decides whether the step shows it (a closed drawer shows nothing). A next
state that the sentence does not give is written as
:class:`~dreamgym_agents.experience.codec.PlainCodec` writes it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from dreamgym_agents.adapters.alfworld.belief import (
    Belief,
    Place,
    action_names,
    game_list,
    game_order,
    in_game_order,
    listed,
    with_listed,
)
from dreamgym_agents.adapters.alfworld.goals import goal_checks
from dreamgym_agents.experience.codec import PlainCodec, StateReferenceError, verdict
from dreamgym_agents.types import Task

FEEDBACK_REF = "@feedback"
"""The reference of a next state written as the game's feedback sentence."""
SEEN_REF = "@seen"
"""The objects the state knows in the receptacle the action names last, as the game lists them."""
MAX_NAMES = 3
"""More names than a command has (two at most: ``heat egg 1 with microwave 1``)."""
HELD_REF = "@held"
"""The object the player holds (codec version 4)."""
AT_REF = "@at"
"""The receptacle the player is at (codec version 4)."""
HELP_REF = "@help"
"""The game's answer to ``help`` (codec version 4): always :data:`HELP_TEXT`."""
HELP_TEXT = (
    "Available commands: look: look around your current location inventory: check your current "
    "inventory go to (receptacle): move to a receptacle open (receptacle): open a receptacle "
    "close (receptacle): close a receptacle take (object) from (receptacle): take an object from "
    "a receptacle move (object) to (receptacle): place an object in or on a receptacle examine "
    "(something): examine a receptacle or an object use (object): use an object heat (object) "
    "with (receptacle): heat an object using a receptacle clean (object) with (receptacle): "
    "clean an object using a receptacle cool (object) with (receptacle): cool an object using a "
    "receptacle slice (object) with (object): slice an object using a sharp object")
"""ALFWorld's help text, as the state's feedback line keeps it (whitespace joined)."""
LAYOUT_REF = "@here"
"""What the game's hidden layout puts in the receptacle the action names last, as the prompt's
``here:`` line lists it (codec version 6)."""
_NAMED = re.compile(r"[a-z]+ \d+")
_REF = re.compile(r"@(\d+)")


def target_place(state: str, action: str) -> Place | None:
    """What ``state`` knows of the receptacle ``action`` names last (None: never visited, or
    no receptacle named)."""
    names = action_names(action)
    return Belief.parse(state).places.get(names[-1]) if names else None


def known_list(state: str, action: str) -> str | None:
    """What ``state`` knows of the receptacle ``action`` names last, as the game lists it
    (None: nothing known, or no receptacle named)."""
    place = target_place(state, action)
    if place is None or place.items is None or place.status == "closed":
        return None
    return game_list(place.items)


def with_references(sentence: str, action: str, state: str = "", version: int = 2,
                    here: str | None = None) -> str:
    """``sentence`` with each of the ``action``'s names written as its reference, and the list
    of objects it shows written :data:`SEEN_REF` when ``state`` knows that list already; from
    ``version`` 4 also the game's help as :data:`HELP_REF`, and the place the player is at and
    the object it holds, when the action does not name them, as :data:`AT_REF` and
    :data:`HELD_REF` (``look``: ``You are facing the @at.``; ``inventory``: ``You are carrying:
    a @held.``); a list that is ``here`` (the layout's, :func:`layout_list`) as
    :data:`LAYOUT_REF`."""
    if version >= 4 and sentence == HELP_TEXT:
        return HELP_REF
    known = known_list(state, action) if state else None
    if known is not None and listed(sentence) == known:
        sentence = with_listed(sentence, SEEN_REF)
    elif here is not None and listed(sentence) is not None \
            and listed(in_game_order(sentence)) == here:
        sentence = with_listed(sentence, LAYOUT_REF)
    names = action_names(action)
    for i, name in sorted(enumerate(names, 1), key=lambda p: -len(p[1])):
        sentence = re.sub(rf"\b{re.escape(name)}\b", f"@{i}", sentence)
    if version >= 4 and state:
        belief = Belief.parse(state)
        for ref, name in ((HELD_REF, belief.holding), (AT_REF, belief.at)):
            if name and name not in names and _NAMED.fullmatch(name):
                sentence = re.sub(rf"\b{re.escape(name)}\b", ref, sentence)
    return sentence


def without_references(sentence: str, action: str, state: str = "",
                       here: str | None = None) -> str:
    """The inverse of :func:`with_references` (every version's references).

    Raises:
        StateReferenceError: A reference to a name the action does not have,
            :data:`SEEN_REF` where ``state`` knows no list, :data:`LAYOUT_REF` where the prompt
            showed no layout (``here``), :data:`HELD_REF` where the player holds nothing, or
            :data:`AT_REF` where it is at no receptacle.
    """
    if sentence.strip() == HELP_REF:
        return HELP_TEXT
    if LAYOUT_REF in sentence:
        if here is None:
            raise StateReferenceError(f"{LAYOUT_REF}: the prompt showed no layout for what "
                                      f"{action!r} names")
        sentence = sentence.replace(LAYOUT_REF, here)
    if HELD_REF in sentence or AT_REF in sentence:
        belief = Belief.parse(state)
        for ref, name, what in ((HELD_REF, belief.holding, "holds nothing"),
                                (AT_REF, belief.at, "is at no receptacle")):
            if ref in sentence:
                if not name or not _NAMED.fullmatch(name):
                    raise StateReferenceError(f"{ref}: the player {what}")
                sentence = sentence.replace(ref, name)
    if SEEN_REF in sentence:
        known = known_list(state, action) if state else None
        if known is None:
            raise StateReferenceError(f"{SEEN_REF}: the state knows no objects of what "
                                      f"{action!r} names")
        sentence = sentence.replace(SEEN_REF, known)
    names = action_names(action)

    def name(m: re.Match[str]) -> str:
        i = int(m.group(1))
        if not 1 <= i <= len(names):
            raise StateReferenceError(f"@{i}: the action {action!r} names {len(names)} "
                                      "object(s) and receptacle(s)")
        return names[i - 1]

    return _REF.sub(name, sentence)


REVEAL_SAMPLING = {"temperature": 1.0, "top_p": 0.9}
"""How the answer of a step that may reveal is decoded."""


def may_reveal(state: str, action: str) -> bool:
    """Whether ``action`` may show what ``state`` does not know: going to a receptacle not
    visited yet, opening one whose contents are not known."""
    if not action.startswith(("go to ", "open ")) or not action_names(action):
        return False
    place = target_place(state, action)
    return place is None or (action.startswith("open ") and place.items is None)


def layout_list(layout: dict[str, list[str]] | None, state: str, action: str) -> str | None:
    """What the game's hidden ``layout`` puts in the receptacle ``action`` names last, as the
    game lists it, where the step may show it (:func:`may_reveal`); None elsewhere, or where
    the layout has no such receptacle. The layout is the start's: a receptacle shown, closed
    (the state forgets a closed receptacle's contents) and opened again may hold what the
    player put there meanwhile, and the answer then writes that list out."""
    if layout is None or not may_reveal(state, action):
        return None
    objects = layout.get(action_names(action)[-1])
    return None if objects is None else game_list(sorted(objects, key=game_order))


def apply_feedback(state: str, action: str, sentence: str) -> str:
    """The state after ``action`` answered with ``sentence`` (the game's own update)."""
    belief = Belief.parse(state)
    belief.update(action, sentence)
    return belief.render()


CODEC_VERSION = 6
"""The codec's current version; each adds to the one before. 2 has no goal checks (nor has a
model that recorded no version). 3 adds the goal checks line to the prompt. 4 adds the
references :data:`HELD_REF`, :data:`AT_REF` and :data:`HELP_REF` to the answer, the names the
model most often got wrong on ``look``, ``inventory`` and ``help``. 5 ends the checks with the
goal's state if the command works (``if it works: done``), so the model reads the reward off the
checks rather than copying its demonstrations' verdicts. 6 shows the game's hidden layout to a
step that may reveal it and writes the list as :data:`LAYOUT_REF`: a list sampled at a first
visit cannot be the game's, and a plan made on the real layout fails in a dream that put
things elsewhere (evidence: docs/history/results-2026-11-to-12.md)."""


class AlfworldCodec(PlainCodec):
    """:class:`~dreamgym_agents.experience.codec.PlainCodec` with the next state written as the
    feedback sentence, its names as the action's references (the module docstring); the
    demonstrations show their sentence the same way. From ``version`` 3 the prompt's last line
    before the answer spells out the goal's checks (:func:`~.goals.goal_checks`).

    Args:
        version: The codec version the model was trained with (``experience.codec_version``);
            None: :data:`CODEC_VERSION`.
        layout_for: A task's hidden layout (receptacle → objects at the start; the family's
            ``layout``), bound by :meth:`for_task` from version 6; None: never shown.
    """

    follows = (*PlainCodec.follows, "The game answers")

    def __init__(self, *args: Any, version: int | None = None,
                 layout_for: Callable[[Task], dict[str, list[str]] | None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = CODEC_VERSION if version is None else version
        self.layout_for = layout_for
        self.layout: dict[str, list[str]] | None = None

    def for_task(self, task: Task | None) -> AlfworldCodec:
        """From version 6, a copy with the task's hidden layout bound in (:func:`layout_list`
        shows it to the steps that may reveal it); itself before, or with no task."""
        if self.version < 6 or self.layout_for is None or task is None:
            return self
        bound = copy.copy(self)
        bound.layout = self.layout_for(task)
        return bound

    def here(self, state: str, action: str) -> str | None:
        """The ``here:`` list of this step (:func:`layout_list` of the bound layout)."""
        return layout_list(self.layout, state, action) if self.version >= 6 else None

    def render(self, intent: str, history: list[Any] | None, state: str, action: str,
               demos: list[Any] | None, *, history_steps: int, use_reasoning: bool,
               params: dict[str, str] | None = None,
               tally: tuple[int, int] | None = None) -> list[dict[str, str]]:
        messages = super().render(intent, history, state, action, demos,
                                  history_steps=history_steps, use_reasoning=use_reasoning,
                                  params=params, tally=tally)
        checks = (goal_checks(intent, state, action, if_it_works=self.version >= 5)
                  if self.version >= 3 else None)
        here = self.here(state, action)
        lines = ([f"here: {here}"] if here is not None else []) + \
            ([f"checks: {checks}"] if checks else [])
        if lines:
            body, _, last = messages[-1]["content"].rpartition("\n")
            messages[-1] = {**messages[-1], "content": "\n".join([body, *lines, last])}
        return messages

    def sampling(self, state: str, action: str) -> dict[str, Any]:
        """How this step's answer is decoded.

        Nucleus sampling (:data:`REVEAL_SAMPLING`) where the step may reveal
        (:func:`may_reveal`) and no layout is shown: what a receptacle shows when first seen is
        a draw from the game's layouts, and greedy decoding writes the likeliest list every
        time, never the task's object, and loops on long lists. Every other step follows from
        the state (or, from version 6, from the ``here:`` line), so it is greedy: sampling there
        writes wrong sentences (``You heat`` for ``cool``).

        What cannot be read back is a bad word of the step (``bad_words``). The gateway's local
        provider never writes them; a server is told them as ``llm.server_bad_words`` says.
        They are :data:`SEEN_REF` where the state knows no list for the receptacle the action
        names, and a reference to a name the action does not have (``@1`` answering ``help``).
        From version 4 they add ``@0`` (no name's reference), :data:`HELD_REF` where nothing is
        held, :data:`AT_REF` where the player is at no receptacle, and :data:`HELP_REF` but for
        ``help``. From version 6 :data:`LAYOUT_REF` is a bad word of every step shown no
        layout."""
        here = self.here(state, action)
        out: dict[str, Any] = dict(REVEAL_SAMPLING) \
            if may_reveal(state, action) and here is None else {}
        bad = [f"@{i}" for i in range(len(action_names(action)) + 1, MAX_NAMES + 1)]
        if known_list(state, action) is None:
            bad.append(SEEN_REF)
        if self.version >= 4:
            bad.append("@0")  # no such reference: the names count from @1
            belief = Belief.parse(state)
            bad += [ref for ref, name in ((HELD_REF, belief.holding), (AT_REF, belief.at))
                    if not (name and _NAMED.fullmatch(name))]
            if action.strip() != "help":
                bad.append(HELP_REF)
        if self.version >= 6 and here is None:
            bad.append(LAYOUT_REF)
        if bad:
            out["bad_words"] = bad
        return out

    def encode_state(self, target: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        return self._encode(target, state, pages, previous, action, self.here(state, action))

    def _encode(self, target: str, state: str, pages: list[str], previous: str | None,
                action: str, here: str | None) -> str:
        sentence = Belief.parse(target).feedback
        if sentence and apply_feedback(state, action, sentence) == target.strip():
            written = with_references(sentence, action, state, self.version, here)
            return f"{FEEDBACK_REF}\n{written}"
        return PlainCodec.encode_state(target, state, pages, previous, action)

    def expand_state(self, text: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        body = text.strip()
        first, _, rest = body.partition("\n")
        if first.strip() != FEEDBACK_REF:
            return PlainCodec.expand_state(text, state, pages, previous, action)
        sentence = " ".join(rest.split())
        if not sentence:
            raise StateReferenceError(f"{FEEDBACK_REF} without a sentence")
        # A written list is the game's: a sampled one may come out of order or repeat a name.
        return apply_feedback(state, action, in_game_order(
            without_references(sentence, action, state, self.here(state, action))))

    def demo_change(self, demo: Any) -> str:
        """A demonstration's change as the answer writes it (its sentence, referenced; never
        with this task's layout: a demonstration comes from another game)."""
        written = self._encode(demo.next_state, demo.state, [], None, demo.action, None)
        return written if written.startswith(FEEDBACK_REF) else super().demo_change(demo)

    def rationale(self, t: Any, intent: str = "", *, written_as: str | None = None,
                  pages: list[str] | None = None) -> str:
        if written_as is not None and written_as.strip() == FEEDBACK_REF:
            return f"The game answers the command. {verdict(t)}"
        return super().rationale(t, intent, written_as=written_as, pages=pages)
