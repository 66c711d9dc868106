"""What an RL batch costs, GRPO against PPO, side by side: seconds per batch and peak memory.

Each algorithm trains the shipped warm start for the same few dream batches (the quick preset's
dream stage, validation off, the same tasks and seed), each in its own process so that its peak
memory is its own, the two alternating round by round so that both meet the same load. Prints,
per algorithm, the seconds per batch and the stage's peak resident memory (the training
process; the game workers not in it), each round's figures and their mean, and PPO's ratio to
GRPO's::

    python benchmarks/rl_cost.py --task alfworld --batches 4 --rounds 2 --out DIR

``--real`` plays the batches on the real environment instead of the dream (GRPO-real's stage).
A round that finished is not played again: rerun the same command to resume.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ALGORITHMS = ("grpo", "ppo")

ONE_STAGE = """
import sys
from dreamgym_agents.cli.policy import _pipeline_config
from dreamgym_agents.pipeline.run import Pipeline
cfg = _pipeline_config("quick", {seed}, "embedded", False, None, {overrides!r}, {task!r})
Pipeline(cfg, {out!r}).run(until={until!r})
"""


def stage_figures(folder: Path, stage: str) -> dict[str, float] | None:
    """The finished stage's seconds per batch and peak memory (None: not finished)."""
    state = folder / "state.json"
    if not state.is_file():
        return None
    done = json.loads(state.read_text()).get("done", {}).get(stage)
    if not done or not done.get("batches"):
        return None
    return {"seconds_per_batch": done["seconds"] / done["batches"],
            "peak_rss_mb": done.get("peak_rss_mb") or float("nan"),
            "episodes": done["episodes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", action="store_true", help="Real batches, not dream ones.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.batches < 1 or args.rounds < 1:
        raise SystemExit("rl_cost: --batches and --rounds must be at least 1")
    # GRPO-real's stage is the run's dream_rl stage played on the real environment
    stage = "dream_rl"
    figures: dict[str, list[dict[str, float]]] = {a: [] for a in ALGORITHMS}
    for r in range(args.rounds):
        for algorithm in ALGORITHMS if r % 2 == 0 else ALGORITHMS[::-1]:
            folder = args.out / f"round{r}-{algorithm}"
            found = stage_figures(folder, stage)
            if found is None:
                overrides = [f"dream.max_steps={args.batches}", "dream.validate_every=0",
                             f"dream.algorithm={algorithm}"]
                if args.real:  # GRPO-real's settings (the bench's), its batches counted
                    overrides += ["real_rl=true", "curriculum.enabled=false"]
                code = ONE_STAGE.format(seed=args.seed, overrides=overrides, task=args.task,
                                        out=str(folder), until=stage)
                print(f"round {r + 1}/{args.rounds}: {algorithm} ({args.batches} batches)",
                      flush=True)
                done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ))
                if done.returncode != 0:
                    raise SystemExit(f"rl_cost: the {algorithm} stage of round {r + 1} ended "
                                     f"with status {done.returncode} (rerun to resume)")
                found = stage_figures(folder, stage)
                if found is None:
                    raise SystemExit(f"rl_cost: {folder}: the stage recorded no batch")
            figures[algorithm].append(found)
            print(f"  {algorithm}: {found['seconds_per_batch']:.1f} s/batch, "
                  f"{found['peak_rss_mb']:.0f} MB peak", flush=True)
    mean = {a: {k: statistics.mean(f[k] for f in figures[a])
                for k in ("seconds_per_batch", "peak_rss_mb")} for a in ALGORITHMS}
    print(f"\n{args.task}, {'real' if args.real else 'dream'} batches, {args.batches} per "
          f"round, {args.rounds} round(s):")
    for a in ALGORITHMS:
        print(f"  {a}: {mean[a]['seconds_per_batch']:.1f} s/batch, "
              f"{mean[a]['peak_rss_mb']:.0f} MB peak")
    ppo, grpo = mean["ppo"], mean["grpo"]
    print(f"  ppo / grpo: time {ppo['seconds_per_batch'] / grpo['seconds_per_batch']:.2f}x, "
          f"memory {ppo['peak_rss_mb'] / grpo['peak_rss_mb']:.2f}x")
    (args.out / "rl_cost.json").write_text(json.dumps({"rounds": figures, "mean": mean},
                                                      indent=1))


if __name__ == "__main__":
    main()
