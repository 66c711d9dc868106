"""Seconds of a dream GRPO batch with and without gradient checkpointing, side by side.

Runs two processes at once (one torch thread each, so both see the same machine): each trains
the task's shipped warm start for ``--batches`` GRPO batches in the dream of the shipped
experience model, one with ``gradient_checkpointing`` on (TRL's default), one off (the
project's default on a CPU), and prints each batch's rollout and update seconds (the last
batch's update is not timed) and the ratio of the mean updates::

    python benchmarks/grpo_update.py --task webarena --batches 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_side(task: str, batches: int, checkpointing: bool, out: Path) -> None:
    """Train ``batches`` dream GRPO batches; write each batch's end and rollout seconds."""
    from dream_speed import shipped_dream

    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.pipeline.bundle import shipped_bundle
    from dreamgym_agents.pipeline.run import RL_LR, dream_tasks
    from dreamgym_agents.policy.model import PolicyConfig
    from dreamgym_agents.rl.grpo import GRPOStageConfig, train_grpo

    family = make_family(task)
    pool, close = shipped_dream(task, family, 8)
    cfg = GRPOStageConfig(max_steps=batches, tasks_per_step=4, num_generations=4,
                          max_episode_steps=getattr(family, "rl_episode_steps", None) or 10,
                          learning_rate=RL_LR, concurrency=8,
                          gradient_checkpointing=checkpointing)
    started, stamps = time.perf_counter(), []
    try:
        train_grpo(str(shipped_bundle(task).policy_dir), out / "grpo",
                   dream_tasks(family.load_tasks("train"), family), pool, cfg, PolicyConfig(),
                   stage="bench", view=family.policy_view(), on_batch=lambda figures: stamps.append(
                       [time.perf_counter() - started, figures["rollout/seconds"]]))
    finally:
        pool.close()
        close()
        family.close()
    (out / "batches.json").write_text(json.dumps(stamps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="webarena")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--side", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        one_side(args.task, args.batches, args.side == "on", args.out)
        return
    if args.batches < 2:
        raise SystemExit("--batches must be at least 2 (an update is timed by the next batch)")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DG_TORCH_THREADS": "1"}
        procs = {side: subprocess.Popen(
            [sys.executable, __file__, "--task", args.task, "--batches", str(args.batches),
             "--side", side, "--out", str(Path(tmp) / side)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for side in ("on", "off")}
        updates = {}
        print("| checkpointing | batch | rollout s | its update s |\n|---|---|---|---|")
        for side, proc in procs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"the {side} side failed:\n{err[-2000:]}")
            # a stamp when each batch's rollouts end: the time to the next stamp, less the next
            # rollouts, is this batch's update (the last one's is not timed)
            stamps = json.loads((Path(tmp) / side / "batches.json").read_text())
            ends = [end for end, _ in stamps]
            rollouts = [seconds for _, seconds in stamps]
            timed = [ends[k + 1] - ends[k] - rollouts[k + 1] for k in range(len(stamps) - 1)]
            for k, rollout in enumerate(rollouts):
                update = f"{timed[k]:.1f}" if k < len(timed) else "—"
                print(f"| {side} | {k + 1} | {rollout:.1f} | {update} |")
            updates[side] = sum(timed) / len(timed)
    print(f"\nmean update: on {updates['on']:.1f} s, off {updates['off']:.1f} s: "
          f"{updates['on'] / updates['off']:.2f}x")


if __name__ == "__main__":
    main()
