"""The words of an ALFWorld release: one vocabulary for the family, translated at a game's edge.

ALFWorld's games say the same things in two ways. The games of its 2020 release (the official
``json_2.1.1`` files that ``alfworld-download`` fetches) put an object down with
``put O in/on R`` ("You put the O in/on the R.") and answer an arrival with the location's id
("You arrive at loc 23. On the desk 2, you see …"). The games this project makes with the
``alfworld`` wheel say ``move O to R`` ("You move the O to the R.") and "You arrive at desk 2.
On the desk 2, you see …", and know ``help``. Nothing else differs between the two grammars.

The family speaks the wheel's words everywhere: the belief state, the experience codec, the
policy's choices, the expert's plans and the dream. :class:`Dialect` translates where the game
is played (:class:`~dreamgym_agents.adapters.alfworld.env.AlfworldEnv`): a command into the
game's words, and the game's answer and admissible commands out of them, one to one. So a
policy, a recorded episode or an experience model is the same on both releases, and a command
written in either release's words is accepted (:func:`canonical`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

PUT_IN_ON_TEMPLATE = '"put {o} in/on {r}"'
"""The 2020 release's put-down command in a game's grammar (the wheel's: ``move {o} to {r}``)."""

_PUT = re.compile(r"^put ([a-z]+ \d+) in/on ([a-z]+ \d+)$")
_MOVE = re.compile(r"^move ([a-z]+ \d+) to ([a-z]+ \d+)$")
_GO = re.compile(r"^go to ([a-z]+ \d+)$")
_PUT_FEEDBACK = re.compile(r"^You put the ([a-z]+ \d+) in/on the ([a-z]+ \d+)\.")
_ARRIVE_AT_LOC = re.compile(r"^You arrive at loc \d+\.")
_NAMED_AFTER = re.compile(r"(?:On the|The) ([a-z]+ \d+)(?:,| is)")


def canonical(command: str) -> str:
    """A command in the family's words: ``put O in/on R`` becomes ``move O to R``; any other
    command is returned as it is."""
    if m := _PUT.match(command):
        return f"move {m.group(1)} to {m.group(2)}"
    return command


@dataclass(frozen=True)
class Dialect:
    """How one game words its commands and answers.

    Attributes:
        put_in_on: The 2020 release's words (``put O in/on R``, arrivals at ``loc N``); False:
            the wheel's, which are the family's own (nothing to translate).
    """

    put_in_on: bool = False

    @classmethod
    def of_grammar(cls, grammar: str) -> Dialect:
        """The dialect of a game's text grammar (its ``grammar`` field)."""
        return cls(put_in_on=PUT_IN_ON_TEMPLATE in grammar)

    @classmethod
    def of_game(cls, path: str | Path) -> Dialect:
        """The dialect of a ``game.tw-pddl`` file (the wheel's where it has no grammar)."""
        game = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls.of_grammar(str(game.get("grammar", "")))

    def to_game(self, command: str) -> str:
        """A command in the family's words, as this game writes it."""
        if self.put_in_on and (m := _MOVE.match(command)):
            return f"put {m.group(1)} in/on {m.group(2)}"
        return command

    def from_game(self, command: str) -> str:
        """A command the game admits, in the family's words."""
        return canonical(command) if self.put_in_on else command

    def feedback(self, command: str, text: str) -> str:
        """The game's answer to ``command`` (the family's words) in the family's words: a put
        as a move, and an arrival at ``loc N`` as an arrival at the receptacle gone to (the
        command's, else the one the answer goes on to describe)."""
        if not self.put_in_on:
            return text
        if m := _PUT_FEEDBACK.match(text):
            return f"You move the {m.group(1)} to the {m.group(2)}." + text[m.end():]
        if m := _ARRIVE_AT_LOC.match(text):
            target = _GO.match(command)
            named = target.group(1) if target else None
            if named is None and (after := _NAMED_AFTER.search(text, m.end())):
                named = after.group(1)
            if named is not None:
                return f"You arrive at {named}." + text[m.end():]
        return text
