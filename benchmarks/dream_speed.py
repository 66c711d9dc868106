"""The dream against reality, in steps per second, side by side in one run (issue 48, item 4).

For a task family, with its shipped models and at each concurrency:

1. ``steps``: the oracle agent on the same test tasks, once on the real environment
   (``dg-agents eval``) and once in the dream (``dg-agents dream``): transitions per second of
   each, and their ratio (the target: the dream >= 5x);
2. ``grpo``: one GRPO batch of the same size (``--tasks`` tasks x ``--generations`` rollouts
   of the shipped warm start, the pipeline's rollout and trainer), in the dream and on the
   real environment: seconds a batch (rollouts and the optimisation step), and their ratio
   (the target: the dream's >= 3x faster);
3. ``eval``: a policy evaluation (the shipped warm start, greedy, ``dg-agents eval``) with this
   checkout and with an older one (``--before-python``: the Python of a venv where the older
   code is installed): turns per second of each, and their ratio (the target: >= 3x the older
   code's). An older checkout's venv::

       git worktree add /tmp/before bcc3e27 && cd /tmp/before && make install

    .venv/bin/python benchmarks/dream_speed.py --task alfworld --levels 8 32
    .venv/bin/python benchmarks/dream_speed.py --task alfworld --parts steps --dream-workers 1 2
    .venv/bin/python benchmarks/dream_speed.py --task webarena --parts eval \
        --before-python /tmp/before/.venv/bin/python

Prints a table and writes ``--json`` if asked. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def dg(args: list[str], *, python: str | None = None) -> dict[str, Any]:
    """Run ``dg-agents`` (this checkout's, or the one installed for ``python``); its
    summary.json."""
    command = [python or sys.executable, "-m", "dreamgym_agents.cli.main", *args]
    done = subprocess.run(command, cwd=ROOT if python is None else None, env=dict(os.environ),
                          capture_output=True, text=True)
    out = Path(args[args.index("--out") + 1])
    summary = out / "summary.json"
    if done.returncode != 0 and not summary.exists():
        raise SystemExit(f"dg-agents {' '.join(args[:3])} failed:\n{done.stdout[-1500:]}"
                         f"{done.stderr[-2500:]}")
    # an environment that lost some episodes (a browser page closed under load) still measured
    # the others: their steps over the wall time, the lost ones counted in the row
    return json.loads(summary.read_text())


def steps_part(task: str, level: int, episodes: int, workers: list[int],
               scratch: Path) -> list[dict[str, Any]]:
    """One real run of the oracle and a dream run of it for each number of dream processes."""
    common = ["--task", task, "--agent", "oracle", "--split", "test", "--limit", str(episodes),
              "--concurrency", str(level)]
    real = dg(["eval", *common, "--out", str(scratch / f"real-{level}")])
    r = real["real_transitions"] / real["wall_seconds"]
    rows = []
    for n in workers:
        dream = dg(["dream", *common, "--workers", str(n),
                    "--out", str(scratch / f"dream-{level}-{n}")])
        d = dream["synthetic_transitions"] / dream["wall_seconds"]
        rows.append({"part": "steps", "concurrency": level, "episodes": episodes,
                     "real_steps": real["real_transitions"], "real_wall_s": real["wall_seconds"],
                     "dream_steps": dream["synthetic_transitions"],
                     "dream_wall_s": dream["wall_seconds"],
                     "real_steps_per_s": round(r, 2), "dream_steps_per_s": round(d, 2),
                     "ratio": round(d / r, 2), "dream_workers": n,
                     "real_failed": real.get("failed_episodes", 0),
                     "dream_failed": dream.get("failed_episodes", 0)})
    return rows


def shipped_dream(task: str, family: Any, level: int) -> tuple[Any, Callable[[], None]]:
    """``level`` dream environments of ``task``'s shipped experience model and buffer, and what
    closes the model's gateway and buffer (close the pool first)."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.cli.experience import resolve_experience_model
    from dreamgym_agents.episodes.graph import EnvPool
    from dreamgym_agents.experience.dream import DreamConfig, DreamEnv
    from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym_agents.experience.training import trained_settings
    from dreamgym_agents.gateway.llm import Gateway, LLMConfig

    model_path, buffer_path = resolve_experience_model(None, task)
    gateway = Gateway(LLMConfig(model=model_path, max_concurrency=max(4, level)))
    buffer = ReplayBuffer(BufferConfig(path=buffer_path, family=family.name))
    exp_cfg = ExperienceConfig(**trained_settings(model_path))
    model = ExperienceModel(exp_cfg, gateway, buffer,
                            codec=family.experience_codec(exp_cfg.codec_version))
    pool = EnvPool(lambda: DreamEnv(DreamConfig(), model, buffer, family), level)

    def close() -> None:
        buffer.close()
        gateway.close()

    return pool, close


def grpo_part(task: str, level: int, tasks: int, generations: int, batches: int,
              scratch: Path) -> dict[str, Any]:
    """Seconds a GRPO batch takes in the dream and on the real environment (the mean of the
    batches after the first, which carries the trainer's and the environments' set-up)."""
    from dreamgym_agents.episodes.env import EnvConfig, env_config_for_agent, make_family
    from dreamgym_agents.episodes.graph import EnvPool
    from dreamgym_agents.pipeline.bundle import shipped_bundle
    from dreamgym_agents.pipeline.run import RL_LR, dream_tasks
    from dreamgym_agents.policy.model import PolicyAgent, PolicyConfig
    from dreamgym_agents.rl.grpo import GRPOStageConfig, train_grpo

    family = make_family(task)
    family.prepare(EnvConfig(), None)
    train = family.load_tasks("train")
    policy = str(shipped_bundle(task).policy_dir)
    cfg = GRPOStageConfig(max_steps=batches, tasks_per_step=tasks, num_generations=generations,
                          max_episode_steps=getattr(family, "rl_episode_steps", None) or 10,
                          learning_rate=RL_LR, concurrency=level)
    out: dict[str, Any] = {"part": "grpo", "concurrency": level,
                           "batch_episodes": tasks * generations}
    for side in ("dream", "real"):
        stamps: list[float] = []
        rollouts: list[float] = []
        close = None
        if side == "dream":
            pool, close = shipped_dream(task, family, level)
            chosen = dream_tasks(train, family)
        else:
            env_cfg = env_config_for_agent(family, EnvConfig(max_steps=cfg.max_episode_steps),
                                           PolicyAgent)
            pool = EnvPool(lambda c=env_cfg: family.make_env(c), level)
            chosen = train
        started = time.perf_counter()
        try:
            result = train_grpo(policy, scratch / f"grpo-{side}-{level}", chosen, pool, cfg,
                                PolicyConfig(), stage=f"bench-{side}", view=family.policy_view(),
                                on_batch=lambda figures, s=stamps, r=rollouts: (
                                    s.append(time.perf_counter()),
                                    r.append(figures["rollout/seconds"])))
        finally:
            pool.close()
            if close is not None:
                close()
        gaps = [b - a for a, b in zip([started, *stamps], stamps, strict=False)]
        later = gaps[1:] or gaps
        out[f"{side}_batch_s"] = round(sum(later) / len(later), 2)
        out[f"{side}_first_batch_s"] = round(gaps[0], 2) if gaps else None
        played = rollouts[1:] or rollouts
        # the rest of a batch: the optimisation step (and the trainer's bookkeeping)
        out[f"{side}_rollout_s"] = round(sum(played) / len(played), 2)
        out[f"{side}_update_s"] = round(out[f"{side}_batch_s"] - out[f"{side}_rollout_s"], 2)
        out[f"{side}_steps"] = result["real_transitions"] + result["synthetic_transitions"]
    family.close()
    out["ratio"] = round(out["real_batch_s"] / out["dream_batch_s"], 2)
    # the best a dream batch could do with rollouts that cost nothing: the real batch over the
    # update both sides share
    out["ratio_bound"] = round(out["real_batch_s"] / max(out["dream_update_s"], 1e-9), 2)
    return out


def eval_part(task: str, level: int, episodes: int, before: str | None,
              scratch: Path) -> dict[str, Any]:
    from dreamgym_agents.pipeline.bundle import shipped_bundle
    from dreamgym_agents.policy.model import PolicyConfig, save_policy_settings

    policy = scratch / "policy"
    if not policy.exists():
        shutil.copytree(shipped_bundle(task).policy_dir, policy)
        save_policy_settings(policy, PolicyConfig(), "compact")
    common = ["eval", "--task", task, "--agent", f"hf/{policy}", "--split", "test", "--limit",
              str(episodes), "--concurrency", str(level)]
    now = dg([*common, "--out", str(scratch / f"eval-now-{level}")])
    row = {"part": "eval", "concurrency": level, "episodes": episodes,
           "now_turns": now["real_transitions"], "now_wall_s": now["wall_seconds"],
           "now_turns_per_s": round(now["real_transitions"] / now["wall_seconds"], 2)}
    if before:
        old = dg([*common, "--out", str(scratch / f"eval-before-{level}")], python=before)
        row.update({"before": before, "before_turns": old["real_transitions"],
                    "before_wall_s": old["wall_seconds"],
                    "before_turns_per_s": round(old["real_transitions"] / old["wall_seconds"],
                                                2)})
        row["ratio"] = round(row["now_turns_per_s"] / row["before_turns_per_s"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--levels", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--parts", nargs="+", default=["steps", "grpo", "eval"],
                        choices=("steps", "grpo", "eval"))
    parser.add_argument("--episodes", type=int, default=0,
                        help="episodes a level (default: max(64, 2 x concurrency))")
    parser.add_argument("--dream-workers", type=int, nargs="+", default=[1],
                        help="steps: dg-agents dream --workers, one dream run for each "
                             "(processes sharing the episodes), against the same real run")
    parser.add_argument("--tasks", type=int, default=4, help="GRPO: tasks a batch")
    parser.add_argument("--generations", type=int, default=4, help="GRPO: rollouts a task")
    parser.add_argument("--batches", type=int, default=3, help="GRPO: batches a side")
    parser.add_argument("--before-python", dest="before", default=None,
                        help="eval: the Python of a venv with the older code (default: none)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="dg-speed-"))
    rows = []
    try:
        for level in args.levels:
            episodes = args.episodes or max(64, 2 * level)
            if "steps" in args.parts:
                for row in steps_part(args.task, level, episodes, args.dream_workers, scratch):
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            if "grpo" in args.parts:
                rows.append(grpo_part(args.task, level, args.tasks, args.generations,
                                      args.batches, scratch))
                print(json.dumps(rows[-1]), flush=True)
            if "eval" in args.parts:
                rows.append(eval_part(args.task, level, episodes, args.before, scratch))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{args.task}: the dream against reality (ratio: dream or now over real or before)")
    print("| part | concurrency | real / before | dream / now | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r["part"] == "steps":
            lost = "".join(f" ({r[k]} {side} episodes failed)" for k, side in
                           (("real_failed", "real"), ("dream_failed", "dream")) if r.get(k))
            procs = (f", dream in {r['dream_workers']} processes"
                     if r.get("dream_workers", 1) > 1 else "")
            print(f"| steps/s, oracle, {r['episodes']} test tasks{procs}{lost} | "
                  f"{r['concurrency']} | {r['real_steps_per_s']} | {r['dream_steps_per_s']} | "
                  f"{r['ratio']}x |")
        elif r["part"] == "grpo":
            print(f"| GRPO batch of {r['batch_episodes']} episodes, seconds (rollouts + "
                  f"update) | {r['concurrency']} | {r['real_batch_s']} ({r['real_rollout_s']} + "
                  f"{r['real_update_s']}) | {r['dream_batch_s']} ({r['dream_rollout_s']} + "
                  f"{r['dream_update_s']}) | {r['ratio']}x (at most {r['ratio_bound']}x) |")
        else:
            print(f"| eval turns/s, warm start, {r['episodes']} test tasks | {r['concurrency']} "
                  f"| {r.get('before_turns_per_s', '—')} | {r['now_turns_per_s']} | "
                  f"{r.get('ratio', '—')}x |")
    if args.json:
        args.json.write_text(json.dumps({"task": args.task, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
