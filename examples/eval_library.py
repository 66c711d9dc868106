"""Run an evaluation from Python instead of the CLI: the same pieces `dg-agents eval` wires up.

    .venv/bin/python examples/eval_library.py                 # oracle, 5 test tasks
    .venv/bin/python examples/eval_library.py openai/gpt-4o-mini   # needs OPENAI_API_KEY
"""

from __future__ import annotations

import asyncio
import sys

from dreamgym_agents.episodes.agent import make_agent
from dreamgym_agents.episodes.env import EnvConfig, make_family
from dreamgym_agents.episodes.graph import RunConfig, run_episodes


def main(agent_name: str = "oracle") -> None:
    family = make_family("webarena")
    tasks = family.load_tasks("test")[:5]
    env_cfg = EnvConfig(max_steps=10)
    agent = make_agent(agent_name, family)  # an offline agent by name, or a model string
    print(family.prepare(env_cfg, tasks))
    try:
        result = asyncio.run(run_episodes(
            tasks,
            lambda: family.make_env(env_cfg),
            agent,
            RunConfig(out_dir=f"runs/example-{agent.name.replace('/', '_')}", concurrency=2,
                      max_steps=env_cfg.max_steps, meta={"agent": agent.name}),
            on_episode=lambda traj: traj and print(traj.task.task_id, traj.success),
        ))
    finally:
        family.close()
    print({k: result.summary[k] for k in ("episodes", "success_rate", "mean_env_step_seconds")})


if __name__ == "__main__":
    main(*sys.argv[1:2])
