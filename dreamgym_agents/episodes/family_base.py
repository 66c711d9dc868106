"""The base class of a task family: :class:`FamilyBase` supplies every hook of
:class:`~dreamgym_agents.episodes.env.TaskFamily` but the five a family must write.

Its own module (not ``env``): its defaults are the plain-text codec and policy view, which
themselves read the environment contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dreamgym_agents.episodes.env import (
    ActionSet,
    EnvConfig,
    Environment,
    Requirement,
    StateFormat,
    every_nth,
)
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.experience.codec import ExperienceCodec, PlainCodec
from dreamgym_agents.policy.model import PlainView, PolicyView
from dreamgym_agents.types import Task

if TYPE_CHECKING:
    from dreamgym_agents.episodes.agent import Agent


class PlainStateFormat:
    """:class:`StateFormat` of a family whose states are plain text lines: a task without a
    recorded start starts at ``Task: <its instruction>``; no locations, no ids, and every
    task starts in a place of its own."""

    @staticmethod
    def initial_state(task: Task) -> str:
        return f"Task: {task.intent}"

    @staticmethod
    def start_key(task: Task) -> str:
        return task.task_id

    @staticmethod
    def location(state: str) -> str:
        del state
        return ""

    @staticmethod
    def strip_ids(line: str) -> str:
        return line


class FamilyBase:
    """A :class:`TaskFamily` with every hook but five given its default: subclass it and
    write ``name``, ``load_tasks``, ``make_env``, ``action_set`` and ``offline_agents``.

    The defaults: one kind of evaluator (``outcome``), which the dream judges for every task;
    no task files of a user's; nothing to prepare or report; the embedded recipe's oracle,
    noisy and random collectors (on its counts of train tasks), no recipe options of its own
    (``recipe_options``: a frozen dataclass of its collectors' counts) and no relabelled
    endings; the plain-text codec (:class:`~dreamgym_agents.experience.codec.PlainCodec`),
    policy view (:class:`~dreamgym_agents.policy.model.PlainView`) and
    :class:`PlainStateFormat`.
    Override any of them as :class:`TaskFamily` describes; the optional hooks it lists stay
    optional (absent: the core's default).
    """

    name = ""
    collectors: tuple[str, ...] = ("oracle", "noisy", "random")
    eval_types: tuple[str, ...] = ("outcome",)
    dream_eval_types: tuple[str, ...] | None = None
    recipe_options: type | None = None

    def load_tasks(self, split: str) -> list[Task]:
        raise NotImplementedError(f"{type(self).__name__}.load_tasks")

    def make_env(self, cfg: EnvConfig) -> Environment:
        raise NotImplementedError(f"{type(self).__name__}.make_env")

    def action_set(self) -> ActionSet:
        raise NotImplementedError(f"{type(self).__name__}.action_set")

    def offline_agents(self, seed: int = 0, noise: float = 0.3) -> dict[str, Agent]:
        raise NotImplementedError(f"{type(self).__name__}.offline_agents")

    def load_task_file(self, path: str) -> list[Task]:
        raise ConfigError(f"the {self.name} family reads no task files (--tasks {path}): "
                          "use --split")

    def prepare(self, cfg: EnvConfig, tasks: list[Task] | None = None) -> str:
        del cfg, tasks
        return f"the {self.name} family"

    def requirements(self) -> list[Requirement]:
        return []

    def task_eval_types(self, task: Task) -> list[str]:
        del task
        return list(self.eval_types[:1])

    def collection_plan(self, recipe: Any, tasks: list[Task]) -> list[tuple[str, Any, list, int]]:
        """The collectors with a count in the recipe (``<collector>_tasks``, the family's
        ``recipe_options`` first, then the shared fields), each on that many train tasks spread
        over the split."""
        agents = self.offline_agents(seed=recipe.seed, noise=recipe.noise)
        plan = []
        for name in self.collectors:
            field = f"{name}_tasks"
            count = int(getattr(recipe.options, field, getattr(recipe, field, 0)) or 0)
            if count > 0 and name in agents:
                plan.append((name, agents[name], every_nth(tasks, count), recipe.max_steps))
        return plan

    def experience_codec(self, version: int | None = None) -> ExperienceCodec:
        del version
        return PlainCodec(self.action_set(), f"the {self.name} environment")

    def policy_view(self) -> PolicyView:
        return PlainView()

    def state_format(self) -> StateFormat:
        return PlainStateFormat()

    def embedded_recipe_defaults(self) -> dict[str, Any]:
        return {}

    def relabel(self, trajectories: list[Any], *, answers: int, stops: int,
                seed: int) -> tuple[list[Any], list[Any]]:
        del trajectories, answers, stops, seed
        return [], []

    def close(self) -> None:
        return None
