"""An experience model's recorded fidelity predictions next to the trivial baselines, as a table.

Re-scores a ``dg-agents fidelity`` (or ``build-embedded`` measure) folder's ``predictions.jsonl``
without calling the model again: reward and done as accuracy, balanced accuracy and F1 beside
"reward always 0" and "done read off the action's type"; the next page's state F1 beside
"copy the current page" (which needs the real runs the predictions were made on).

    .venv/bin/python benchmarks/fidelity_baselines.py runs/bundle/measure/fidelity \\
        runs/bundle/measure/test-oracle runs/bundle/measure/test-random

Prints a markdown table (the figures ``dg-agents fidelity`` writes under ``baselines`` and
``*_balanced_accuracy`` / ``*_f1`` for new runs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dreamgym_agents.episodes.env import ends_by_type, make_family
from dreamgym_agents.experience.fidelity import binary_scores, state_f1
from dreamgym_agents.experience.model import transition_id
from dreamgym_agents.types import read_trajectories


def rescore(predictions: list[dict], real: dict[str, object],
            family: str = "webarena") -> dict[str, dict]:
    """Model and baseline scores of recorded predictions (``real``: transition id → the real
    transition, for the copy baseline; ``family``: whose action set says which actions end an
    episode)."""
    missing = [row["id"] for row in predictions if row["id"] not in real]
    if missing:
        raise SystemExit(f"{len(missing)} predicted transitions are not in the real runs given "
                         f"(first: {missing[0]}): pass the runs the predictions were made on")
    reward_truth = [row["real"]["reward"] > 0.5 for row in predictions]
    done_truth = [bool(row["real"]["done"]) for row in predictions]

    def said(row: dict, key: str) -> bool | None:
        p = row["predicted"]
        return None if p is None else (p["reward"] > 0.5 if key == "reward" else bool(p[key]))

    n = len(predictions)
    tasks = make_family(family)
    try:
        ends = ends_by_type(tasks.action_set())
    finally:
        tasks.close()
    model_state = sum(row["state_f1"] or 0.0 for row in predictions) / n
    copies = [state_f1(real[row["id"]].state, real[row["id"]].next_state)  # type: ignore[attr-defined]
              for row in predictions]
    return {
        "reward": {"model": binary_scores(reward_truth, [said(r, "reward") for r in predictions]),
                   "baseline": binary_scores(reward_truth, [False] * n),
                   "baseline_name": "always 0"},
        "done": {"model": binary_scores(done_truth, [said(r, "done") for r in predictions]),
                 "baseline": binary_scores(done_truth, [ends(r["action"])
                                                        for r in predictions]),
                 "baseline_name": "from the action's type"},
        "state_f1": {"model": round(model_state, 4), "baseline": round(sum(copies) / n, 4),
                     "baseline_name": "copy the current page"},
        "n": n,
    }


def table(scores: dict[str, dict]) -> str:
    def fmt(x: object) -> str:
        return "–" if x is None else f"{x:.3f}"

    lines = ["| target | scorer | accuracy | balanced accuracy | F1 (positive) |",
             "|---|---|---|---|---|"]
    for key in ("reward", "done"):
        s = scores[key]
        pos = s["model"]["positives"]
        lines.append(f"| {key} ({pos} positive of {scores['n']}) | experience model | "
                     f"{fmt(s['model']['accuracy'])} | {fmt(s['model']['balanced_accuracy'])} | "
                     f"{fmt(s['model']['f1'])} |")
        lines.append(f"| | baseline: {s['baseline_name']} | {fmt(s['baseline']['accuracy'])} | "
                     f"{fmt(s['baseline']['balanced_accuracy'])} | {fmt(s['baseline']['f1'])} |")
    s = scores["state_f1"]
    lines.append(f"| next state (state F1) | experience model | {fmt(s['model'])} | | |")
    lines.append(f"| | baseline: {s['baseline_name']} | {fmt(s['baseline'])} | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("fidelity", type=Path, help="a fidelity output folder")
    parser.add_argument("real", type=Path, nargs="+", help="the real run folders it scored")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args()
    path = args.fidelity / "predictions.jsonl"
    if not path.exists():
        raise SystemExit(f"no predictions.jsonl in {args.fidelity}")
    predictions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    real = {transition_id(t): t for run in args.real
            for traj in read_trajectories(run / "trajectories.jsonl") for t in traj.transitions}
    scores = rescore(predictions, real)
    print(json.dumps(scores, indent=2) if args.json else table(scores))


if __name__ == "__main__":
    main()
