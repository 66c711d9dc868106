"""Throughput of the in-process ``hf/`` provider: one caller at a time vs concurrent callers.

Prints figures (nothing is asserted). The prompts are the experience model's own: held-out
transitions of a recorded run (``dg-agents eval`` output), rendered with the model's buffer, as
``dg-agents fidelity`` asks them. Concurrent callers share batches (``local_provider``), so the
tokens per second should grow with the callers up to ``DG_LOCAL_MAX_BATCH``.

    .venv/bin/python benchmarks/local_generation.py --real runs/test-oracle \\
        [--checkpoint DIR --buffer DIR] [--prompts 32] [--callers 1,4,8,16]

Without ``--checkpoint``/``--buffer`` it uses the embedded default (built first if needed).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
from dreamgym_agents.gateway.local import _get_loaded, generate_local
from dreamgym_agents.types import read_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", required=True, help="a dg-agents eval output folder")
    parser.add_argument("--checkpoint", help="model folder (default: the embedded default)")
    parser.add_argument("--buffer", help="buffer folder of that model")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--callers", default="1,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=600)
    args = parser.parse_args()
    if args.checkpoint is None:
        from dreamgym_agents.pipeline.embedded import ensure_embedded_experience_model

        paths = ensure_embedded_experience_model("webarena", progress=print)
        args.checkpoint, args.buffer = paths["checkpoint"], paths["buffer"]
    buffer = ReplayBuffer(BufferConfig(path=args.buffer))
    model = ExperienceModel(ExperienceConfig(prompt_style="compact"), gateway=None, buffer=buffer,
                            codec=make_family("webarena").experience_codec())
    prompts = []
    for traj in read_trajectories(f"{args.real}/trajectories.jsonl"):
        for i, t in enumerate(traj.transitions):
            demos = model.retrieve(t.state, t.action, traj.episode_id,
                                   intent=traj.task.intent, params=traj.task.params)
            prompts.append(model.build_messages(traj.task, traj.transitions[:i], t.state,
                                                t.action, demos))
        if len(prompts) >= args.prompts:
            break
    prompts = prompts[: args.prompts]
    buffer.close()
    generate_local(args.checkpoint, prompts[0], max_tokens=8)  # load the model once
    batcher = _get_loaded(args.checkpoint).batcher
    print(f"{len(prompts)} prompts, max {args.max_tokens} new tokens, greedy")
    for callers in [int(c) for c in args.callers.split(",")]:
        before = (batcher.batches, batcher.rows)
        start = time.perf_counter()
        with ThreadPoolExecutor(callers) as pool:
            results = list(pool.map(
                lambda p: generate_local(args.checkpoint, p, max_tokens=args.max_tokens),
                prompts))
        seconds = time.perf_counter() - start
        tokens = sum(r.completion_tokens for r in results)
        batches, rows = batcher.batches - before[0], batcher.rows - before[1]
        print(f"callers {callers:>2}: {seconds:6.1f} s, {tokens / seconds:6.0f} new tokens/s, "
              f"{len(prompts) / seconds:5.2f} answers/s, mean batch {rows / max(batches, 1):.1f}")


if __name__ == "__main__":
    main()
