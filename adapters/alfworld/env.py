"""The ALFWorld environment behind the environment contract.

``reset(task)`` makes (or reuses) the task's game and starts it; the observation is the abstract
state (:mod:`~dreamgym_agents.adapters.alfworld.belief`) and ``info["admissible"]`` the commands
the game accepts, both in the family's words whatever the game's release (:mod:`.dialect`).
``step(command)``: a command the game does not accept here is an invalid step
(recorded, the state unchanged), never an exception; an accepted one plays, and the episode ends
with reward 1 when the task is done. ALFWorld has no "stop" action: an episode ends on success or
at the step limit.

The game itself plays in a worker process of a :class:`~.host.GameHost` (one per core by
default): a game whose planner crashes, hangs or rejects its PDDL fails its own episode
(:class:`~dreamgym_agents.errors.UnplayableTaskError`), never the run; ``processes=0`` plays
in this process instead, one game step at a time under textworld's lock.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.adapters.alfworld.belief import Belief
from dreamgym_agents.adapters.alfworld.dialect import Dialect, canonical
from dreamgym_agents.adapters.alfworld.games import TEXTWORLD_LOCK
from dreamgym_agents.adapters.alfworld.host import (
    DEFAULT_TIMEOUT_S,
    GameFailedError,
    shared_host,
)
from dreamgym_agents.episodes.env import Observation, StepResult
from dreamgym_agents.errors import UnplayableTaskError
from dreamgym_agents.types import Task

HIDDEN_VERBS = ("slice",)
"""Commands the game grammar has but no ALFWorld task needs (ALFWorld leaves out slicing): not
offered, and invalid if written (their admissibility also reveals objects in closed
receptacles)."""


@dataclass(frozen=True)
class Command:
    """A parsed ALFWorld command: its verb and the whole text."""

    verb: str
    text: str
    is_terminal: bool = False
    answer: str | None = None


class AlfworldActionSet:
    """ALFWorld's text commands (``go to countertop 1``, ``take apple 1 from fridge 1`` …)."""

    VERBS = ("go", "open", "close", "take", "move", "put", "examine", "use", "heat", "clean",
             "cool", "look", "inventory", "help")

    def describe(self) -> str:
        return ("One command per turn, exactly as listed under 'Actions you can take now': "
                "go to X, open X, close X, take O from X, move O to X, examine X, use O, "
                "heat O with X, clean O with X, cool O with X, look, inventory.")

    def parse(self, text: str) -> list[Command]:
        """The command written, lower-cased with spaces collapsed, as a one-item list.
        ALFWorld 2020's ``put O in/on R`` reads as the family's ``move O to R`` (:mod:`.dialect`).

        Raises:
            ValueError: Not a command of the game's grammar (empty, or an unknown verb).
        """
        command = " ".join(str(text).strip().lower().split())
        verb = command.split(" ", 1)[0] if command else ""
        if verb not in self.VERBS:
            raise ValueError(f"not an ALFWorld command: {text!r} (expected one of the listed "
                             "actions, e.g. 'go to countertop 1')")
        return [Command(verb, canonical(command))]


def admissible_shown(commands: list[str]) -> list[str]:
    """The game's admissible commands an agent is offered (sorted, without hidden verbs)."""
    return sorted(c for c in commands if c.split(" ", 1)[0] not in HIDDEN_VERBS)


_GAME_FAILURES = (Exception, SystemExit)
"""What loading or playing a game may raise for a game that cannot be played: textworld's and
the planner's errors, and the ``SystemExit`` of Fast Downward's translator, which ends with it
on a PDDL it rejects (``Undeclared predicate: …``)."""


_UNSOLVABLE = ("its goal cannot be reached from its start (the planner's translator found the "
               "task unsolvable)")


