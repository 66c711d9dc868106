"""Generate the bundled ALFWorld task set: which games make each split.

``python -m dreamgym_agents.adapters.alfworld.taskgen --out tasks/alfworld`` writes ``train.json``,
``validation.json``, ``test.json`` and ``README.md``, deterministic in ``--seed``:

- train: ``--train`` games per task type on ALFRED's *seen* room layouts;
- validation: ``--validation`` per type on seen layouts, other games (ALFWorld's valid_seen);
- test: ``--test`` per type on the *unseen* layouts (ALFWorld's valid_unseen): rooms no training
  game was played in.

Every game is generated and its expert plan replayed before it is listed (an unsolvable draw is
replaced by the next one), so every listed task is solvable; the games land in the cache that
plays use.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from dreamgym_agents.adapters.alfworld.games import (
    GameSpec,
    games_root,
    generate_game,
    task_description,
)
from dreamgym_agents.adapters.alfworld.layouts import TASK_TYPES, feasible_task_types, list_layouts
from dreamgym_agents.errors import EnvError

PER_TYPE = {"train": 40, "validation": 10, "test": 10}


def draw(split: str, per_type: int, seed: int, taken: set[GameSpec],
         root: Path, *, say: Any = print) -> list[dict[str, Any]]:
    """``per_type`` solvable games of each task type for ``split`` (layouts seen in train and
    validation, unseen in test), none in ``taken``; their task configs."""
    layouts = list_layouts(split="test" if split == "test" else "train")
    feasible = {lay: set(feasible_task_types(lay)) for lay in layouts}
    configs = []
    for t, task_type in enumerate(TASK_TYPES):
        rng = random.Random(f"{seed}|{split}|{task_type}")
        pool = [lay for lay in layouts if task_type in feasible[lay]]
        kept = 0
        while kept < per_type:
            spec = GameSpec(rng.randrange(10**6), task_type, rng.choice(pool))
            if spec in taken:
                continue
            taken.add(spec)
            try:
                path = generate_game(spec, root)
            except EnvError as exc:
                say(f"  skipped {spec.folder}: {exc}")
                continue
            configs.append({"task_id": f"alfworld.{split}.{t * per_type + kept}",
                            "intent": task_description(path), "task_type": task_type,
                            "intent_template": task_type,
                            "game": {"seed": spec.seed, "task_type": task_type,
                                     "layout": spec.layout},
                            "room": spec.layout.rsplit("-", 1)[0]})
            kept += 1
        say(f"  {split} {task_type}: {kept}")
    return configs


def readme(splits: dict[str, list[dict[str, Any]]], seed: int) -> str:
    rows = []
    for task_type in TASK_TYPES:
        counts = [sum(c["task_type"] == task_type for c in splits[s]) for s in PER_TYPE]
        rows.append(f"| {task_type} | " + " | ".join(map(str, counts)) + " |")
    rooms = {s: Counter(c["room"] for c in tasks) for s, tasks in splits.items()}
    layouts = {s: len({c["game"]["layout"] for c in tasks}) for s, tasks in splits.items()}
    return f"""# alfworld — the bundled ALFWorld task set

Generated games of ALFWorld's six task types (seed {seed}), played offline through textworld
with the PDDL domain and grammar of the `alfworld` wheel
(`dreamgym_agents/adapters/alfworld`). Each task names its game: `game.seed`,
`game.task_type`, `game.layout` (`<room>-<AI2-THOR floor plan>`); the game file is generated
on first use (deterministic) and cached. Every listed game was generated and solved by the
expert's plan when the set was made.

- train: seen layouts ({layouts['train']} of them); validation: seen layouts, other games
  ({layouts['validation']}); test: ALFRED's **unseen** layouts ({layouts['test']}), rooms no
  train or validation game uses (ALFWorld's `valid_unseen`).
- rooms: train {dict(rooms['train'])}; validation {dict(rooms['validation'])}; test
  {dict(rooms['test'])}.

Regenerate (identical for the same seed):

    python -m dreamgym_agents.adapters.alfworld.taskgen --seed {seed} --out tasks/alfworld

| task type | train | validation | test |
|---|---:|---:|---:|
{chr(10).join(rows)}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the bundled ALFWorld task set.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="tasks/alfworld")
    args = parser.parse_args(argv)
    root = games_root()
    taken: set[GameSpec] = set()
    splits = {split: draw(split, n, args.seed, taken, root) for split, n in PER_TYPE.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, configs in splits.items():
        (out / f"{split}.json").write_text(json.dumps(configs, indent=1, sort_keys=True) + "\n",
                                           encoding="utf-8")
    (out / "README.md").write_text(readme(splits, args.seed), encoding="utf-8")
    print("wrote " + ", ".join(f"{len(c)} {s}" for s, c in splits.items())
          + f" tasks to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
