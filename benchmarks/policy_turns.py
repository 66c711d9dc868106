"""A policy's turns against recorded episodes: teacher-forced exact-action accuracy.

For every turn of every recorded (usually oracle) episode, the policy sees the page, the task
and the recorded earlier actions exactly as it would live, decodes greedily (constrained as
configured), and its action is compared with the recorded one (written as the policy writes
it). Prints the accuracy overall, per verb and per task template, and writes the misses —
far cheaper than a live evaluation and it says *which* decisions fail. Alternative routes (a
category instead of a search) count as misses: read it as a lower bound.

    .venv/bin/dg-agents eval --agent oracle --split test --out runs/test-oracle
    .venv/bin/python benchmarks/policy_turns.py runs/quick/checkpoints/sft \\
        runs/test-oracle/trajectories.jsonl [--misses misses.txt] [--set constrained_decoding=false]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import time
from pathlib import Path

from dreamgym_agents.config import load_config
from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.policy.model import PolicyConfig, PolicyModel, error_seen, written_actions
from dreamgym_agents.types import read_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a policy checkpoint directory")
    parser.add_argument("episodes", help="trajectories.jsonl of recorded episodes")
    parser.add_argument("--misses", help="write each missed turn here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a PolicyConfig field (e.g. constrained_decoding=false)")
    args = parser.parse_args()
    view = load_config(PolicyConfig(), None, args.set, prefix="policy.")
    episodes = read_trajectories(args.episodes)
    family = make_family(episodes[0].task.family) if episodes else None
    policy = PolicyModel.load(args.checkpoint, view,
                              family.policy_view() if family is not None else None)
    jobs = []
    for episode in episodes:
        written = written_actions(episode.transitions, view, policy.view)
        for i, t in enumerate(episode.transitions):
            ids = policy.segment_ids(episode.task, t.state, written[:i],
                                     error_seen(episode.transitions, i))
            jobs.append((episode, i, ids, written[i], policy.constraint(episode.task, t.state)))

    def decide(job: tuple) -> tuple:
        episode, i, ids, want, constraint = job
        return episode, i, want, policy.decode(policy.generate(ids, 0.0, constraint)).strip()

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # concurrent turns share batches
        results = list(pool.map(decide, jobs))
    by_verb: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    by_template: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    whole: dict[str, bool] = collections.defaultdict(lambda: True)
    misses = []
    for episode, i, want, got in results:
        hit = want == got
        for table, key in ((by_verb, want.split("(")[0]),
                           (by_template, str(episode.task.config.get("intent_template_id")))):
            table[key][0] += hit
            table[key][1] += 1
        whole[episode.episode_id] &= hit
        if not hit:
            misses.append(f"{episode.task.intent} | turn {i}\n  want {want}\n  got  {got}\n")
    hits = sum(v[0] for v in by_verb.values())
    print(json.dumps({
        "turns": len(results), "turn_accuracy": round(hits / max(len(results), 1), 3),
        "episodes_every_turn_right": f"{sum(whole.values())}/{len(whole)}",
        "per_verb": {k: f"{a}/{n}" for k, (a, n) in sorted(by_verb.items())},
        "per_template": {k: f"{a}/{n}" for k, (a, n) in sorted(by_template.items())},
        "seconds": round(time.perf_counter() - start, 1)}, indent=1))
    if args.misses:
        Path(args.misses).write_text("".join(misses), encoding="utf-8")


if __name__ == "__main__":
    main()
