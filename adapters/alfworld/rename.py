"""Recorded ALFWorld episodes with their objects and receptacles renamed: more experience-model
examples from the same games, so that it learns to copy names from the action and the state.

The failure it addresses: an experience model trained on the recorded games alone copies the
names of a retrieved demonstration instead of the action's, writing ``You move the mug 1 to the
countertop 1.`` for ``move soapbar 1 to bathtubbasin 1`` (evidence:
docs/history/results-2026-11-to-12.md). In a copy, every kind that the episode shows is renamed
to another kind that plays the same part: an object that can be cleaned, heated and cooled for
another such, a receptacle that opens for another that opens. The renaming is the same
everywhere (task, states, actions, feedback). Lamps, the sink, the microwave and the fridge keep
their names, since they decide which commands exist. The game's numbers stay.
"""

from __future__ import annotations

import functools
import random
from dataclasses import replace
from typing import Any

from dreamgym_agents.adapters.alfworld.belief import (
    TOOLS,
    Belief,
    Rules,
    kind_of,
    rename_words,
    renamed_state,
)
from dreamgym_agents.types import Trajectory

RENAMED_FROM = "renamed_from"
"""``Trajectory.info`` key of a renamed copy: the recorded episode it was made from."""
RENAMES = "renames"
"""``Trajectory.info`` key of a renamed copy: its names, old kind → new kind."""


@functools.cache
def _pools() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """(object kind → the kinds it may become, receptacle kind → the kinds it may become)."""
    rules = Rules.alfred()
    fixed = set(TOOLS) | set(rules.lamps)
    objects = sorted(set().union(*rules.can_contain.values()) - fixed)
    receptacles = sorted(set(rules.can_contain) - set(objects) - fixed)  # never a portable one

    def role(kind: str) -> tuple[bool, ...]:
        return tuple(kind in rules.abilities[verb] for verb in ("clean", "heat", "cool"))

    def grouped(kinds: list[str], key: Any) -> dict[str, tuple[str, ...]]:
        return {k: tuple(o for o in kinds if key(o) == key(k)) for k in kinds}

    return (grouped(objects, role), grouped(receptacles, lambda k: k in rules.openable))


def episode_kinds(traj: Trajectory) -> tuple[set[str], set[str]]:
    """(object kinds, receptacle kinds) an episode shows: the receptacles of its room, the
    objects seen in them, held or named in an action."""
    receptacles: set[str] = set()
    objects: set[str] = set()
    for t in traj.transitions:
        for state in (t.state, t.next_state):
            belief = Belief.parse(state)
            receptacles |= {kind_of(r) for r in belief.receptacles}
            objects |= {kind_of(o) for p in belief.places.values() for o in p.items or ()}
            if belief.holding:
                objects.add(kind_of(belief.holding))
    return objects - receptacles, receptacles


def rename_map(traj: Trajectory, rng: random.Random) -> dict[str, str]:
    """A new name for each object and receptacle kind of ``traj`` (:func:`episode_kinds`) from
    its pool, one-to-one, never a kind the episode keeps."""
    object_pool, receptacle_pool = _pools()
    objects, receptacles = episode_kinds(traj)
    movable = [(k, object_pool[k]) for k in sorted(objects) if k in object_pool] + \
              [(k, receptacle_pool[k]) for k in sorted(receptacles) if k in receptacle_pool]
    kept = (objects | receptacles) - {k for k, _ in movable}
    taken = set(kept)
    names: dict[str, str] = {}
    for kind, pool in movable:
        free = [o for o in pool if o not in taken]
        if free:
            names[kind] = rng.choice(free)
            taken.add(names[kind])
        else:
            taken.add(kind)  # nothing left to become: it keeps its name
            names[kind] = kind
    return {k: v for k, v in names.items() if k != v}


def renamed(trajectories: list[Trajectory], copies: int, seed: int = 0) -> list[Trajectory]:
    """``copies`` renamed copies of each episode (:func:`rename_map`), each marked with
    ``info[RENAMED_FROM]`` and ``info[RENAMES]``. Its task's ``config[RENAMES]`` is set too, so
    the layout the experience model is shown is renamed the same way. A copy keeps its task's id,
    which names its game, so demonstrations of the same game stay out of its examples."""
    rng = random.Random(seed)
    out: list[Trajectory] = []
    for traj in trajectories:
        for n in range(copies):
            names = rename_map(traj, rng)
            if not names:
                continue
            intent = rename_words(traj.task.intent, names)
            task = replace(traj.task, intent=intent, config={**traj.task.config, "intent": intent,
                                                             RENAMES: names})
            episode_id = f"{traj.episode_id}~rename{n}"
            steps = [replace(t, state=renamed_state(t.state, names),
                             next_state=renamed_state(t.next_state, names),
                             action=rename_words(t.action, names), episode_id=episode_id,
                             info={k: rename_words(v, names) if isinstance(v, str) else v
                                   for k, v in t.info.items()})
                     for t in traj.transitions]
            out.append(replace(traj, episode_id=episode_id, task=task, transitions=steps,
                               info={**traj.info, RENAMED_FROM: traj.episode_id,
                                     RENAMES: names}))
    return out
