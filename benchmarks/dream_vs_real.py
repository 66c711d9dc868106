"""The same policy on the same train tasks, in the dream and on the real site.

What dream RL optimises is the dream's reward: where the dream calls an episode a success that
the real site calls a failure (or the other way round), GRPO in the dream pushes the policy the
wrong way. This plays a policy's sampled episodes (the temperature GRPO samples at) on train
tasks spread over the templates, ``--repeats`` times each, once in the dream of a run's
experience model and once on the real bundled site, and prints the success of both by the
tasks' WebArena eval type and the per-task correlation of the two success rates.

    .venv/bin/python benchmarks/dream_vs_real.py runs/quick [--checkpoint sft] \\
        [--tasks 32] [--repeats 4] [--temperature 1.0] [--out runs/dream-vs-real]

The run folder gives the experience model, its buffer and the checkpoint (a stage name of the
run or a checkpoint directory). Episodes go to ``OUT/{dream,real}-<repeat>/`` (resumable).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import time
from pathlib import Path

from dreamgym_agents.adapters.webarena.evaluation import task_eval_types
from dreamgym_agents.config import apply_mapping
from dreamgym_agents.episodes.env import spread_tasks
from dreamgym_agents.episodes.graph import RunConfig, run_episodes
from dreamgym_agents.pipeline.run import CONFIG_FILE, STATE_FILE, Pipeline, PipelineConfig
from dreamgym_agents.policy.model import PolicyAgent, PolicyModel
from dreamgym_agents.types import read_trajectories


def eval_kind(task) -> str:
    return "+".join(sorted(task_eval_types(task))) or "none"


def play(pipe: Pipeline, tasks, agent, out: Path, where: str, concurrency: int) -> dict:
    from dreamgym_agents.experience.dream import DreamConfig, DreamEnv

    if where == "real":
        family, env_cfg = pipe.family(), pipe.env_cfg()
        make = lambda: family.make_env(env_cfg)  # noqa: E731
    else:
        model, _, buffer = pipe.dream()
        family = pipe.family()
        make = lambda: DreamEnv(DreamConfig(), model, buffer, family)  # noqa: E731
    cfg = RunConfig(out_dir=out, concurrency=concurrency, max_steps=pipe.cfg.eval_max_steps,
                    meta={"benchmark": "dream_vs_real", "where": where,
                          "agent": agent.name, "temperature": agent.temperature})
    asyncio.run(run_episodes(tasks, make, agent, cfg))
    return {t.task.task_id: bool(t.success) for t in read_trajectories(out / "trajectories.jsonl")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a `dg-agents run` folder (its experience model and buffer)")
    parser.add_argument("--checkpoint", default="sft",
                        help="a stage of the run (sft, dream_rl, s2r) or a checkpoint directory")
    parser.add_argument("--tasks", type=int, default=32, help="train tasks, spread over templates")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", default="runs/dream-vs-real")
    args = parser.parse_args()
    run = Path(args.run)
    cfg = PipelineConfig()
    apply_mapping(cfg, json.loads((run / CONFIG_FILE).read_text()), "")
    pipe = Pipeline(cfg, run)
    pipe.state = json.loads((run / STATE_FILE).read_text())
    checkpoint = args.checkpoint if Path(args.checkpoint).is_dir() else \
        pipe.checkpoint(args.checkpoint)
    policy = PolicyModel.load(checkpoint, cfg.policy_view, pipe.family().policy_view())
    tasks = spread_tasks(pipe.family().load_tasks("train"), args.tasks)
    wins: dict[str, dict[str, list[bool]]] = {"dream": collections.defaultdict(list),
                                              "real": collections.defaultdict(list)}
    seconds = {}
    try:
        for where in ("dream", "real"):
            began = time.perf_counter()
            for r in range(args.repeats):
                agent = PolicyAgent(policy, temperature=args.temperature, keep_tokens=False,
                                    name=f"policy-{where}-{r}")
                got = play(pipe, tasks, agent, Path(args.out) / f"{where}-{r}", where,
                           args.concurrency)
                for task_id, ok in got.items():
                    wins[where][task_id].append(ok)
            seconds[where] = round(time.perf_counter() - began, 1)
    finally:
        pipe.close()
    by_kind: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for task in tasks:
        row = by_kind[eval_kind(task)]
        row[0] += 1
        row[1] += sum(wins["dream"][task.task_id])
        row[2] += sum(wins["real"][task.task_id])
        row[3] += len(wins["real"][task.task_id])
    print(f"checkpoint {checkpoint}; {len(tasks)} train tasks x {args.repeats}, "
          f"T={args.temperature}; dream {seconds['dream']} s, real {seconds['real']} s")
    print("| eval type | tasks | dream success | real success |")
    print("|---|---|---|---|")
    total = [sum(col) for col in zip(*by_kind.values(), strict=True)]
    rows = [*sorted(by_kind.items()), ("all", total)]
    for kind, (count, d, r, n) in rows:
        print(f"| {kind} | {count} | {d}/{n} ({d / n:.2f}) | {r}/{n} ({r / n:.2f}) |")
    rates = [(statistics.mean(wins["dream"][t.task_id]), statistics.mean(wins["real"][t.task_id]))
             for t in tasks]
    xs, ys = zip(*rates, strict=True)
    if statistics.pstdev(xs) > 0 and statistics.pstdev(ys) > 0:
        print(f"per-task correlation of the success rates: {statistics.correlation(xs, ys):.2f}")


if __name__ == "__main__":
    main()
