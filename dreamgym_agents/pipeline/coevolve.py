"""A run's own replay buffer, fed by the episodes it plays (the buffer co-evolves with the policy).

Each ``dg-agents run`` dreams from a buffer of its own, ``DIR/buffer``: a copy of the
experience model's buffer (the bundle's seed transitions, or the one given with
``experience_buffer``) made on first use, so one run's steps never reach another run's buffer
or the cache. Then:

- every real transition a stage plays on a *train* task (sim-to-real, GRPO-real) enters it
  with its provenance (``real``) and the stage that played it (record metadata ``stage``);
  retrieval sees it from the next dream step on. Validation and test tasks never enter: the
  run's held-out check rejects them (:class:`~dreamgym_agents.heldout.HeldOut`), and only
  ``train`` tasks are kept;
- with ``buffer_dream``, the dream's own rollouts enter too, as ``synthetic`` records, which
  the experience model retrieves only with ``dream_retrieves_synthetic``.

The fresh real transitions are what the experience model's refresh learns from
(:mod:`dreamgym_agents.experience.refresh`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from dreamgym_agents.types import Trajectory

logger = logging.getLogger(__name__)

RUN_BUFFER = "buffer"
SOURCE_FILE = "SOURCE.json"


def run_buffer(out: Path, source: str | Path) -> Path:
    """The run's own buffer folder, ``out/buffer``, copied from ``source`` the first time
    (a copy interrupted half-way is made again)."""
    target = out / RUN_BUFFER
    marker = target / SOURCE_FILE
    if marker.is_file():
        return target
    if target.exists():
        shutil.rmtree(target)
    partial = target.with_name(RUN_BUFFER + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    shutil.copytree(source, partial)
    (partial / SOURCE_FILE).write_text(json.dumps(
        {"source": str(source), "copied": round(time.time(), 1)}, indent=2))
    partial.rename(target)
    logger.info("run buffer: %s copied from %s", target, source)
    return target


def for_buffer(episodes: list[Trajectory], held_out: Any, name: str, *,
               train_split: str = "train") -> list[Trajectory]:
    """The episodes a run's buffer may learn from: those of its train tasks (``train_split``)
    and a curriculum's variants of them, never a validation or test task's (``held_out``
    rejects them by id and by what they ask, counted under ``name``)."""
    kept = [t for t in episodes if t.task.split in (train_split, "synthetic")]
    return held_out.keep(kept, name) if kept else []


def fresh_key(episodes: list[Trajectory]) -> str:
    """A short digest of episodes (their ids and lengths): a refresh's folder name, so a
    restarted stage's other episodes refresh into another folder."""
    text = "|".join(f"{t.episode_id}:{len(t.transitions)}" for t in episodes)
    return hashlib.sha256(text.encode()).hexdigest()[:8]
