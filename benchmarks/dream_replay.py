"""Replay dream episodes on the real environment: does the real game agree with the dream?

Reads a dream's ``trajectories.jsonl`` (``dg-agents dream …`` or a GRPO stage's
``rollouts.jsonl``), plays each episode's actions in the family's real environment from the
same task, and prints how often the real next state is the dream's (exact), the real reward
the dream's, and the real episode's success the dream's::

    python benchmarks/dream_replay.py --task alfworld runs/dream-policy/trajectories.jsonl

A step the real environment refuses (the dream accepted it) is counted as ``refused`` and ends
that episode's replay; the state and reward rates are over the steps it accepted. Only for
environments that restart the same from a task (ALFWorld's games, the bundled shop); the real
steps are not training data and are not recorded.
"""

from __future__ import annotations

import argparse
import collections
import json

from dreamgym_agents.episodes.env import EnvConfig, make_family
from dreamgym_agents.types import read_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--limit", type=int, default=None, help="episodes per file")
    args = parser.parse_args()
    family = make_family(args.task)
    family.prepare(EnvConfig(), None)
    env = family.make_env(EnvConfig(max_steps=1000, options={"expert": False}))
    norm = " ".join
    try:
        for path in args.files:
            counts: collections.Counter[str] = collections.Counter()
            for traj in read_trajectories(path)[: args.limit]:
                env.reset(traj.task)
                real_success = False
                counts["episodes"] += 1
                for t in traj.transitions:
                    if not t.valid:
                        continue
                    result = env.step(t.action)
                    if not result.valid:
                        counts["refused"] += 1
                        break
                    counts["steps"] += 1
                    counts["state_exact"] += norm(result.observation.state.split()) == \
                        norm(t.next_state.split())
                    counts["reward_agrees"] += (result.reward > 0) == (t.reward > 0)
                    real_success = real_success or bool(result.success)
                    if result.done:
                        break
                dream_success = bool(traj.success)
                counts["dream_won"] += dream_success
                counts["real_won"] += real_success
                counts["success_agrees"] += dream_success == real_success
                counts["dream_won_real_lost"] += dream_success and not real_success
            steps, episodes = max(1, counts["steps"]), max(1, counts["episodes"])
            print(json.dumps({"file": path, **counts,
                              "state_exact_rate": round(counts["state_exact"] / steps, 4),
                              "reward_agreement": round(counts["reward_agrees"] / steps, 4),
                              "success_agreement": round(counts["success_agrees"] / episodes,
                                                         4)}), flush=True)
    finally:
        env.close()
        family.close()


if __name__ == "__main__":
    main()
