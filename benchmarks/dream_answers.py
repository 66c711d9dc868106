"""How the dream judged the policy's answers during dream RL, against the site's own check.

Dream RL optimises the dream's reward. On an answer task the site scores the answer against the
task's reference (WebArena's ``string_match``); the dream has only its experience model's
verdict. This reads the dream rollouts of one or more run folders
(``stages/dream_rl/rollouts.jsonl``), re-scores every episode that ended with an answer on a
seed task whose only eval type is ``string_match`` with exact or must-include references (the
WebArena string evaluator,
:func:`dreamgym_agents.adapters.webarena.evaluation.evaluate_task`; synthetic variants are left
out: their references come from the generator) and prints the dream's verdict against the
site's, overall and per intent template.

    .venv/bin/python benchmarks/dream_answers.py runs/bench-quick/seed*/dreamgym
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from dreamgym_agents.adapters.webarena.evaluation import evaluate_task, task_eval_types
from dreamgym_agents.adapters.webarena.experience_prompt import answer_text
from dreamgym_agents.rl.grpo import ROLLOUTS_FILE
from dreamgym_agents.types import read_trajectories

ROLLOUTS = Path("stages") / "dream_rl" / ROLLOUTS_FILE


def judged(run: Path):
    """(template, site says right, dream says success) per answered seed-task episode."""
    for traj in read_trajectories(run / ROLLOUTS):
        config = traj.task.config
        refs = config.get("eval", {}).get("reference_answers") or {}
        if config.get("synthetic_of") is not None or not traj.transitions or not refs \
                or task_eval_types(traj.task) != ["string_match"] or "fuzzy_match" in refs:
            continue
        answer = answer_text(traj.transitions[-1].action)
        if answer is None:
            continue
        site = evaluate_task(config, answer=answer, page=None, site_urls={}).score
        yield config.get("intent_template", traj.task.intent), site == 1.0, bool(traj.success)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (dg-agents run --out)")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / ROLLOUTS).exists()]
    if missing:
        print(f"error: no dream rollouts ({ROLLOUTS}) in {', '.join(missing)}", file=sys.stderr)
        return 2
    counts: collections.Counter = collections.Counter()
    by_template: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for run in args.runs:
        for template, right, success in judged(run):
            counts[right, success] += 1
            by_template[template][right, success] += 1

    def row(name: str, c: collections.Counter) -> str:
        rewarded = c[True, True] + c[False, True]
        return (f"| {name} | {c[True, True]} | {c[True, False]} | {c[False, True]} | "
                f"{c[False, False]} | {c[True, True] / rewarded if rewarded else 0:.2f} |")

    print(f"answered seed-task episodes in the dream: {sum(counts.values())} "
          f"({len(args.runs)} run(s))\n")
    print("| intent template | right, dream success | right, dream failure | "
          "wrong, dream success | wrong, dream failure | dream success that is right |")
    print("|---|---|---|---|---|---|")
    for template in sorted(by_template):
        print(row(template[:60].replace("|", "/"), by_template[template]))
    print(row("**all**", counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
