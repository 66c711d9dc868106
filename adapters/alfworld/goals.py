"""ALFWorld's goals, read from a task's wording and checked on the abstract state.

A game's goal is a PDDL condition on where objects are and what was done to them; its wording
(``Your task is to: …``) names everything the condition needs, so the goal of each of ALFWorld's
six task types is checked on the player's :class:`~dreamgym_agents.adapters.alfworld.belief.Belief`:

- put (pick & place): an object of the kind in a receptacle of the kind;
- clean / heat / cool, then put: such an object, with that property, in such a receptacle;
- pick two: two objects of the kind in one receptacle of the kind;
- examine in light: an object of the kind held where a lamp of the kind is on.

This is the family's one reading of a task's goal. The searcher and the decoy act on it
(:mod:`~dreamgym_agents.adapters.alfworld.agents`). It spells out, for a step, what the task
asks and where it stands (:func:`goal_checks`, shown in the experience model's prompt from codec
version 3). It measures what the dream rewards against what the game would: :func:`goal_met`
agrees with the game's reward, as the tests check on recorded transitions. The dream's reward
stays the experience model's own.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from dreamgym_agents.adapters.alfworld.belief import PROPERTY, Belief, action_names, kind_of

_ON = r"(?:in|on|in/on)(?: the)?"
_SOME = r"(?:a|an|some|the)"
_WORDINGS = (
    (re.compile(rf"^(?:find|put) two (\w+)(?: and put them)? {_ON} (\w+)$"), "two"),
    (re.compile(rf"^(clean|heat|cool) {_SOME} (\w+) and put it {_ON} (\w+)$"), "change"),
    (re.compile(rf"^(?:put|place) {_SOME} (clean|hot|cool|cold) (\w+) {_ON} (\w+)$"), "state"),
    (re.compile(rf"^(?:put|place) {_SOME} (\w+) {_ON} (\w+)$"), "put"),
    (re.compile(rf"^(?:examine|look at) {_SOME}? ?(\w+) (?:with|under) the (\w+)$"), "light"),
)
_ADJECTIVE = {"clean": "clean", "hot": "hot", "cool": "cool", "cold": "cool"}


@dataclass(frozen=True)
class Goal:
    """What a task asks for.

    Attributes:
        kind: The object's kind (``apple``).
        receptacle: The receptacle's kind (``fridge``); empty for examine-in-light.
        needs: The property the object must have (``clean``, ``hot``, ``cool``), or ``""``.
        count: How many such objects (2 for pick two).
        lamp: The lamp's kind for examine-in-light (``desklamp``), else ``""``.
    """

    kind: str
    receptacle: str = ""
    needs: str = ""
    count: int = 1
    lamp: str = ""

    @classmethod
    def parse(cls, intent: str) -> Goal | None:
        """The goal of a task's wording (None: a wording none of the six types uses)."""
        text = " ".join(intent.lower().strip().rstrip(".").split())
        for pattern, form in _WORDINGS:
            m = pattern.match(text)
            if not m:
                continue
            if form == "two":
                return cls(m.group(1), m.group(2), count=2)
            if form == "change":
                return cls(m.group(2), m.group(3), needs=PROPERTY[m.group(1)])
            if form == "state":
                return cls(m.group(2), m.group(3), needs=_ADJECTIVE[m.group(1)])
            if form == "put":
                return cls(m.group(1), m.group(2))
            return cls(m.group(1), lamp=m.group(2))
        return None

    def fits(self, obj: str, belief: Belief) -> bool:
        """Whether ``obj`` is an object the goal wants, with the property it needs."""
        return kind_of(obj) == self.kind and (
            not self.needs or self.needs in belief.properties.get(obj, []))

    def placed(self, belief: Belief) -> int:
        """The most objects that fit in one receptacle of the goal's kind (what a put task has
        done so far)."""
        return max((sum(self.fits(o, belief) for o in place.items or [])
                    for name, place in belief.places.items()
                    if kind_of(name) == self.receptacle), default=0)

    def lit_at(self, place: str, belief: Belief) -> bool:
        """Whether a lamp of the goal's kind is known to be on at ``place``."""
        known = belief.places.get(place)
        return known is not None and any(kind_of(o) == self.lamp
                                         and "on" in belief.properties.get(o, [])
                                         for o in known.items or [])

    def role(self, name: str, belief: Belief) -> str:
        """What ``name`` (an object or a receptacle) is to the goal, in a few words."""
        kind = kind_of(name)
        if self.fits(name, belief):
            return "fits"
        if kind == self.kind:
            return f"the goal's kind, not {self.needs}"
        if self.lamp and kind == self.lamp:
            return "the goal's lamp"
        if self.lamp and self.lit_at(name, belief):
            return f"where a {self.lamp} is on"
        if self.receptacle and kind == self.receptacle:
            return "the goal's place"
        return "other"

    def describe(self) -> str:
        """The goal in the checks' words (``2 clean soapbar in bathtubbasin``)."""
        if self.lamp:
            return f"a {self.kind} held where a {self.lamp} is on"
        needs = f"{self.needs} " if self.needs else ""
        return f"{self.count} {needs}{self.kind} in {self.receptacle}"

    def met(self, state: str | Belief) -> bool:
        """Whether ``state`` satisfies the goal."""
        belief = state if isinstance(state, Belief) else Belief.parse(state)
        if self.lamp:
            return bool(belief.holding) and kind_of(belief.holding) == self.kind and \
                self.lit_at(belief.at, belief)
        return self.placed(belief) >= self.count