def _reason(exc: BaseException) -> str:
    """Why a game could not be played, in one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, GameFailedError):
        if exc.kind == "KeyError" and exc.message in ("'val1'", "'val2'"):
            return _UNSOLVABLE
        return exc.message if exc.kind != "SystemExit" else f"the planner stopped: {exc.message}"
    if isinstance(exc, KeyError) and text in ("'val1'", "'val2'"):
        # Fast Downward's translator stands an unsolvable task in by a "dummy(val1)" atom,
        # which textworld then cannot name
        return _UNSOLVABLE
    return text if isinstance(exc, Exception) else f"the planner stopped: {text}"


_TEXTWORLD = TEXTWORLD_LOCK
"""The process-wide textworld lock (:data:`.games.TEXTWORLD_LOCK`)."""


class AlfworldEnv:
    """One ALFWorld game at a time (a family makes one per concurrent episode).

    Args:
        game_for: Makes (or finds) the game file of a task.
        expert: Play with the expert, whose plan from the current state is offered in
            ``info["expert_plan"]`` (what the oracle and noisy agents follow); it plans again
            each time the agent leaves the plan.
        processes: The game host's worker processes; None: one per core. 0 plays in this
            process, under textworld's lock, where a native crash ends the process.
        timeout: Seconds a game's start or step may take in a worker before it counts as hung.
    """

    provenance = "real"

    def __init__(self, game_for: Any, *, expert: bool = True, processes: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._host = shared_host(processes, timeout) if processes != 0 else None
        self.action_set = AlfworldActionSet()
        self._game_for = game_for
        self._expert = expert
        self._plan: list[str] = []
        self._game: Any = None
        self._belief = Belief()
        self._dialect = Dialect()
        self._admissible: list[str] = []
        self._lock = threading.Lock()
        self._done = True

    def reset(self, task: Task) -> Observation:
        from dreamgym_agents.adapters.alfworld.games import Game

        path = Path(self._game_for(task))
        with self._lock:
            self._close_game()
            try:
                self._dialect = Dialect.of_game(path)
                if self._host is not None:
                    self._game = self._host.game(path, expert=self._expert)
                    opening, info = self._game.reset()
                else:
                    with _TEXTWORLD:
                        self._game = Game(path, expert=self._expert)
                        opening, info = self._game.reset()
            except _GAME_FAILURES as exc:  # a game textworld or its planner cannot load
                self._close_game()
                raise UnplayableTaskError(f"ALFWorld game {path} could not start: "
                                          f"{_reason(exc)}") from None
            self._belief = Belief.start(opening)
            self._take_in(info)
            self._done = False
            return self._observation()

    def _observation(self, error: str = "") -> Observation:
        info: dict[str, Any] = {"admissible": list(self._admissible)}
        if self._expert:
            info["expert_plan"] = list(self._plan)
        return Observation(state=self._belief.render(), error=error, info=info)

    def step(self, action: str) -> StepResult:
        with self._lock:
            if self._game is None or self._done:
                raise RuntimeError("AlfworldEnv.step() called before reset() or after the end")
            try:
                command = self.action_set.parse(action)[0].text
            except ValueError as exc:
                return StepResult(self._observation(str(exc)), valid=False, error=str(exc))
            if command not in self._admissible:
                error = f"'{command}' is not possible here: choose one of the listed actions"
                return StepResult(self._observation(error), valid=False, error=error)
            try:
                with self._game_lock():
                    feedback, won, info = self._game.step(self._dialect.to_game(command))
            except _GAME_FAILURES as exc:  # the planner rejected the game mid-way
                self._done = True
                raise UnplayableTaskError(f"ALFWorld game {self._game.path} failed at "
                                          f"'{command}': {_reason(exc)}") from None
            feedback = self._dialect.feedback(command, feedback)
            self._belief.update(command, feedback)
            self._take_in(info)
            self._done = won
            return StepResult(self._observation(), reward=1.0 if won else 0.0, done=won,
                              success=won, info={"feedback": " ".join(feedback.split())})

    def _take_in(self, info: dict[str, Any]) -> None:
        """The game's admissible commands and the expert's plan, in the family's words."""
        words = self._dialect.from_game
        self._admissible = admissible_shown([words(c) for c in info["admissible_commands"]])
        self._plan = [words(c) for c in info["expert_plan"]]
        self._belief.notice_here(self._admissible)

    def _game_lock(self) -> Any:
        """textworld's lock where the game plays in this process (a worker needs none)."""
        return contextlib.nullcontext() if self._host is not None else _TEXTWORLD

    def _close_game(self) -> None:
        game, self._game = self._game, None
        if game is not None:
            with self._game_lock():
                game.close()

    def close(self) -> None:
        with self._lock:
            self._close_game()
            self._done = True
