"""The experience codec of τ²'s transcripts.

A step adds the agent's own line (``Call N: <the call>``, ``Said N: <the message>``), which
follows from the state and the action, then what answers it (``Result N: …`` from the tool,
``User N: …`` from the customer). The answer writes only the latter, unnumbered::

    Result: Airplane Mode is now OFF. / Status Bar: …

and the codec puts the step's own line and the numbers back: the model spends no tokens on
what it cannot get wrong, and cannot renumber or rewrite the calls before, as a
:class:`~dreamgym_agents.experience.codec.PlainCodec` answer's ``+ Call 1: …`` edit could.
``(nothing)``: nothing answers (solo ``done()``). A next state of another shape is written as
``PlainCodec`` writes it.

From version 3 the prompt also shows the task's hidden starting world: the calls τ² made to
set it up (``initialization_actions``: telecom's device faults, the line's data use), which no
state shows. Telecom's 114 tasks share 5 tickets and differ only there, so without it the
model can only guess whether a toggle fixes the device or breaks it. These are the
environment's facts, as a simulator must know them (ALFWorld's codec 6 binds its hidden
layout the same way); the task's evaluation criteria, its gold actions and assertions, are
never shown.
"""

from __future__ import annotations

import copy
from typing import Any

from dreamgym_agents.episodes.env import normalize_text
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.experience.codec import (
    PlainCodec,
    StateReferenceError,
    verdict,
)
from dreamgym_agents.types import Task, Transition

VERSION = 2
"""The codec of this module. Other versions (a model whose manifest says none: the shipped
bundle's) are ``PlainCodec``; until a bundle trained with it ships, version 2 or 3 is chosen
by name (``experience_recipe.codec_version: 3``)."""
START_VERSION = 3
"""From this version the prompt shows the task's starting world (:func:`start_of`)."""
VERSIONS = (VERSION, START_VERSION)
_SETUP_ONLY = frozenset({"simulate_network_search"})
"""Set-up calls that change nothing a tool shows (they refresh what the others set)."""
NOTHING = "(nothing)"
ANSWERS = ("Result", "User")
"""Who answers a step: the tool, the customer."""
_OWN = ("Call ", "Said ")
_HEAD_CHARS = 80


def _lines(state: str) -> list[str]:
    return [ln.rstrip() for ln in state.strip().splitlines() if ln.strip()]


def start_of(task: Task) -> str:
    """The calls τ² made to set ``task``'s world up, in its functional form, ``; `` between
    them (empty for a task τ² does not know)."""
    from dreamgym_agents.adapters.tau2.data import domain_tasks

    domain, tau2_id = str(task.config.get("domain", "")), str(task.config.get("tau2_id", ""))
    try:
        found = domain_tasks(domain).get(tau2_id)
    except ConfigError:  # a domain τ² lacks: nothing is known of its start
        return ""
    setup = getattr(getattr(found, "initial_state", None), "initialization_actions", None)
    calls = []
    for call in setup or ():
        if call.func_name in _SETUP_ONLY:
            continue
        values = ", ".join(f"{k}={v}" for k, v in (call.arguments or {}).items())
        calls.append(f"{call.func_name}({values})")
    return "; ".join(calls)


class Tau2Codec(PlainCodec):
    """:class:`~dreamgym_agents.experience.codec.PlainCodec` with the next state written as
    the lines that answer the step (see the module docstring); a state's head, in the prompt's
    history, is its last line. From :data:`START_VERSION`, bound to a task
    (:meth:`for_task`), its prompt shows the task's starting world."""

    follows = ("The tool answers", "The customer answers", "Nothing answers",
               *PlainCodec.follows)

    def __init__(self, action_set: Any, environment: str, version: int = VERSION) -> None:
        super().__init__(action_set, environment)
        self.version = version
        self.start = ""

    def for_task(self, task: Task | None) -> Tau2Codec:
        if self.version < START_VERSION or task is None:
            return self
        bound = copy.copy(self)
        bound.start = start_of(task)
        return bound

    def task_lines(self) -> list[str]:
        if self.version >= START_VERSION and self.start:
            return [f"world at start: {self.start}"]
        return []

    def head(self, state: str) -> str:
        lines = _lines(state)
        return lines[-1][:_HEAD_CHARS] if lines else "(empty)"

    def own_line(self, state: str, action: str) -> tuple[int, str] | None:
        """The step's number and the line the agent's ``action`` adds to ``state`` (None: an
        action the action set does not read)."""
        parsed = self._parsed(action)
        if not parsed:
            return None
        turn = sum(1 for ln in _lines(state) if ln.startswith(_OWN)) + 1
        act = parsed[0]
        text = (f"Said {turn}: {normalize_text(act.text)}" if act.is_message
                else f"Call {turn}: {act.written()}")
        return turn, text

    def encode_state(self, target: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        own = self.own_line(state, action)
        before, after = _lines(state), _lines(target)
        if own is not None and after[:len(before) + 1] == [*before, own[1]]:
            written = []
            for line in after[len(before) + 1:]:
                head, sep, body = line.partition(": ")
                role = head.split(" ", 1)[0]
                if role not in ANSWERS or head != f"{role} {own[0]}" or not sep:
                    break
                written.append(f"{role}: {body}")
            else:
                return "\n".join(written) or NOTHING
        return super().encode_state(target, state, pages, previous, action)

    def expand_state(self, text: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        body = text.strip()
        if not body or body.startswith("@") or not body.startswith((*ANSWERS, NOTHING)):
            return super().expand_state(text, state, pages, previous, action)
        own = self.own_line(state, action)
        if own is None:
            raise StateReferenceError(f"{action!r} is no action of this domain: no step line")
        lines = [*_lines(state), own[1]]
        if body != NOTHING:
            for line in _lines(body):
                role, sep, content = line.partition(": ")
                if role not in ANSWERS or not sep:
                    raise StateReferenceError(f"{line!r} is not a {' or '.join(ANSWERS)} line")
                lines.append(f"{role} {own[0]}: {content.strip()}")
        return "\n".join(lines)

    def rationale(self, t: Transition, intent: str = "", *, written_as: str | None = None,
                  pages: list[str] | None = None) -> str:
        if written_as is not None and written_as.strip().startswith((*ANSWERS, NOTHING)):
            who = ("Nothing answers" if written_as.strip() == NOTHING else
                   "The customer answers" if written_as.startswith("User") else
                   "The tool answers")
            return f"{who}. {verdict(t)}"
        return super().rationale(t, intent, written_as=written_as, pages=pages)


def tau2_codec(action_set: Any, domain: str, version: int | None = None) -> PlainCodec:
    """The codec a τ² model trained with codec ``version`` reads: :class:`Tau2Codec` for
    :data:`VERSIONS`, else ``PlainCodec`` (None included: the shipped bundle's)."""
    environment = f"a {domain} customer-service conversation with tools (τ²-bench)"
    if version in VERSIONS:
        return Tau2Codec(action_set, environment, version)
    return PlainCodec(action_set, environment)
