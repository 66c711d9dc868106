"""Real test success against dream RL episodes, on one seed: the dream-RL scaling curve.

One ``dg-agents run`` (the quick preset, no sim-to-real, no validation stop rule: the curve
shows what more dream RL does, not what a stop rule keeps) trains the shipped warm start for as
many dream GRPO batches as the largest budget needs and keeps the policy after each budget's
batch (``dream.keep_at``); each kept policy then plays the real test split (``dg-agents eval``,
greedy, every test task). Both resume where they stopped: rerun the same command. Prints, per
point: dream episodes, dream transitions, the dream stage's seconds to reach it, and real test
success with its 95 % interval (Wilson)::

    python benchmarks/dream_scaling.py --task alfworld --episodes 512 2048 8192 --out DIR

Budget 0 is the warm start's own evaluation (the run's ``eval_sft``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> None:
    """One ``dg-agents`` command (its own process; it resumes where a killed one stopped)."""
    command = [sys.executable, "-m", "dreamgym_agents.cli.main", *args]
    print("$", " ".join(command[2:]), flush=True)
    done = subprocess.run(command, env=dict(os.environ))
    if done.returncode != 0:
        raise SystemExit(f"dream_scaling: `{' '.join(args[:2])}` ended with status "
                         f"{done.returncode} (rerun to resume)")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a success rate."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def batches_for(episodes: list[int], per_batch: int) -> list[int]:
    """The batch after which each budget of dream episodes is spent (rounded up)."""
    return [max(1, math.ceil(e / per_batch)) for e in episodes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--episodes", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4, help="Test episodes at once.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="More `dg-agents run` settings (section.key=value).")
    args = parser.parse_args()
    from dreamgym_agents.pipeline.run import preset_config

    dream = preset_config("quick", args.seed, args.task).dream
    per_batch = dream.tasks_per_step * dream.num_generations
    budgets = sorted({e for e in args.episodes if e > 0})
    if not budgets:
        raise SystemExit("dream_scaling: give at least one budget of dream episodes above 0")
    batches = batches_for(budgets, per_batch)
    run = args.out / "run"
    settings = [f"dream.max_steps={batches[-1]}", "dream.validate_every=0",
                f"dream.keep_at=[{','.join(map(str, batches))}]", "eval_limit=null",
                "calibrate_limit=0", *args.overrides]
    cli("run", "--task", args.task, "--preset", "quick", "--seed", str(args.seed),
        "--no-sim-to-real", "--out", str(run), *[x for s in settings for x in ("--set", s)])
    state = json.loads((run / "state.json").read_text())["done"]
    kept = {k["batch"]: k for k in state["dream_rl"]["kept"]}
    rows = [{"episodes": 0, "batch": 0, "transitions": 0, "seconds": 0.0,
             "successes": state["eval_sft"]["successes"], "n": state["eval_sft"]["episodes"]}]
    for budget, batch in zip(budgets, batches, strict=True):
        point = kept.get(batch)
        if point is None:  # the stage ended early (a budget or a stop)
            print(f"batch {batch} was not reached: the stage ended at batch "
                  f"{state['dream_rl'].get('batches')}", flush=True)
            continue
        folder = args.out / f"eval-batch-{batch}"
        cli("eval", "--task", args.task, "--split", "test", "--agent", f"hf/{point['path']}",
            "--concurrency", str(args.concurrency), "--out", str(folder))
        summary = json.loads((folder / "summary.json").read_text())
        rows.append({"episodes": point["episodes"], "batch": batch,
                     "transitions": point["synthetic_transitions"],
                     "seconds": point["seconds"], "successes": summary["successes"],
                     "n": summary["episodes"], "budget": budget})
    print(f"\n{args.task}, seed {args.seed}, {per_batch} dream episodes a batch:\n")
    print("| dream episodes | batches | dream transitions | dream stage s | real test success "
          "| 95 % interval |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        low, high = wilson(r["successes"], r["n"])
        print(f"| {r['episodes']} | {r['batch']} | {r['transitions']} | {r['seconds']:.0f} | "
              f"{r['successes']}/{r['n']} = {r['successes'] / max(1, r['n']):.3f} | "
              f"[{low:.3f}, {high:.3f}] |")
    (args.out / "scaling.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
