"""The ALFWorld abstract state: what the player knows, rendered as a few lines of text.

ALFWorld answers each command with one sentence of feedback ("You arrive at countertop 1. On the
countertop 1, you see a soapbar 4, and a spraybottle 1."). An agent that sees only the last
sentence must remember the rest; the abstract state keeps it instead, so a turn is a function of
the state alone (the policy conditions on its turn, the experience model on a state):

    Task: put two soapbar in bathtubbasin.
    Room: bathtubbasin 1, cabinet 1, cabinet 2, countertop 1, fridge 1, toilet 1
    At: countertop 1
    Holding: soapbar 3 (clean)
    Feedback: You arrive at countertop 1. On the countertop 1, you see a soapbar 4, and a …
    Seen bathtubbasin 1: nothing
    Seen cabinet 1: (closed)
    Seen fridge 1: (open) apple 2, apple 1 (cool), egg 2
    Seen countertop 1: soapbar 4, spraybottle 1

``Room`` lists every receptacle (the opening's; it does not change) and one ``Seen`` line per
receptacle visited says what is known of it, in the order first seen; a receptacle without one
is unvisited. So a step changes a few short lines: the experience model writes a state as edits
of keyed lines, a new line going last (:func:`~dreamgym_agents.experience.codec.apply_edits`),
and never copies a long list that a step rewrites, which a small model's greedy decoding loops
on. Objects are listed in the game's own order (kind, then the higher number first), so a
``Seen`` line and the game's sentence about the same receptacle list the same objects in the
same order.

The state is a deterministic function of the feedback sentences (:meth:`Belief.update`), so the
dream only has to predict the next sentence: :meth:`Belief.update` turns it into the next state,
as the real environment does. :meth:`Belief.admissible` derives the commands the game accepts
from the state (the game's grammar); tests check it against textworld's own list.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

_ITEM = re.compile(r"\ba ([a-z]+ \d+)")
_ARRIVE = re.compile(r"^You arrive at ([a-z]+ \d+)\.")
_ON = re.compile(r"On the ([a-z]+ \d+), you see (.*)$")
_OPEN_IN = re.compile(r"The ([a-z]+ \d+) is open\. In it, you see (.*)$")
_CLOSED = re.compile(r"The ([a-z]+ \d+) is closed\.")
_OPENED = re.compile(r"^You open the ([a-z]+ \d+)\.")
_CLOSE = re.compile(r"^You close the ([a-z]+ \d+)\.")
_TAKE = re.compile(r"^You pick up the ([a-z]+ \d+) from the ([a-z]+ \d+)\.")
_MOVE = re.compile(r"^You (?:move|put) the ([a-z]+ \d+) (?:to|in|on) the ([a-z]+ \d+)\.")
_CHANGE = re.compile(r"^You (clean|heat|cool) the ([a-z]+ \d+) using the ([a-z]+ \d+)\.")
_TURN_ON = re.compile(r"^You turn on the ([a-z]+ \d+)\.")
_CARRY = re.compile(r"^You are carrying: (.*)$")
_ROOM = re.compile(r"Looking quickly around you, you see (.*?)\.\s*$", re.M)
_TASK = re.compile(r"Your task is to: (.*?)\s*$", re.M)
FIXED = frozenset({"bathtub", "curtains", "houseplant", "mirror", "showerglass", "sink",
                   "television", "window"})
"""Object kinds a game may show on a receptacle that no command picks up: in ALFWorld's official
games every object of these kinds lacks the ``pickupable`` fact (a 2020 countertop shows a
``sink 1``); lamps are used, not taken."""
PROPERTY = {"clean": "clean", "heat": "hot", "cool": "cool"}
TOOLS = {"sinkbasin": "clean", "microwave": "heat", "fridge": "cool"}


@dataclass(frozen=True)
class Rules:
    """ALFRED's object tables, by the lower-case kind names the game shows (``soapbar``,
    ``sinkbasin``): what each receptacle can hold, which objects can be cleaned, heated or
    cooled, which receptacles open and which objects are lamps."""

    can_contain: dict[str, frozenset[str]]
    abilities: dict[str, frozenset[str]]
    openable: frozenset[str]
    lamps: frozenset[str]

    @classmethod
    def alfred(cls) -> Rules:
        """The tables of ``alfworld.gen.constants`` (the ``alfworld`` extra)."""
        from dreamgym_agents.adapters.alfworld.layouts import alfred

        c = alfred()
        low = str.lower
        return cls(
            can_contain={low(r): frozenset(map(low, objs))
                         for r, objs in c.VAL_RECEPTACLE_OBJECTS.items()},
            abilities={verb: frozenset(map(low, c.VAL_ACTION_OBJECTS[key]))
                       for verb, key in (("clean", "Cleanable"), ("heat", "Heatable"),
                                         ("cool", "Coolable"))},
            openable=frozenset(map(low, c.OPENABLE_CLASS_SET)),
            lamps=frozenset(map(low, c.VAL_ACTION_OBJECTS["Toggleable"])))


def items_of(text: str) -> list[str]:
    """``a soapbar 4, and a spraybottle 1.`` → ``["soapbar 4", "spraybottle 1"]``; ``nothing.``
    → ``[]``."""
    return _ITEM.findall(text)


@dataclass
class Place:
    """What the player knows of one receptacle: open, closed or a surface, and what is in it
    (None: not known — a closed receptacle not opened yet)."""

    status: str = "surface"
    items: list[str] | None = None


@dataclass
class Belief:
    """The player's knowledge of one game (see the module docstring)."""

    task: str = ""
    at: str = ""
    here: list[str] = field(default_factory=list)
    """Other receptacles at the player's location (a 2020 game can place two at one: the
    countertop beside the sinkbasin gone to), as the game's commands show them
    (:meth:`notice_here`); always empty in the wheel's games."""
    holding: str = ""
    receptacles: list[str] = field(default_factory=list)
    places: dict[str, Place] = field(default_factory=dict)
    properties: dict[str, list[str]] = field(default_factory=dict)
    feedback: str = ""

    # -- from the game ------------------------------------------------------------------------

    @classmethod
    def start(cls, observation: str) -> Belief:
        """The state of a game's opening text (the room's receptacles and the task)."""
        belief = cls()
        room = _ROOM.search(observation)
        belief.receptacles = sorted(items_of(room.group(1)), key=_order) if room else []
        task = _TASK.search(observation)
        belief.task = task.group(1).strip() if task else ""
        first = next((line for line in observation.splitlines()
                      if line.startswith("You are in the middle")), "")
        belief.feedback = first.strip()
        return belief

    def update(self, command: str, feedback: str) -> None:
        """Take in the game's answer to ``command``."""
        text = " ".join(feedback.split())
        self.feedback = text
        if m := _ARRIVE.match(text):
            self.at, self.here = m.group(1), []
            self._see(text)
        elif m := _OPENED.match(text):
            self._see(text)
        elif m := _CLOSE.match(text):
            self._place(m.group(1)).status = "closed"
        elif m := _TAKE.match(text):
            obj, where = m.groups()
            self.holding = obj
            place = self._place(where)
            if place.items is not None and obj in place.items:
                place.items.remove(obj)
        elif m := _MOVE.match(text):
            obj, where = m.groups()
            self.holding = ""
            place = self._place(where)
            place.items = sorted({*(place.items or []), obj}, key=game_order)
        elif m := _CHANGE.match(text):
            verb, obj, _ = m.groups()
            props = self.properties.setdefault(obj, [])
            if PROPERTY[verb] not in props:
                props.append(PROPERTY[verb])
        elif m := _TURN_ON.match(text):
            props = self.properties.setdefault(m.group(1), [])
            if "on" not in props:
                props.append("on")
        elif m := _CARRY.match(text):
            found = items_of(m.group(1))
            self.holding = found[0] if found else ""
        elif text.startswith("You are not carrying anything"):
            self.holding = ""
        elif text.startswith("On the "):  # examine a receptacle
            self._see(text)

    def notice_here(self, commands: list[str]) -> None:
        """Take in which other receptacles the game treats as here: those it lets the player
        examine (``examine countertop 2`` while at the sinkbasin beside it), and whether one
        never seen is open or closed (the game offers to close it or to open it)."""
        offered = set(commands)
        named = {c[len("examine "):] for c in offered if c.startswith("examine ")}
        self.here = sorted((r for r in named if r in self.receptacles and r != self.at),
                           key=_order)
        for name in self.here:
            if name not in self.places and f"open {name}" in offered:
                self.places[name] = Place(status="closed")
            elif name not in self.places and f"close {name}" in offered:
                self.places[name] = Place(status="open")

    def _see(self, text: str) -> None:
        if m := _ON.search(text):
            self._place(m.group(1)).items = sorted(items_of(m.group(2)), key=game_order)
            self._place(m.group(1)).status = "surface"
        elif m := _OPEN_IN.search(text):
            place = self._place(m.group(1))
            place.status, place.items = "open", sorted(items_of(m.group(2)), key=game_order)
        elif m := _CLOSED.search(text):
            self._place(m.group(1)).status = "closed"

    def _place(self, name: str) -> Place:
        if name not in self.receptacles:
            self.receptacles = sorted({*self.receptacles, name}, key=_order)
        return self.places.setdefault(name, Place())

    # -- as text ------------------------------------------------------------------------------

    def render(self) -> str:
        """The state as the models see it (the module docstring's lines)."""
        held = self._named([self.holding])[0] if self.holding else "nothing"
        lines = [f"Task: {self.task}",
                 f"Room: {', '.join(self.receptacles) or 'unknown'}",
                 f"At: {self.at or 'the middle of the room'}",
                 *([f"{ALSO_HERE}{', '.join(self.here)}"] if self.here else []),
                 f"Holding: {held}",
                 f"Feedback: {self.feedback}"]
        for name, place in self.places.items():  # first seen first
            if place.status == "closed":
                value = "(closed)"
            else:
                value = "unknown" if place.items is None else \
                    ", ".join(self._named(place.items)) or "nothing"
                value = f"(open) {value}" if place.status == "open" else value
            lines.append(f"{SEEN}{name}: {value}")
        return "\n".join(lines)

    def _named(self, objects: list[str]) -> list[str]:
        return [f"{o} ({', '.join(self.properties[o])})" if self.properties.get(o) else o
                for o in objects]

    @classmethod
    def parse(cls, state: str) -> Belief:
        """Read a rendered state back (the inverse of :meth:`render`)."""
        fields = {}
        belief = cls()
        for line in state.splitlines():
            key, sep, value = line.partition(": ")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if key.startswith(SEEN):
                belief.places[key[len(SEEN):]] = _read_place(value, belief.properties)
            else:
                fields[key] = value
        belief.task, belief.feedback = fields.get("Task", ""), fields.get("Feedback", "")
        at = fields.get("At", "")
        belief.at = "" if at == "the middle of the room" else at
        here = fields.get(ALSO_HERE.rstrip(": "), "")
        belief.here = here.split(", ") if here else []
        holding, props = _split_props(fields.get("Holding", "nothing"))
        belief.holding = "" if holding == "nothing" else holding
        if props:
            belief.properties[holding] = props
        names = set(belief.places)
        room = fields.get("Room", "unknown")
        names |= set() if room == "unknown" else set(room.split(", "))
        if belief.at:
            names.add(belief.at)
        names |= set(belief.here)
        belief.receptacles = sorted(names, key=_order)
        return belief

    # -- the game's grammar -------------------------------------------------------------------

    def admissible(self, rules: Rules) -> list[str]:
        """The commands the game accepts in this state (its grammar and ``rules``, applied to
        what the player knows), sorted."""
        out = {"look", "inventory", "help"}
        present = [self.at, *self.here] if self.at else []
        for name in self.receptacles:
            if name not in present:
                out.add(f"go to {name}")
        if self.holding:
            out.add(f"examine {self.holding}")
        held = kind_of(self.holding) if self.holding else ""
        for name in present:
            place = self.places.get(name, Place())
            kind = kind_of(name)
            out.add(f"examine {name}")
            if kind in rules.openable:
                out.add(f"close {name}" if place.status == "open" else f"open {name}")
            visible = (place.items or []) if place.status != "closed" else []
            for obj in visible:
                if kind_of(obj) in rules.lamps:
                    out.add(f"use {obj}")
                elif not self.holding and kind_of(obj) not in FIXED:
                    out.add(f"take {obj} from {name}")
            if held and place.status != "closed" and held in rules.can_contain.get(kind, ()):
                out.add(f"move {self.holding} to {name}")
            verb = TOOLS.get(kind)
            if held and verb and held in rules.abilities[verb]:
                out.add(f"{verb} {self.holding} with {name}")
        return sorted(out)


