"""ALFWorld games: generated offline (seeded), checked solvable, played through textworld.

A game is a folder ``<root>/<layout>/<task type>-s<seed>/`` holding ``game.tw-pddl`` and
``traj_data.json``. The first is textworld's PDDL game: the wheel's domain and grammar, the
generated problem, the planner's walkthrough. The second is what ALFWorld's experts read next to
a game file. The official ALFWorld game
files (``ALFWORLD_DATA``) have the same layout and play through the same :class:`Game`.

Generation is deterministic in (seed, task type, layout); a game is written once and reused
(``<root>`` is a cache). :func:`generate_game` replays the expert's plan before it keeps a game:
every kept game is solvable.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.adapters.alfworld.layouts import build_problem
from dreamgym_agents.adapters.alfworld.planner import (
    enable_pddl_cache,
    fast_expert_wrapper,
    fast_plan,
    logic_texts,
)
from dreamgym_agents.errors import EnvError, MissingExtraError

logger = logging.getLogger(__name__)

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"


@dataclass(frozen=True)
class GameSpec:
    """What makes one generated game: its seed, task type and room layout."""

    seed: int
    task_type: str
    layout: str

    @property
    def folder(self) -> str:
        return f"{self.layout}/{self.task_type}-s{self.seed}"


def _textworld() -> tuple[Any, Any]:
    try:
        import textworld
        import textworld.gym
    except ImportError:
        raise MissingExtraError("textworld", "alfworld") from None
    return textworld, textworld.gym


TEXTWORLD_LOCK = threading.RLock()
"""textworld's PDDL loading and stepping share parser state across threads: two games started
(or generated) at once corrupt it for the whole process ("pop from empty list", grammar errors
on later games). Every call into textworld holds this lock: a game's generation here, and each
reset, step and close of a game (:mod:`.env`). A step is short next to an agent's turn, so
concurrent episodes mostly wait on the agent, not on each other."""


def generate_game(spec: GameSpec, root: str | Path) -> Path:
    """Write the game of ``spec`` under ``root`` unless it is there; return its game file.

    Raises:
        EnvError: The planner found no plan for it (it is not kept).
    """
    with TEXTWORLD_LOCK:  # generated in a worker thread when an episode meets a new game
        return _generate_game(spec, root)


def game_text(spec: GameSpec) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """The game of ``spec`` before it is compiled or planned (fast, deterministic):
    ``(PDDL problem, grammar with the task, metadata, traj_data)``; ``metadata["task_desc"]``
    is its task sentence.

    Raises:
        ValueError: The task type is not feasible in the layout.
    """
    from alfworld.agents.utils.misc import add_task_to_grammar

    problem, meta = build_problem(spec.seed, spec.task_type, spec.layout)
    _, grammar = logic_texts()
    traj_data = {"task_type": spec.task_type,
                 "scene": {"floor_plan": f"FloorPlan{meta['floorplan']}"},
                 "pddl_params": {k: meta[k] for k in ("object_target", "parent_target",
                                                      "toggle_target", "mrecep_target",
                                                      "object_sliced")}}
    # add_task_to_grammar draws the task's wording with the global ``random``: seed it here so
    # the game stays deterministic, and give the caller its state back
    saved = random.getstate()
    try:
        random.seed(f"{spec.seed}|{spec.task_type}|{spec.layout}|goal")
        grammar = add_task_to_grammar(grammar, traj_data)
    finally:
        random.setstate(saved)
    meta["task_desc"] = grammar.split("Your task is to: ", 1)[1].split('."', 1)[0]
    return problem, grammar, meta, traj_data


def _kept_game_is_whole(path: Path) -> bool:
    """Whether a game kept in the cache reads as a solvable game (a truncated or broken file,
    an interrupted write say, is made again)."""
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("solvable"))
    except (OSError, ValueError, AttributeError):
        logger.warning("the kept game %s does not read: making it again", path)
        return False


def _generate_game(spec: GameSpec, root: str | Path) -> Path:
    folder = Path(root) / spec.folder
    path = folder / GAME_FILE
    if path.exists() and _kept_game_is_whole(path):
        return path
    problem, grammar, meta, traj_data = game_text(spec)
    domain, _ = logic_texts()
    game = {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem,
            "solvable": None, "walkthrough": None, "dreamgym": meta}
    folder.mkdir(parents=True, exist_ok=True)
    # ALFWorld's experts open traj_data.json next to the game, whichever expert plays
    write_atomic(folder / TRAJ_FILE, json.dumps({**traj_data, "dreamgym": meta}))
    tmp = _tmp_name(folder / GAME_FILE)
    try:
        tmp.write_text(json.dumps(game), encoding="utf-8")
        plan = _checked_plan(tmp)
        if not plan:
            raise EnvError(f"no plan solves the generated game {spec.folder}")
        game.update(solvable=True, walkthrough=plan)
        write_atomic(path, json.dumps(game))
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _tmp_name(path: Path) -> Path:
    """A temporary name beside ``path`` that no other process or thread uses (runs on one
    machine share the games' cache: two may make the same game at once)."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a
    part (raises ``OSError`` where the folder cannot be written)."""
    tmp = _tmp_name(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


_PDDL_ENV: Any = None


def _checked_plan(game_path: Path) -> list[str]:
    """The fast expert's plan from the start, replayed in the full game: the plan when it wins,
    else []."""
    global _PDDL_ENV
    textworld, _ = _textworld()
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    enable_pddl_cache()
    if _PDDL_ENV is None:
        _PDDL_ENV = AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True)),
                                    shuffle=False)
    _PDDL_ENV.load(str(game_path))
    state = _PDDL_ENV.reset()
    problem = json.loads(game_path.read_text(encoding="utf-8"))["pddl_problem"]
    plan = fast_plan(state["_facts"], problem, state["_entity_infos"])
    for command in plan:
        if command not in state["admissible_commands"]:
            return []
        state, _, _ = _PDDL_ENV.step(command)
    return plan if state["won"] else []


def task_description(game_path: str | Path) -> str:
    """The game's task sentence (``put a clean spoon in drawer``), from its grammar."""
    return description_of(json.loads(Path(game_path).read_text(encoding="utf-8")))


def description_of(game: dict[str, Any]) -> str:
    """The task sentence of a game file's parsed content (:func:`task_description`)."""
    meta = game.get("dreamgym") or {}
    if meta.get("task_desc"):
        return str(meta["task_desc"])
    grammar = str(game.get("grammar", ""))
    if "Your task is to: " in grammar:
        return grammar.split("Your task is to: ", 1)[1].split('."', 1)[0]
    return ""


class Game:
    """One ALFWorld game played through textworld.gym with ALFWorld's wrappers.

    ``reset() -> (observation, info)`` and ``step(command) -> (observation, won, info)``;
    ``info`` holds ``admissible_commands``, ``expert_plan`` (the fast expert's plan from here;
    empty without an expert) and ``won``; with ``facts``, ``contents`` too (what each receptacle
    holds now, the game's hidden layout: :func:`first_look`).
    """

    def __init__(self, game_path: str | Path, *, max_steps: int = 1000,
                 expert: bool = True, facts: bool = False) -> None:
        textworld, gym = _textworld()
        try:
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ImportError:
            raise MissingExtraError("alfworld", "alfworld") from None
        enable_pddl_cache()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts,
                                   extras=["gamefile"])
        wrappers: list[Any] = [AlfredDemangler(shuffle=False), AlfredInfos]
        if expert:
            wrappers.append(fast_expert_wrapper()())
            infos.extras.append("expert_plan")
        env_id = gym.register_game(str(game_path), request_infos=infos, batch_size=1,
                                   asynchronous=False, max_episode_steps=max_steps,
                                   wrappers=wrappers)
        self.env = gym.make(env_id)
        self.path = str(game_path)

    @staticmethod
    def _info(infos: dict[str, Any]) -> dict[str, Any]:
        plan = infos.get("extra.expert_plan")
        out = {"admissible_commands": list(infos["admissible_commands"][0]),
               "expert_plan": list(plan[0]) if plan is not None else [],
               "won": bool(infos["won"][0])}
        if infos.get("facts") is not None:
            contents: dict[str, list[str]] = {}
            for fact in infos["facts"][0]:
                if fact.name == "receptacleatlocation":  # every receptacle, empty ones too
                    contents.setdefault(fact.arguments[0].name, [])
                elif fact.name == "inreceptacle":
                    obj, receptacle = (v.name for v in fact.arguments)
                    contents.setdefault(receptacle, []).append(obj)
            out["contents"] = contents
        return out

    def reset(self) -> tuple[str, dict[str, Any]]:
        observations, infos = self.env.reset()
        return observations[0], self._info(infos)

    def step(self, command: str) -> tuple[str, bool, dict[str, Any]]:
        observations, _, _, infos = self.env.step([command])
        info = self._info(infos)
        return observations[0], info["won"], info

    def close(self) -> None:
        self.env.close()


def first_look(game_path: str | Path) -> tuple[str, dict[str, list[str]]]:
    """A game as a player finds it, read in one load without playing a step: its opening
    text, and what each receptacle of the room holds at the start (receptacle → objects, names
    as the game writes them): the hidden layout, read from the game's facts."""
    with TEXTWORLD_LOCK:
        game = Game(game_path, expert=False, facts=True)
        try:
            opening, info = game.reset()
        finally:
            game.close()
    return opening, info["contents"]


def games_root() -> Path:
    """Where generated games are cached: ``$DG_CACHE_DIR/alfworld-games`` (or the default
    cache)."""
    from dreamgym_agents.cache import cache_root

    return cache_root() / "alfworld-games"


def official_root() -> Path | None:
    """ALFWorld's official games (``$ALFWORLD_DATA/json_2.1.1``), when present."""
    data = os.environ.get("ALFWORLD_DATA")
    if not data:
        return None
    root = Path(data) / "json_2.1.1"
    return root if root.is_dir() else None
