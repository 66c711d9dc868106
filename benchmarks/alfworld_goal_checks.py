"""Fine-tune the shipped ALFWorld experience model into the latest codec (version 3: the goal's
checks in its prompt; 4: references to the held object, the place and the help text) on the
bundle's collection plus decoy episodes (near misses the game scores), and print what it was
trained on.

    python benchmarks/alfworld_goal_checks.py --decoys runs/decoy/trajectories.jsonl \
        --out runs/em-v3 --steps 600

Then measure it as the bundle is measured: ``dg-agents fidelity --task alfworld
--experience-model hf/runs/em-v3/model --buffer-path runs/em-v3/buffer --real <oracle run>
--real <random run> --real <decoy run>`` (held-out test games), and in the dream with
``dg-agents dream --task alfworld --agent decoy-searcher --experience-model hf/runs/em-v3/model
--buffer-path runs/em-v3/buffer --split test`` (what the dream rewards that the goal does not:
``reward_check`` in its summary). An experiment on the way to the next bundle (which builds
from nothing with ``experience_recipe.codec_version=3`` and ``decoy_tasks``), not the recipe.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.experience.data import ExampleConfig
from dreamgym_agents.experience.sft import ExperienceSFTConfig
from dreamgym_agents.experience.training import train_from_trajectories
from dreamgym_agents.pipeline.bundle import read_episodes, shipped_bundle
from dreamgym_agents.pipeline.embedded import family_recipe, renamed_copies
from dreamgym_agents.types import read_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoys", type=Path, action="append", default=[],
                        help="trajectories.jsonl of `dg-agents eval --agent decoy` on train games")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--from-scratch", action="store_true",
                        help="train a new model with the recipe's shape instead")
    parser.add_argument("--base-model", type=Path, default=None,
                        help="start from this checkpoint [the shipped bundle's experience model]")
    parser.add_argument("--codec-version", type=int, default=None,
                        help="the ALFWorld codec version to train in [the latest]")
    parser.add_argument("--contrast-repeat", type=int, default=1,
                        help="times a step whose reward most of its demonstrations do not share "
                             "is shown [1]")
    parser.add_argument("--max-examples", type=int, default=None,
                        help="examples sampled (final steps first) [the recipe's + 30 a decoy]")
    args = parser.parse_args()

    bundle = shipped_bundle("alfworld")
    if bundle is None:
        raise SystemExit("no shipped ALFWorld bundle")
    recipe = family_recipe("alfworld")
    episodes = read_episodes(bundle.root / "episodes" / "collect.jsonl.gz")
    decoys = []
    for path in args.decoys:
        for traj in read_trajectories(path):
            traj.provenance = "offline"
            traj.info["collector"] = "decoy"
            for t in traj.transitions:
                t.provenance = "offline"
            decoys.append(traj)
    everything = [*episodes, *decoys]
    renamed = renamed_copies("alfworld", everything, recipe.entity_swaps, recipe.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    buffer = ReplayBuffer(BufferConfig(path=str(args.out / "buffer"), family="alfworld"))
    try:
        buffer.clear()
        manifest = train_from_trajectories(
            everything, buffer,
            ExampleConfig(max_examples=args.max_examples or recipe.max_examples + 30 * len(decoys),
                          seed=recipe.seed,
                          use_history=recipe.use_history, use_retrieval=recipe.use_retrieval,
                          use_reasoning=recipe.use_reasoning,
                          final_answer_repeat=recipe.final_answer_repeat, judge_repeat=0,
                          contrast_repeat=args.contrast_repeat),
            ExperienceSFTConfig(
                output_dir=str(args.out / "model"), vocab_size=recipe.vocab_size,
                hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                max_length=recipe.max_length, max_steps=args.steps,
                batch_size=recipe.batch_size, learning_rate=args.learning_rate,
                decision_weight=recipe.decision_weight, checkpoint_every=100, seed=recipe.seed,
                base_model=None if args.from_scratch else
                str(args.base_model or bundle.root / "experience")),
            codec_version=args.codec_version, renamed=renamed,
            on_step=None, family=make_family("alfworld"))
    finally:
        buffer.close()
    print(json.dumps({k: manifest[k] for k in ("episodes", "transitions", "examples", "steps",
                                               "first_loss", "last_loss", "codec_version",
                                               "renamed_episodes", "timings")},
                     indent=1))
    print(f"decoy episodes: {len(decoys)}")


if __name__ == "__main__":
    main()