ALSO_HERE = "Also here: "
"""The head of the line naming the other receptacles at the player's location (2020 games)."""
SEEN = "Seen "
"""The head of a receptacle's line (``Seen fridge 1: (open) apple 1``)."""
_ITEMS_SPLIT = re.compile(r", (?![^()]*\))")  # commas outside an object's (properties)


def _read_place(value: str, properties: dict[str, list[str]]) -> Place:
    """A ``Seen`` line's value (its objects' properties go to ``properties``)."""
    if value == "(closed)":
        return Place(status="closed")
    status = "surface"
    if value.startswith("(open)"):
        status, value = "open", value[len("(open)"):].strip()
    if value == "unknown":
        return Place(status=status)
    items = []
    for item in ([] if value in ("", "nothing") else _ITEMS_SPLIT.split(value)):
        obj, obj_props = _split_props(item)
        items.append(obj)
        if obj_props:
            properties[obj] = obj_props
    return Place(status=status, items=items)


def _split_props(text: str) -> tuple[str, list[str]]:
    if text.endswith(")") and " (" in text:
        name, props = text[:-1].split(" (", 1)
        return name, props.split(", ")
    return text, []


def kind_of(name: str) -> str:
    return name.rsplit(" ", 1)[0]


_NAME = re.compile(r"\b[a-z]+ \d+\b")


