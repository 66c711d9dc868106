"""The ALFWorld environment behind the environment contract.

``reset(task)`` makes (or reuses) the task's game and starts it; the observation is the abstract
state (:mod:`~dreamgym_agents.adapters.alfworld.belief`) and ``info["admissible"]`` the commands
the game accepts. ``step(command)``: a command the game does not accept here is an invalid step
(recorded, the state unchanged), never an exception; an accepted one plays, and the episode ends
with reward 1 when the task is done. ALFWorld has no "stop" action: an episode ends on success or
at the step limit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.adapters.alfworld.belief import Belief
from dreamgym_agents.adapters.alfworld.games import TEXTWORLD_LOCK
from dreamgym_agents.episodes.env import Observation, StepResult
from dreamgym_agents.errors import EnvError
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
        """The command written (lower-cased, spaces collapsed), as a one-item list.

        Raises:
            ValueError: Not a command of the game's grammar (empty, or an unknown verb).
        """
        command = " ".join(str(text).strip().lower().split())
        verb = command.split(" ", 1)[0] if command else ""
        if verb not in self.VERBS:
            raise ValueError(f"not an ALFWorld command: {text!r} (expected one of the listed "
                             "actions, e.g. 'go to countertop 1')")
        return [Command(verb, command)]


def admissible_shown(commands: list[str]) -> list[str]:
    """The game's admissible commands an agent is offered (sorted, without hidden verbs)."""
    return sorted(c for c in commands if c.split(" ", 1)[0] not in HIDDEN_VERBS)


_TEXTWORLD = TEXTWORLD_LOCK
"""The process-wide textworld lock (:data:`.games.TEXTWORLD_LOCK`)."""


class AlfworldEnv:
    """One ALFWorld game at a time (a family makes one per concurrent episode).

    Args:
        game_for: Makes (or finds) the game file of a task.
        expert: Play with the expert, whose plan from the current state is offered in
            ``info["expert_plan"]`` (what the oracle and noisy agents follow); planning costs
            ~0.2 s each time the agent leaves the plan.
    """

    provenance = "real"

    def __init__(self, game_for: Any, *, expert: bool = True) -> None:
        self.action_set = AlfworldActionSet()
        self._game_for = game_for
        self._expert = expert
        self._plan: list[str] = []
        self._game: Any = None
        self._belief = Belief()
        self._admissible: list[str] = []
        self._lock = threading.Lock()
        self._done = True

    def reset(self, task: Task) -> Observation:
        from dreamgym_agents.adapters.alfworld.games import Game

        path = Path(self._game_for(task))
        with self._lock:
            self._close_game()
            try:
                with _TEXTWORLD:
                    self._game = Game(path, expert=self._expert)
                    opening, info = self._game.reset()
            except Exception as exc:  # a game textworld cannot load: the setup's fault
                raise EnvError(f"ALFWorld game {path} could not start: {exc}") from exc
            self._belief = Belief.start(opening)
            self._admissible = admissible_shown(info["admissible_commands"])
            self._plan = info["expert_plan"]
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
            with _TEXTWORLD:
                feedback, won, info = self._game.step(command)
            self._belief.update(command, feedback)
            self._admissible = admissible_shown(info["admissible_commands"])
            self._plan = info["expert_plan"]
            self._done = won
            return StepResult(self._observation(), reward=1.0 if won else 0.0, done=won,
                              success=won, info={"feedback": " ".join(feedback.split())})

    def _close_game(self) -> None:
        if self._game is not None:
            with _TEXTWORLD:
                self._game.close()
            self._game = None

    def close(self) -> None:
        with self._lock:
            self._close_game()
            self._done = True
