"""Print what a dream rewarded that the family's own check of the predicted state would not.

    python benchmarks/dream_reward_check.py --task alfworld \
        runs/bench-alf/seed*/dreamgym/stages/dream_rl/rollouts.jsonl

Reads dream episodes (a GRPO stage's ``rollouts.jsonl`` or ``dg-agents dream``'s
``trajectories.jsonl``) and prints, per file and in all, the family's
:func:`~dreamgym_agents.experience.fidelity.reward_check` (``TaskFamily.state_success``: for
ALFWorld, the goal read from the task's wording) and which commands the false rewards followed.
"""

from __future__ import annotations

import argparse
import collections
import json

from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.experience.fidelity import reward_check
from dreamgym_agents.types import read_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--task", default="alfworld")
    args = parser.parse_args()
    family = make_family(args.task)
    check = getattr(family, "state_success", None)
    if check is None:
        raise SystemExit(f"the {args.task} family has no state_success check")
    total: collections.Counter[str] = collections.Counter()
    after: collections.Counter[str] = collections.Counter()
    for path in args.files:
        episodes = read_trajectories(path)
        figures = reward_check(episodes, check) or {}
        wins = sum(t.success for t in episodes)
        print(json.dumps({"file": path, "episodes": len(episodes), "won": wins, **figures}))
        total.update(figures)
        for traj in episodes:
            for t in traj.transitions:
                if t.valid and not t.info.get("em_failure") and t.reward > 0 and \
                        check(traj.task, t.next_state) is False:
                    after[t.action.split(" ", 1)[0]] += 1
    print(json.dumps({"all": dict(total), "false_rewards_after": dict(after.most_common())}))


if __name__ == "__main__":
    main()
