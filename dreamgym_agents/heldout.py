"""Held-out tasks never reach training.

A family's validation and test tasks are *held out*: the curriculum must not propose them, and
the buffer, the experience model's data, the warm start and RL must not train on them.
:class:`HeldOut` recognises a task by its keys: what makes it the same task instance. By default
(:func:`task_keys`) its instruction (normalised) and its template and parameters (WebArena's
``intent_template`` and ``instantiation_dict``, normalised), so a rephrased intent with the same
values is caught as well as a verbatim copy. A family whose instructions recur across instances
says otherwise in ``TaskFamily.task_keys``: ALFWorld's "put a mug in cabinet" is a different
task in another room, so its key is the game.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Task

logger = logging.getLogger(__name__)

HELD_OUT_SPLITS = ("validation", "test")
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Lower case, single spaces, no trailing punctuation."""
    return _SPACE.sub(" ", str(text).lower()).strip().rstrip(".?!")


def task_keys(task: Task) -> set[str]:
    """A task's default keys: its normalised instruction, and its template with its parameters
    when it has both."""
    keys = {f"intent:{normalise(task.intent)}"}
    if task.template and task.params:
        values = sorted((k, normalise(v)) for k, v in task.params.items())
        keys.add(f"instance:{normalise(task.template)}|{values}")
    return keys


Keys = Callable[[Task], set[str]]
"""A task → the keys that name its instance (:func:`task_keys`, or a family's)."""


@dataclass
class HeldOut:
    """The held-out tasks of a family, and what was rejected for matching one.

    Attributes:
        keys: The keys of the held-out tasks.
        count_tasks: How many held-out tasks there are.
        splits: The splits they come from.
        rejected: How many items each caller rejected (``curriculum``, ``offline_episodes``,
            ``buffer``, ``rl_tasks`` …), for the run's summary.
        keys_of: How a task's keys are made (:func:`task_keys`, or the family's).
    """

    keys: set[str] = field(default_factory=set)
    count_tasks: int = 0
    splits: tuple[str, ...] = ()
    rejected: dict[str, int] = field(default_factory=dict)
    keys_of: Keys = task_keys

    @classmethod
    def of(cls, tasks: Iterable[Task], splits: tuple[str, ...] = (),
           keys_of: Keys | None = None) -> HeldOut:
        out = cls(splits=splits, keys_of=keys_of or task_keys)
        for task in tasks:
            out.keys |= out.keys_of(task)
            out.count_tasks += 1
        return out

    @classmethod
    def for_family(cls, family: Any, splits: tuple[str, ...] | None = None) -> HeldOut:
        """The family's tasks of ``splits``; None: its ``held_out_splits`` where it names them,
        else :data:`HELD_OUT_SPLITS`. A split the family does not have is skipped: real
        WebArena has a test set only, and ALFWorld's official games may not be there."""
        if splits is None:
            splits = tuple(getattr(family, "held_out_splits", HELD_OUT_SPLITS))
        tasks: list[Task] = []
        found = []
        for split in splits:
            try:
                tasks.extend(family.load_tasks(split))
            except ConfigError:
                continue
            found.append(split)
        return cls.of(tasks, tuple(found), getattr(family, "task_keys", None))

    def __len__(self) -> int:
        return self.count_tasks

    def matches(self, task: Task) -> bool:
        """True when ``task`` is a held-out task (a key in common: by default the same
        instruction, or the same template and parameters)."""
        return not self.keys.isdisjoint(self.keys_of(task))

    def keep(self, items: Iterable[Any], where: str) -> list[Any]:
        """The items (tasks, or anything with a ``task``: trajectories) that are not held out;
        the others are counted under ``where``."""
        kept, dropped = [], 0
        for item in items:
            task = item if isinstance(item, Task) else item.task
            if self.matches(task):
                dropped += 1
            else:
                kept.append(item)
        self.count(where, dropped)
        if dropped:
            logger.warning("%s: %d held-out (%s) item(s) rejected", where, dropped,
                           "/".join(self.splits) or "held-out")
        return kept

    def count(self, where: str, n: int = 1) -> None:
        self.rejected[where] = self.rejected.get(where, 0) + n