def action_names(action: str) -> list[str]:
    """The objects and receptacles a command names, in its order (the codec's ``@1``, ``@2``
    …)."""
    return _NAME.findall(action)


def _order(name: str) -> tuple[str, int]:
    kind, _, number = name.rpartition(" ")
    return (kind, int(number)) if number.isdigit() else (name, 0)


def game_order(name: str) -> tuple[str, int]:
    """The order the game lists the objects a receptacle shows in: by kind, then the higher
    number first (``apple 2, apple 1, egg 1``)."""
    kind, number = _order(name)
    return kind, -number


_SEES = re.compile(r"(you see )(.*?)(\.?)$")


def listed(sentence: str) -> str | None:
    """The list of objects a sentence shows (``a apple 2, and a egg 1``), None if it shows none."""
    m = _SEES.search(sentence)
    return m.group(2) if m else None


def with_listed(sentence: str, text: str) -> str:
    """``sentence`` with the list of objects it shows replaced by ``text``."""
    return _SEES.sub(lambda m: m.group(1) + text + m.group(3), sentence, count=1)


def game_list(objects: list[str]) -> str:
    """Objects as the game's sentence lists them (``a apple 2, and a egg 1``; ``nothing``)."""
    if not objects:
        return "nothing"
    named = [f"a {o}" for o in objects]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + ", and " + named[-1]


