"""Does one GRPO batch move the policy the way its advantages say? Winners up, losers down.

Plays ``--batches`` GRPO batches (``--tasks`` games × ``--generations`` rollouts each, sampled
at T = 1) on the family's *real* environment with :func:`~dreamgym_agents.rl.grpo.train_grpo`,
then scores every rollout's actions under the policy before and after the stage (the same
turn-level scoring the trainer uses, within each action's grammar where the episode was
decoded under one) and prints, for the episodes of groups whose rewards differ, the mean change
of the per-token log-probability of winners and of losers, and the same for groups whose
rewards are all equal (their advantage is 0: only the KL term and the optimiser's drift move
them)::

    python benchmarks/grpo_step_check.py --policy bundles/alfworld/policy --task alfworld \
        --out /tmp/grpo-check --batches 2 --lr 2e-4

A sign or alignment error in the objective shows as winners going down; noise shows as winners
and losers moving alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dreamgym_agents.episodes.env import EnvConfig, make_family, spread_tasks
from dreamgym_agents.episodes.graph import EnvPool
from dreamgym_agents.policy.model import PolicyModel, episode_tokens
from dreamgym_agents.rl.grpo import ROLLOUTS_FILE, ConstraintBook, GRPOStageConfig, train_grpo
from dreamgym_agents.types import read_trajectories


def action_logps(policy: PolicyModel, trajectories: list, tasks: dict) -> list[float]:
    """Mean log-probability per action token of each episode under ``policy`` (T = 1), each
    action token scored within the grammar of its turn where the policy decodes under one."""
    import torch

    from dreamgym_agents.rl.grpo import turn_logps

    out = []
    policy.model.eval()
    for traj in trajectories:
        task = tasks[str(traj.task.task_id)]
        tokens = episode_tokens(policy, task, traj.transitions)
        if policy.cfg.constrained_decoding:
            allowed: list[list[int] | None] = [None] * len(tokens.ids)
            for i, start in enumerate(tokens.turns):
                ids = tokens.turn_ids(i)
                acts = [start + j for j in range(len(ids)) if tokens.mask[start + j]]
                grammar = policy.constraint(task, traj.transitions[i].state)
                if grammar is None:
                    continue
                prefix: list[int] = []
                for pos in acts:
                    allowed[pos] = grammar.allowed(prefix)
                    prefix.append(tokens.ids[pos])
            tokens.allowed = allowed
        book = ConstraintBook()
        book.add(tokens)
        ids = torch.tensor([tokens.ids])
        keep = len(tokens.ids) - tokens.prompt_len
        with torch.no_grad():
            logps, _ = turn_logps(policy.model, ids, torch.ones_like(ids), keep, user_id=-1,
                                  assistant_id=-1, pad_id=policy.eos_id, constraints=book)
        mask = torch.tensor(tokens.env_mask, dtype=torch.bool)
        out.append(float(logps[0][mask].mean()))
    return out


def fresh_games(family, seeds: list, seed: int) -> list:
    """One new game per seed task, as the curriculum makes its variants (never a train,
    validation or test game)."""
    from dreamgym_agents.heldout import HeldOut
    from dreamgym_agents.rl.curriculum import Curriculum, CurriculumConfig

    train = family.load_tasks("train")
    generator, feasible = family.task_generator(train, seed=seed)
    curriculum = Curriculum(CurriculumConfig(), generator, train, feasible=feasible,
                            held_out=HeldOut.for_family(family),
                            keys=getattr(family, "task_keys", None))
    return [made for task in seeds if (made := curriculum.variant(task)) is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True)
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--split", default="train")
    parser.add_argument("--out", required=True)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=4, help="games per batch")
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--pool", type=int, default=16, help="games drawn from (spread)")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--episode-steps", type=int, default=15)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true",
                        help="train on new games of the drawn tasks' types and rooms (the "
                        "curriculum's variants: other placements, often other goals) instead")
    args = parser.parse_args()

    family = make_family(args.task)
    env_cfg = EnvConfig(max_steps=args.episode_steps, seed=args.seed)
    tasks = spread_tasks(family.load_tasks(args.split), args.pool)
    if args.fresh:
        tasks = fresh_games(family, tasks, args.seed)
    family.prepare(env_cfg, tasks)
    pool = EnvPool(lambda: family.make_env(env_cfg), args.concurrency)
    cfg = GRPOStageConfig(max_steps=args.batches, tasks_per_step=args.tasks,
                          num_generations=args.generations, learning_rate=args.lr,
                          beta=args.beta, loss_type=args.loss_type,
                          max_episode_steps=args.episode_steps, concurrency=args.concurrency,
                          seed=args.seed)
    view = family.policy_view()
    before = PolicyModel.load(args.policy, view=view)
    out = Path(args.out)
    try:
        result = train_grpo(args.policy, out, tasks, pool, cfg, before.cfg, view=view)
    finally:
        pool.close()
        family.close()
    after = PolicyModel.load(out / "policy", before.cfg, view)
    rollouts = read_trajectories(out / ROLLOUTS_FILE)
    by_id = {str(t.task_id): t for t in tasks}
    lp0 = action_logps(before, rollouts, by_id)
    lp1 = action_logps(after, rollouts, by_id)
    groups: dict[str, list[int]] = {}
    for i, traj in enumerate(rollouts):
        batch_group = "-".join(traj.episode_id.split("-")[:3])  # stage-batch-task
        groups.setdefault(batch_group, []).append(i)
    rows = {"winners (mixed groups)": [], "losers (mixed groups)": [],
            "all won": [], "all lost": []}
    for members in groups.values():
        won = [bool(rollouts[i].success) for i in members]
        for i, w in zip(members, won, strict=True):
            if all(won):
                rows["all won"].append(i)
            elif not any(won):
                rows["all lost"].append(i)
            else:
                rows["winners (mixed groups)" if w else "losers (mixed groups)"].append(i)
    print(f"{len(rollouts)} rollouts in {len(groups)} groups; "
          f"{sum(bool(t.success) for t in rollouts)} won; stage: "
          f"{json.dumps({k: result.get(k) for k in ('steps', 'seconds')})}")
    print("| episodes | n | mean log p per action token, before | after | change |")
    print("|---|---|---|---|---|")
    for name, idx in rows.items():
        if not idx:
            print(f"| {name} | 0 | | | |")
            continue
        b = statistics.mean(lp0[i] for i in idx)
        a = statistics.mean(lp1[i] for i in idx)
        print(f"| {name} | {len(idx)} | {b:.4f} | {a:.4f} | {a - b:+.4f} |")


if __name__ == "__main__":
    main()