def goal_met(intent: str, state: str | Belief) -> bool | None:
    """Whether ``state`` satisfies the goal of ``intent`` (None: the wording is not known)."""
    goal = Goal.parse(intent)
    return None if goal is None else goal.met(state)


_SUCCESS = (  # the game's sentence when the command works (what Belief.update reads)
    (re.compile(r"^take ([a-z]+ \d+) from ([a-z]+ \d+)$"), "You pick up the {0} from the {1}."),
    (re.compile(r"^move ([a-z]+ \d+) to ([a-z]+ \d+)$"), "You move the {0} to the {1}."),
    (re.compile(r"^(clean|heat|cool) ([a-z]+ \d+) with ([a-z]+ \d+)$"),
     "You {0} the {1} using the {2}."),
    (re.compile(r"^use ([a-z]+ \d+)$"), "You turn on the {0}."),
    (re.compile(r"^go to ([a-z]+ \d+)$"), "You arrive at {0}."),
)


def met_if_it_works(goal: Goal, belief: Belief, action: str) -> bool:
    """Whether the goal holds after ``action`` if the game carries it out, read from the
    sentence the game answers a working command with; a command that changes nothing leaves the
    goal as it is. Whether it works (the object held, the receptacle open, the lamp here) is the
    experience model's to say."""
    command = " ".join(action.lower().split())
    after = copy.deepcopy(belief)
    for pattern, sentence in _SUCCESS:
        if m := pattern.match(command):
            after.update(command, sentence.format(*m.groups()))
            break
    return goal.met(after)


def goal_checks(intent: str, state: str, action: str, *,
                if_it_works: bool = False) -> str | None:
    """What can be read off the task, the state and the command about the goal, as one line
    (None: a wording of no task type). It gives the goal; how far it is, which for a put task
    is how many fitting objects one receptacle of its kind still lacks and for examine whether
    a lamp of its kind is on here; what the player holds; and what each name of the command is
    to the goal, by the codec's references (``@1 fits; @2 the goal's place``, or a receptacle
    where the goal's lamp is on):

        checks: goal 2 clean soapbar in bathtubbasin; 1 to go; holding fits; @1 fits;
        @2 the goal's place

    With ``if_it_works`` (codec version 5) the line ends with what the goal would be after the
    command if the game carries it out (:func:`met_if_it_works`: ``if it works: done`` or
    ``if it works: not done``), so that the task's verdict is the model's answer to one
    question, whether the command works, rather than a composition of the checks.

    The experience model still decides what the game answers and whether the task is done
    (a move fails when the object is not held, a lamp turned on elsewhere lights nothing). The
    line exists because a model trained from scratch does not compose these from the task line
    and the state, and rewards moves that miss the goal (evidence:
    docs/history/results-2026-11-to-12.md); the web family's answer checks spell out what a page
    shows for the same reason."""
    goal = Goal.parse(intent)
    if goal is None:
        return None
    belief = Belief.parse(state)
    parts = [f"goal {goal.describe()}"]
    if goal.lamp:
        parts.append(f"{goal.lamp} on here: {'yes' if goal.lit_at(belief.at, belief) else 'no'}")
    else:  # how many are missing (a count to compare, not two: "1 to go" is the last one)
        parts.append(f"{max(0, goal.count - goal.placed(belief))} to go")
    parts.append("holding " + (goal.role(belief.holding, belief) if belief.holding
                               else "nothing"))
    parts += [f"@{i} {goal.role(name, belief)}" for i, name in enumerate(action_names(action), 1)]
    if if_it_works:
        parts.append("if it works: " + ("done" if met_if_it_works(goal, belief, action)
                                        else "not done"))
    return "; ".join(parts)
