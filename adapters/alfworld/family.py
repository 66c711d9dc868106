"""The ``alfworld`` task family: ALFWorld's household tasks, the paper's second benchmark.

Tasks come from ``tasks/alfworld/{train,validation,test}.json`` (generated games, see
:mod:`~dreamgym_agents.adapters.alfworld.taskgen`): train and validation on ALFRED's seen room
layouts, test on its unseen ones (ALFWorld's ``valid_unseen``). A task names its game (seed,
task type, layout); the game file is generated on first use and cached. With ``ALFWORLD_DATA``
pointing at ALFWorld's official games, ``--tasks $ALFWORLD_DATA/json_2.1.1/valid_unseen`` loads
them (every playable ``game.tw-pddl`` below the folder: :func:`official_tasks`); they are played
in the family's words (:mod:`.dialect`), and one that cannot be played fails as its own episode.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dreamgym_agents.adapters.alfworld.host import DEFAULT_TIMEOUT_S
from dreamgym_agents.episodes.env import (
    EnvConfig,
    Environment,
    Requirement,
    env_options,
    every_nth,
)
from dreamgym_agents.errors import ConfigError, EnvError, MissingExtraError
from dreamgym_agents.pipeline.embedded import NoRecipeOptions
from dreamgym_agents.types import Task

if TYPE_CHECKING:
    from dreamgym_agents.episodes.agent import Agent
    from dreamgym_agents.episodes.env import ActionSet
    from dreamgym_agents.experience.codec import ExperienceCodec
    from dreamgym_agents.policy.model import PolicyView

logger = logging.getLogger(__name__)

FAMILY = "alfworld"
SPLITS = ("train", "validation", "test")
OFFICIAL_SPLITS = ("valid_seen", "valid_unseen")
"""ALFWorld's own evaluation splits (its official games, with ``ALFWORLD_DATA``): held out like
validation and test (:attr:`AlfworldFamily.held_out_splits`)."""
OFFICIAL_TRAIN_SPLITS = {"valid_train": "valid_train", "official_train": "train"}
"""ALFWorld's official training games, by split name → folder of ``json_2.1.1``: ``valid_train``
(a sample of them that ALFWorld evaluates on-train with) and ``official_train`` (its whole
``train`` folder, 3,553 games; the family's own ``train`` split is its generated games). A run
trains on them with ``--set train_split=…``."""
TASK_DIR = "alfworld"
OFFICIAL_MAX_STEPS = 50
"""The step limit of ALFWorld's own evaluation of its official games."""


def _require() -> None:
    try:
        import alfworld  # noqa: F401
        import textworld  # noqa: F401
    except ImportError:
        raise MissingExtraError("alfworld", "alfworld") from None


def task_from_config(config: dict[str, Any], split: str = "") -> Task:
    """A task of a generated game's config (``game``: seed, task type, layout; ``intent``) or
    of an official game file (``game_file``)."""
    return Task(task_id=str(config["task_id"]), family=FAMILY, intent=str(config["intent"]),
                split=split, config=config, template=str(config.get("intent_template") or ""))


@dataclass(frozen=True)
class AlfworldRecipeOptions(NoRecipeOptions):
    """ALFWorld's own embedded recipe option (``--set experience_recipe.decoy_tasks=…``).

    Attributes:
        decoy_tasks: Train games the decoy plays (a near miss, then the expert).
    """

    left_out_at_zero: ClassVar[tuple[str, ...]] = ("decoy_tasks",)
    legacy_key_fields: ClassVar[dict[str, Any]] = {
        "quitter_tasks": 0, "explorer_tasks": 0, "explorer_pages": 3, "explorer_steps": 27,
        "order_explorer_tasks": 0}
    """The web's fields the shared recipe had when ALFWorld's keys were fixed (none of them
    ALFWorld's: in its keys only, so its shipped bundle's key holds)."""

    decoy_tasks: int = 0


@dataclass
class AlfworldEnvOptions:
    """ALFWorld's environment settings (``--set env.<name>=…``).

    Attributes:
        expert: Offer the PDDL planner's plan in each observation (what the oracle follows);
            False saves the planning when no agent needs it.
        processes: Worker processes that play the games (:mod:`.host`; None: one per core): a
            game whose planner crashes or hangs fails its own episode, never the run. 0 plays
            them in the run's process, one step at a time.
        game_timeout_s: Seconds a game's start or one of its steps may take in a worker before
            the game counts as hung (its episode fails with that reason).
    """

    expert: bool = True
    processes: int | None = None
    game_timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.processes is not None and self.processes < 0:
            raise ConfigError(f"env.processes must be 0 (in this process) or more, not "
                              f"{self.processes}")
        if self.game_timeout_s <= 0:
            raise ConfigError(f"env.game_timeout_s must be above 0, not {self.game_timeout_s}")


class AlfworldFamily:
    """ALFWorld: generated games (or the official ones) played through textworld."""

    name = FAMILY
    env_options = AlfworldEnvOptions
    recipe_options = AlfworldRecipeOptions
    held_out_splits = ("validation", "test", *OFFICIAL_SPLITS)
    """The splits no training may see: the generated validation and test games, and ALFWorld's
    official evaluation games where they are present."""
    rl_episode_steps = 15
    """An RL episode's step limit in the presets: as long as an evaluation's (the expert's plans
    take 3-9 commands; the web's 10 would leave a policy one wrong command to spare)."""

    def __init__(self) -> None:
        self._kept: dict[str, Any] = {}
        self._kept_lock = threading.Lock()
        self._game_locks: dict[str, threading.Lock] = {}

    def load_tasks(self, split: str) -> list[Task]:
        """The generated games of ``split`` (:data:`SPLITS`), or ALFWorld's official games of
        one of :data:`OFFICIAL_SPLITS` or :data:`OFFICIAL_TRAIN_SPLITS`
        (``$ALFWORLD_DATA/json_2.1.1/<folder>``)."""
        if split in OFFICIAL_SPLITS or split in OFFICIAL_TRAIN_SPLITS:
            from dreamgym_agents.adapters.alfworld.games import official_root

            folder = OFFICIAL_TRAIN_SPLITS.get(split, split)
            root = official_root()
            if root is None or not (root / folder).is_dir():
                raise ConfigError(f"ALFWorld's official {split} games are not here: point "
                                  "ALFWORLD_DATA at the folder that holds json_2.1.1/"
                                  f"{folder} (as alfworld-download leaves it)")
            return official_tasks(root / folder, split)
        if split not in SPLITS:
            known = (*SPLITS, *OFFICIAL_SPLITS, *OFFICIAL_TRAIN_SPLITS)
            raise ConfigError(f"split must be one of {', '.join(known)}, got {split!r}")
        ref = resources.files("dreamgym_agents.tasks") / TASK_DIR / f"{split}.json"
        with resources.as_file(ref) as path:
            if not Path(path).is_file():
                raise ConfigError(f"no ALFWorld {split} tasks shipped at {path}")
            return [task_from_config(c, split) for c in json.loads(Path(path).read_text())]

    def load_task_file(self, path: str) -> list[Task]:
        """A JSON task file of this family, or a folder of official ``game.tw-pddl`` files
        (:func:`official_tasks`)."""
        folder = Path(path)
        if folder.is_dir():
            return official_tasks(folder)
        if not folder.is_file():
            raise ConfigError(f"task file not found: {path}")
        return [task_from_config(c) for c in json.loads(folder.read_text())]

    @staticmethod
    def standard_max_steps(tasks: list[Task]) -> int | None:
        """ALFWorld's own step limit (50, as its evaluation plays) where every task is an
        official game; None (the command's default) otherwise."""
        official = [official_trial(t) is not None for t in tasks]
        return OFFICIAL_MAX_STEPS if official and all(official) else None

    def instance_key(self, task: Task) -> tuple[str, ...]:
        """What makes a task the same task: its game (many games share a sentence such as
        'put a clean soapbar in shelf', in other rooms). An official game is its ALFRED trial
        (``<task folder>/trial_…``, the same wherever the data lies), never a generated one."""
        game = task.config.get("game") or {}
        if game:
            return ("game", str(game.get("layout")), str(game.get("task_type")),
                    str(game.get("seed")))
        trial = official_trial(task)
        if trial is not None:
            return ("official", *trial)
        return ("file", str(task.config.get("game_file", task.task_id)))

    def game_path(self, task: Task) -> Path:
        """The task's game file (generated and cached on first use)."""
        from dreamgym_agents.adapters.alfworld.games import GameSpec, games_root, generate_game

        if task.config.get("game_file"):
            return Path(task.config["game_file"])
        spec = _spec_of(task)
        if spec is None:
            raise ConfigError(f"task {task.task_id}: config.game needs seed, task_type and "
                              "layout (or give game_file)")
        return generate_game(GameSpec(*spec), games_root())

    def prepare(self, cfg: EnvConfig, tasks: list[Task] | None = None) -> str:
        """Check the extra; make the games of ``tasks`` not made yet (a few seconds each)."""
        _require()
        for task in tasks or []:
            self.game_path(task)
        from dreamgym_agents.adapters.alfworld.games import games_root

        return f"ALFWorld games (generated offline, cached in {games_root()})"

    def read_openings(self, tasks: list[Task], workers: int | None = None) -> int:
        """Before a dream: read the first look (:meth:`first_look`: what :meth:`opening` and
        :meth:`layout` give) of each generated game of ``tasks`` that has none kept beside it,
        in ``workers`` processes at once (None: one per core), and keep it there. The dream's
        first step of a game then waits on no textworld load, which costs seconds of CPU and
        runs one at a time under the process's textworld lock. Official games (nothing is
        written in their folder) are read when first asked. Returns how many were read."""
        import concurrent.futures
        import multiprocessing

        from dreamgym_agents.adapters.alfworld.games import GAME_FILE, GameSpec, games_root

        root = games_root()
        todo: dict[str, tuple[Task, Path, tuple[int, str, str] | None]] = {}
        for task in tasks:
            spec = _spec_of(task)
            if spec is None:  # an official game, or a task the family cannot make
                continue
            game = root / GameSpec(*spec).folder / GAME_FILE
            kept = _kept_file("start", game)
            if kept is not None and not kept.is_file():
                # a game not made yet is made by the worker that reads it
                todo.setdefault(str(game), (task, kept, None if game.is_file() else spec))
        if not todo:
            return 0
        workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
        if workers == 1:
            for task, _, _ in todo.values():
                self.first_look(task)
            return len(todo)
        context = multiprocessing.get_context("spawn")  # textworld and torch in a forked child
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            looks = pool.map(_make_and_look, list(todo), [spec for _, _, spec in todo.values()],
                             [str(root)] * len(todo))
            for (task, kept, _), look in zip(todo.values(), looks, strict=True):
                if isinstance(look, str):
                    logger.warning("could not load the game of %s: %s", task.task_id, look)
                elif not kept.is_file():
                    _write_quietly(kept, json.dumps(look))
        return len(todo)

    def requirements(self) -> list[Requirement]:
        """The alfworld and textworld packages (``make install-alfworld``), where generated
        games are cached, and whether the official games are configured (``ALFWORLD_DATA``)."""
        from dreamgym_agents.cli.doctor import dist_version

        rows = []
        for dist in ("alfworld", "textworld"):
            version = dist_version(dist)
            rows.append(Requirement(dist, version is not None, version or
                                    "missing: make install-alfworld (pip install "
                                    "'dreamgym-agents[alfworld]')"))
        from dreamgym_agents.adapters.alfworld.games import games_root

        rows.append(Requirement("games", None, f"generated on first use into {games_root()}"))
        official = os.environ.get("ALFWORLD_DATA")
        rows.append(Requirement("ALFWORLD_DATA", None, official or
                                "not set (the official json_2.1.1 games load when it is)"))
        return rows

    def make_env(self, cfg: EnvConfig) -> Environment:
        from dreamgym_agents.adapters.alfworld.env import AlfworldEnv

        options = env_options(self, cfg)
        return AlfworldEnv(self.game_path, expert=options.expert, processes=options.processes,
                           timeout=options.game_timeout_s)

    @staticmethod
    def agent_env_options(agent: Any) -> dict[str, Any]:
        """The expert plans only for an agent that follows its plan (``needs_expert``): for
        any other agent the plan, made again at each step, is CPU spent on what nobody reads."""
        return {"expert": bool(getattr(agent, "needs_expert", False))}

    def opening(self, task: Task) -> str | None:
        """The task's real opening state (the game's first observation: the room's
        receptacles and the goal), read without playing a step (:meth:`first_look`): the dream
        starts a task no recorded episode starts from here rather than in a room it must
        invent. None when the game cannot be made."""
        look = self.first_look(task)
        return None if look is None else look["opening"]

    def layout(self, task: Task) -> dict[str, list[str]] | None:
        """What each receptacle of the task's game holds at its start (receptacle → objects),
        read without playing a step (:meth:`first_look`), with a renamed copy's names
        (``config["renames"]``). From codec version 6 the experience model is shown it where a
        step may reveal a receptacle's contents. None when the game cannot be made."""
        from dreamgym_agents.adapters.alfworld.belief import rename_words
        from dreamgym_agents.adapters.alfworld.rename import RENAMES

        look = self.first_look(task)
        if look is None:
            return None
        contents = look["contents"]
        names = task.config.get(RENAMES) or {}
        if not names:
            return contents
        return {rename_words(r, names): [rename_words(o, names) for o in objects]
                for r, objects in contents.items()}

    def first_look(self, task: Task) -> dict[str, Any] | None:
        """The task's game as a player finds it, from one load of the game, kept
        (:meth:`_per_game`): ``opening`` is the state its first observation gives, as
        :meth:`make_env`'s reset renders it; ``contents`` is its start's hidden layout
        (:func:`.games.first_look`). None when the game cannot be made or loaded."""
        def read(game: Path) -> dict[str, Any] | None:
            look = _read_first_look(str(game))
            if isinstance(look, str):
                logger.warning("could not load the game of %s: %s", task.task_id, look)
                return None
            return look

        return self._per_game("start", task, read, json.dumps, json.loads)

    def _per_game(self, what: str, task: Task, read: Any, dump: Any, load: Any) -> Any:
        """``read(game)`` of the task's game, once: kept in memory and, for the games
        generated here, beside the game as ``<what>-<renderer key>.txt``. The key names the code
        that reads it, so a changed reader reads the game again. The official games' folder is
        never written."""
        key = what + json.dumps(task.config.get("game") or task.config.get("game_file"),
                                sort_keys=True)
        with self._kept_lock:  # one lock per game: other games load meanwhile
            lock = self._game_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._kept:
                return self._kept[key]
            try:
                game = self.game_path(task)
            except (ConfigError, EnvError):
                self._kept[key] = None
                return None
            kept = _kept_file(what, game)
            if kept is not None and kept.is_file():
                value = load(kept.read_text(encoding="utf-8"))
            else:
                value = read(game)
                if value is not None and kept is not None:
                    _write_quietly(kept, dump(value))
            self._kept[key] = value
            return value

    def action_set(self) -> ActionSet:
        from dreamgym_agents.adapters.alfworld.env import AlfworldActionSet

        return AlfworldActionSet()

    def offline_agents(self, seed: int = 0, noise: float = 0.3) -> dict[str, Agent]:
        """``oracle`` (the expert's plan), ``noisy`` (random detours at rate ``noise``),
        ``searcher`` (acts on what it has seen), ``decoy`` (a near miss, then the expert;
        ``decoy-searcher``: then the searcher) and ``random`` (a random admissible command)."""
        from dreamgym_agents.adapters.alfworld.agents import offline_agents

        return offline_agents(seed, noise)

    @staticmethod
    def task_keys(task: Task) -> set[str]:
        """A task is its game: the same instruction ("put a mug in cabinet") recurs across
        games and rooms, train and test alike (ALFWorld's protocol), and is not held out by
        that alone."""
        game = task.config.get("game")
        if game:
            return {f"game:{json.dumps(game, sort_keys=True)}"}
        trial = official_trial(task)
        if trial is not None:
            return {"official:" + "/".join(trial)}
        return {f"game_file:{task.config.get('game_file') or task.task_id}"}

    def task_generator(self, tasks: list[Task], seed: int) -> tuple[Any, None]:
        """The curriculum's variants: new games of a seed's type in its room
        (:class:`.curriculum.AlfworldTaskGenerator`), feasible by construction; never a
        validation or test game."""
        from dreamgym_agents.adapters.alfworld.curriculum import AlfworldTaskGenerator

        held: list[Task] = []
        for split in ("validation", "test"):
            try:
                held += self.load_tasks(split)
            except ConfigError:
                continue  # a split this task set does not have
        return AlfworldTaskGenerator(tasks, seed, avoid=held), None

    eval_types = ("goal",)
    """One kind of evaluator: the game's goal conditions (the PDDL goal of the task)."""

    dream_eval_types = None
    """The dream trains on every task: the outcome is the visible state's goal."""

    @staticmethod
    def task_eval_types(task: Task) -> list[str]:
        """Every ALFWorld task is judged by its game's goal."""
        del task
        return ["goal"]

    @staticmethod
    def state_success(task: Task, state: str) -> bool | None:
        """Whether ``state`` satisfies the task's goal (:mod:`…alfworld.goals`: it agrees with
        the game's reward on every recorded transition); None for a wording of no task type."""
        from dreamgym_agents.adapters.alfworld.goals import goal_met

        return goal_met(task.intent, state)

    @staticmethod
    def state_format() -> Any:
        """Text-game states: no location, no ids; a task's start is its game."""
        from dreamgym_agents.adapters.alfworld.belief import AlfworldStateFormat

        return AlfworldStateFormat()

    @staticmethod
    def policy_view() -> PolicyView:
        """The state as it is; decoding constrained to the commands the game accepts in it
        (:meth:`~.belief.Belief.admissible`). They derive from the state alone, so the dream's
        states constrain the same way."""
        from dreamgym_agents.adapters.alfworld.belief import admissible_in
        from dreamgym_agents.policy.model import PlainView

        return PlainView(options=admissible_in)

    def experience_codec(self, version: int | None = None) -> ExperienceCodec:
        """Short text states, the next one written as the game's feedback sentence with the
        action's names as references (:class:`.codec.AlfworldCodec`). From version 3 the goal's
        checks come before the answer; from 5 they end with whether the command would meet the
        goal; from 6 the prompt shows the game's hidden layout where a step may reveal it
        (:meth:`layout`). ``version``: the one the model was trained with; None: the latest."""
        from dreamgym_agents.adapters.alfworld.codec import AlfworldCodec

        return AlfworldCodec(self.action_set(), "a household text game",
                             head_prefixes=("At:", "Holding:"), version=version,
                             layout_for=self.layout)

    @staticmethod
    def embedded_recipe_defaults() -> dict[str, Any]:
        """Expert, noisy-expert and random episodes, and the decoy's near misses (a wrong
        object or place, then the expert) on 240 train games. No quitter and no explorers:
        every command the game accepts is listed, and episodes end only at the goal. No
        relabelled endings (:meth:`relabel`); longer episodes than a web task's. State version
        4: a ``Room`` line and one ``Seen`` line per receptacle visited, objects in the game's
        order (:mod:`~dreamgym_agents.adapters.alfworld.belief`). Two renamed copies of each
        episode (:meth:`renamed`) triple the examples. Codec version 6: the next state written
        as the feedback sentence with references, the goal's checks before the answer and the
        game's hidden layout where a step may reveal it (:meth:`experience_codec`). Examples
        whose reward differs from their demonstrations' four times (``contrast_repeat``);
        3,000 SFT steps (evidence: docs/history/results-2026-11-to-12.md)."""
        return {"oracle_tasks": 120, "noisy_tasks": 80, "random_tasks": 40, "max_steps": 30,
                "state_version": 4, "codec_version": 6, "entity_swaps": 2,
                "decoy_tasks": 240, "contrast_repeat": 4, "max_examples": 18000,
                "sft_steps": 3000}

    collectors = ("oracle", "noisy", "random", "decoy")
    """The collectors of :meth:`collection_plan`, in the order their episodes are read."""

    experience_only = ("decoy",)
    """Collectors whose episodes teach the experience model only: a warm start that imitated
    the decoy would make its near miss first."""

    def collection_plan(self, recipe: Any, tasks: list[Task]) -> list[tuple[str, Any, list, int]]:
        """(collector, agent, its train tasks, step limit): the expert, the noisy expert, the
        random agent and the decoy (a near miss, then the expert) on the recipe's counts of
        train tasks, spread over the split; a collector with none is left out."""
        agents = self.offline_agents(seed=recipe.seed, noise=recipe.noise)
        counts = {"oracle": recipe.oracle_tasks, "noisy": recipe.noisy_tasks,
                  "random": recipe.random_tasks, "decoy": recipe.options.decoy_tasks}
        return [(name, agents[name], every_nth(tasks, counts[name]), recipe.max_steps)
                for name in self.collectors if counts[name] > 0]

    def relabel(self, trajectories: list[Any], *, answers: int, stops: int,
                seed: int) -> tuple[list[Any], list[Any]]:
        """None: an ALFWorld outcome is the game's state, not a text the evaluator reads, so
        no other ending of a recorded episode can be labelled without replaying it."""
        del trajectories, answers, stops, seed
        return [], []

    @staticmethod
    def renamed(trajectories: list[Any], copies: int, seed: int) -> list[Any]:
        """``copies`` of each recorded episode with its objects and receptacles renamed
        (:func:`.rename.renamed`): the experience model's examples, never the buffer's."""
        from dreamgym_agents.adapters.alfworld.rename import renamed

        return renamed(trajectories, copies, seed)

    def close(self) -> None:
        """Stop the game workers that hold no game (:func:`.host.release_idle_workers`)."""
        from dreamgym_agents.adapters.alfworld.host import release_idle_workers

        release_idle_workers()


UNPLAYABLE_TYPES = ("pick_and_place_with_movable_recep",)
"""ALFWorld task types this family cannot play: their games declare predicates (an object as a
receptacle) that the planner and the belief state do not read. ALFWorld's evaluation leaves
them out too (its six task types)."""


def official_trial(task: Task) -> tuple[str, str] | None:
    """``(task folder, trial folder)`` of an official game's task, from ALFWorld's layout
    ``<split>/<task folder>/trial_…/game.tw-pddl``: the same game wherever the data lies.
    None for a generated game or another file."""
    path = Path(str(task.config.get("game_file") or ""))
    return (path.parent.parent.name, path.parent.name) \
        if path.parent.name.startswith("trial_") else None


def official_tasks(folder: Path, split: str = "") -> list[Task]:
    """One task per playable ``game.tw-pddl`` below ``folder`` (symbolic links followed), in
    path order, as ALFWorld itself collects them: a game its data marks unsolvable
    (``"solvable": false``: 47 of ``valid_seen``'s 187) is left out, as ALFWorld's
    ``collect_game_files`` leaves it out, and a game of a task type the family cannot play
    (:data:`UNPLAYABLE_TYPES`) too; each left out is counted in one log line.

    Raises:
        ConfigError: No playable game below ``folder``.
    """
    from dreamgym_agents.adapters.alfworld.games import GAME_FILE, description_of

    found = sorted(Path(root) / GAME_FILE for root, _, files in os.walk(folder, followlinks=True)
                   if GAME_FILE in files)
    tasks: list[Task] = []
    unsolvable, unplayable = 0, 0
    for game in found:
        task_type = game.parent.parent.name.split("-", 1)[0]
        if task_type in UNPLAYABLE_TYPES:
            unplayable += 1
            continue
        try:
            content = json.loads(game.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            content = {}  # a broken file is played, and fails as an episode with its reason
        if not isinstance(content, dict):
            content = {}
        if content.get("solvable", True) is False:
            unsolvable += 1
            continue
        intent = description_of(content)
        trial = game.parent.relative_to(folder)  # the walk's paths start with folder
        tasks.append(task_from_config({"task_id": f"{folder.name}/{trial.as_posix()}",
                                       "intent": intent, "game_file": str(game),
                                       "task_type": task_type}, split))
    if unsolvable:
        logger.warning("%s: %d game(s) left out that ALFWorld's data marks unsolvable (as "
                       "ALFWorld leaves them out)", folder, unsolvable)
    if unplayable:
        logger.warning("%s: %d game(s) left out of a task type this family cannot play (%s)",
                       folder, unplayable, ", ".join(UNPLAYABLE_TYPES))
    if not tasks:
        raise ConfigError(f"no playable {GAME_FILE} below {folder} ({len(found)} found)")
    return tasks


def _spec_of(task: Task) -> tuple[int, str, str] | None:
    """The generated game of ``task`` as (seed, task type, layout); None for a game file."""
    if task.config.get("game_file"):
        return None
    game = task.config.get("game") or {}
    try:
        return int(game["seed"]), str(game["task_type"]), str(game["layout"])
    except (KeyError, TypeError, ValueError):
        return None


def _make_and_look(game: str, spec: tuple[int, str, str] | None,
                   root: str) -> dict[str, Any] | str:
    """:func:`_read_first_look` of ``game``, made first from ``spec`` under ``root`` when given
    (a process pool's worker: the games of a dream made and read in parallel)."""
    if spec is not None:
        from dreamgym_agents.adapters.alfworld.games import GameSpec, generate_game

        try:
            generate_game(GameSpec(*spec), root)
        except Exception as exc:  # noqa: BLE001 - a game with no plan: not kept
            return f"{type(exc).__name__}: {exc}"
    return _read_first_look(game)


def _read_first_look(game: str) -> dict[str, Any] | str:
    """A game's first look (``opening`` rendered as the environment's reset renders it, and
    ``contents``), or why textworld could not load it (a string). Top-level, so a process pool
    can run it."""
    from dreamgym_agents.adapters.alfworld import games
    from dreamgym_agents.adapters.alfworld.belief import Belief

    try:
        opening, contents = games.first_look(game)
    except Exception as exc:  # noqa: BLE001 - a game textworld cannot load
        return f"{type(exc).__name__}: {exc}"
    return {"opening": Belief.start(opening).render(), "contents": contents}


@functools.cache
def _renderer_key() -> str:
    """A digest of the code that renders a game's states (a kept opening is valid for it)."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("env.py", "belief.py", "games.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:12]


def _kept_file(what: str, game: Path) -> Path | None:
    """Where :meth:`AlfworldFamily._per_game` keeps ``what`` of ``game`` (beside it, named for
    the code that reads it); None for a game not generated here (nothing is written there)."""
    return game.parent / f"{what}-{_renderer_key()}.txt" if _generated_here(game) else None


def _generated_here(game: Path) -> bool:
    """Whether ``game`` is one of the games this family generated (under its cache)."""
    from dreamgym_agents.adapters.alfworld.games import games_root

    return game.resolve().is_relative_to(games_root().resolve())


def _write_quietly(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; a folder that cannot be written (official games
    on a read-only mount) just keeps nothing."""
    from dreamgym_agents.adapters.alfworld.games import write_atomic

    try:
        write_atomic(path, text)
    except OSError as exc:
        logger.debug("not kept at %s: %s", path, exc)
