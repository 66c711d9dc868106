"""Held-out tasks never reach training.

A family's validation and test tasks are *held out*: the curriculum must not propose them, and
the buffer, the experience model's data, the warm start and RL must not train on them.
:class:`HeldOut` recognises a task by its instruction (normalised) or by its template and
parameters (WebArena's ``intent_template`` and ``instantiation_dict``, normalised), so a
rephrased intent with the same values is caught as well as a verbatim copy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
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


def _instance(task: Task) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    template = task.config.get("intent_template") if isinstance(task.config, dict) else None
    params = task.params
    if not template or not params:
        return None
    return normalise(str(template)), tuple(sorted((k, normalise(v)) for k, v in params.items()))


@dataclass
class HeldOut:
    """The held-out tasks of a family, and what was rejected for matching one.

    Attributes:
        intents: Normalised instructions of the held-out tasks.
        instances: (template, parameters) of the held-out tasks that have them.
        splits: The splits they come from.
        rejected: How many items each caller rejected (``curriculum``, ``offline_episodes``,
            ``buffer``, ``rl_tasks`` …), for the run's summary.
    """

    intents: set[str] = field(default_factory=set)
    instances: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)
    splits: tuple[str, ...] = ()
    rejected: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, tasks: Iterable[Task], splits: tuple[str, ...] = ()) -> HeldOut:
        out = cls(splits=splits)
        for task in tasks:
            out.intents.add(normalise(task.intent))
            if (key := _instance(task)) is not None:
                out.instances.add(key)
        return out

    @classmethod
    def for_family(cls, family: Any, splits: tuple[str, ...] = HELD_OUT_SPLITS) -> HeldOut:
        """The family's tasks of ``splits`` (a split the family does not have is skipped: real
        WebArena has a test set only)."""
        tasks: list[Task] = []
        found = []
        for split in splits:
            try:
                tasks.extend(family.load_tasks(split))
            except ConfigError:
                continue
            found.append(split)
        return cls.of(tasks, tuple(found))

    def __len__(self) -> int:
        return len(self.intents)

    def matches(self, task: Task) -> bool:
        """True when ``task`` is a held-out task (same instruction, or same template and
        parameters)."""
        if normalise(task.intent) in self.intents:
            return True
        key = _instance(task)
        return key is not None and key in self.instances

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
