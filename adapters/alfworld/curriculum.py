"""The ALFWorld family's task generator for the curriculum (its ``task_generator`` hook).

A variant of a seed task is another game of its task type in its room layout: a new seed draws
another goal (object, receptacle, lamp) among those the layout makes feasible, and other
placements. Every variant is a real game (``dg-agents eval`` can generate and play it), and the
dream plays it from the seed's recorded start, which is the same room. WebArena-style template
variants do not apply: an instruction names classes ("put a clean mug in cabinet"), and which
ones make sense depends on the room.
"""

from __future__ import annotations

import json
import random
from typing import Any

from dreamgym_agents.adapters.alfworld.games import GameSpec, game_text
from dreamgym_agents.types import Task

SEED_RANGE = 10**6
"""Seeds are drawn in ``[0, SEED_RANGE)``, as the task set's are."""


class AlfworldTaskGenerator:
    """Variants of a seed game (see the module docstring): ``n`` games with new seeds, none a
    game of ``tasks`` or ``avoid``; the selected one is the first whose goal differs from the
    seed's (else the first).

    Args:
        tasks: The tasks the curriculum starts from (their games are not proposed again).
        seed: Seed of the draws.
        avoid: More games never to propose (the held-out splits').
    """

    def __init__(self, tasks: list[Task], seed: int = 0, avoid: list[Task] = ()) -> None:
        self.rng = random.Random(seed)
        self.taken = {_game_key(t.config.get("game")) for t in [*tasks, *avoid]
                      if isinstance(t.config.get("game"), dict)}

    def generate(self, seed: Task, n: int) -> tuple[list[Any], int | None]:
        game = seed.config.get("game")
        if not isinstance(game, dict):
            return [None], None  # an official game file: nothing to vary
        out: list[Any] = []
        for _ in range(n):
            spec = self._new_spec(game)
            try:
                _, _, meta, _ = game_text(spec)
            except ValueError:
                out.append(None)  # cannot happen for a seed's own layout and type
                continue
            params = {k: str(meta[v]) for k, v in (("object", "object_target"),
                                                  ("receptacle", "parent_target"),
                                                  ("lamp", "toggle_target")) if meta.get(v)}
            out.append({"intent": str(meta["task_desc"]), "params": params,
                        "config": {"game": {"layout": spec.layout, "seed": spec.seed,
                                            "task_type": spec.task_type}}})
        other = next((i for i, c in enumerate(out)
                      if c is not None and c["intent"] != seed.intent), None)
        return out, other

    def _new_spec(self, game: dict[str, Any]) -> GameSpec:
        while True:
            spec = GameSpec(self.rng.randrange(SEED_RANGE), str(game["task_type"]),
                            str(game["layout"]))
            key = _game_key({"layout": spec.layout, "seed": spec.seed,
                             "task_type": spec.task_type})
            if key not in self.taken:
                self.taken.add(key)
                return spec


def _game_key(game: Any) -> str:
    return json.dumps(game, sort_keys=True)