def in_game_order(sentence: str) -> str:
    """A feedback sentence with the list of objects it shows as the game writes it: in
    :func:`game_order`, each object once. The game's own sentences already are; a sentence with
    its kinds renamed, or one a model wrote, may not be."""
    shown = listed(sentence)
    if shown is None:
        return sentence
    objects = dict.fromkeys(items_of(shown))  # an object is one thing: listed once
    return with_listed(sentence, game_list(sorted(objects, key=game_order)))


@functools.cache
def _rules() -> Rules:
    return Rules.alfred()


def admissible_in(state: str) -> list[str]:
    """The commands the game accepts in a rendered state (none for a text that is not one)."""
    try:
        return Belief.parse(state).admissible(_rules())
    except (ValueError, KeyError):
        return []


def rename_words(text: str, names: dict[str, str]) -> str:
    """``text`` with each whole word that is a key of ``names`` (object and receptacle kinds:
    ``soapbar``) replaced by its value, all at once (``{"a": "b", "b": "a"}`` swaps)."""
    if not names:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
                         + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], text)


def renamed_state(state: str, names: dict[str, str]) -> str:
    """A rendered state with object and receptacle kinds renamed (:func:`rename_words`), its
    lists sorted again as the game sorts them (``Room``, each ``Seen`` line's objects and the
    feedback sentence's: :func:`game_order`)."""
    belief = Belief.parse(rename_words(state, names))
    for place in belief.places.values():
        if place.items is not None:
            place.items.sort(key=game_order)
    belief.feedback = in_game_order(belief.feedback)
    return belief.render()


class AlfworldStateFormat:
    """:class:`~dreamgym_agents.episodes.env.StateFormat` of the rendered belief state."""

    @staticmethod
    def start_key(task: Any) -> str:
        """A task's game: its episodes start from the game's opening."""
        game = task.config.get("game")
        return json.dumps(game, sort_keys=True) if game else ""

    @staticmethod
    def initial_state(task: Any) -> str:
        """The state before anything is seen (the room's receptacles unknown)."""
        return Belief(task=str(task.intent).strip().rstrip(".") + ".",
                      feedback="You are in the middle of a room.").render()

    @staticmethod
    def admissible(state: str) -> list[str]:
        """The commands the game accepts in a rendered state (:func:`admissible_in`)."""
        return admissible_in(state)

    @staticmethod
    def for_task(state: str, task: Any) -> str:
        """A start state recorded for another game of the same room, with ``task``'s goal (a
        curriculum variant starts from its seed's opening)."""
        line = "Task: " + str(task.intent).strip().rstrip(".") + "."
        return re.sub(r"^Task: .*$", lambda _: line, state, count=1, flags=re.M)

    @staticmethod
    def reveals(state: str, next_state: str) -> bool:
        """Whether ``next_state`` shows the contents of a receptacle ``state`` does not know
        (arriving at an unvisited one, opening a closed one never opened): a game's hidden
        layout, which no model can predict from the state."""
        before, after = Belief.parse(state).places, Belief.parse(next_state).places
        return any(place.items is not None and place.status != "closed" and
                   (name not in before or before[name].items is None)
                   for name, place in after.items())

    @staticmethod
    def location(state: str) -> str:
        return next((line[4:].strip() for line in state.splitlines() if line.startswith("At: ")),
                    "")

    @staticmethod
    def strip_ids(line: str) -> str:
        return line  # object numbers are the game's, and the model sees them
