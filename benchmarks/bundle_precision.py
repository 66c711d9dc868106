"""What storing a bundle's weights in bfloat16 changes: the same inputs through the float32
models a build trained and the bfloat16 ones it packaged (both computing in float32).

- policy: every turn of the recorded episodes, greedy (constrained as configured): how many
  actions differ;
- experience model: teacher-forced predictions of the recorded transitions (greedy): how many
  answers differ in text, and in reward / done / success; and how many of each precision's
  verdicts match the real transition.

    .venv/bin/python benchmarks/bundle_precision.py runs/bundle \\
        runs/bundle/measure/test-oracle/trajectories.jsonl [--limit 60]

``runs/bundle`` is a ``dg-agents build-embedded --out`` folder: ``experience/model`` and
``policy/model`` (float32) beside ``bundle/`` (as packaged).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time
from pathlib import Path

from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
from dreamgym_agents.experience.training import trained_settings
from dreamgym_agents.gateway.llm import Gateway, LLMConfig
from dreamgym_agents.policy.model import PolicyModel, error_seen, written_actions
from dreamgym_agents.types import read_trajectories


def policy_turns(checkpoint: Path, episodes: list) -> list[str]:
    policy = PolicyModel.load(checkpoint, view=make_family("webarena").policy_view())
    jobs = []
    for episode in episodes:
        written = written_actions(episode.transitions, policy.cfg, policy.view)
        for i, t in enumerate(episode.transitions):
            ids = policy.segment_ids(episode.task, t.state, written[:i],
                                     error_seen(episode.transitions, i))
            jobs.append((ids, policy.constraint(episode.task, t.state)))

    def act(job: tuple) -> str:
        ids, constraint = job
        return policy.decode(policy.generate(ids, 0.0, constraint)).strip()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(act, jobs))


def predictions(checkpoint: Path, buffer_dir: str, episodes: list) -> list[tuple]:
    model_string = f"hf/{checkpoint}"
    gateway = Gateway(LLMConfig(model=model_string, max_concurrency=16))
    buffer = ReplayBuffer(BufferConfig(path=buffer_dir))
    try:
        model = ExperienceModel(ExperienceConfig(**trained_settings(model_string)), gateway,
                                buffer, codec=make_family("webarena").experience_codec())
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            pairs = [p for ep in pool.map(model.predict_trajectory, episodes) for p in ep]
    finally:
        buffer.close()
        gateway.close()
    out = []
    for real, prediction in pairs:
        o = prediction.output
        out.append((prediction.raw,
                    None if o is None else (o.reward > 0.5, bool(o.done), bool(o.success)),
                    (real.reward > 0.5, real.terminated, real.success)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="a dg-agents build-embedded --out folder")
    parser.add_argument("episodes", help="trajectories.jsonl of recorded (held-out) episodes")
    parser.add_argument("--limit", type=int, default=60, help="episodes used")
    args = parser.parse_args()
    episodes = read_trajectories(args.episodes)[: args.limit]
    buffer = str(args.build / "measure" / "buffer" / "db")
    start = time.perf_counter()
    full = policy_turns(args.build / "policy" / "model", episodes)
    half = policy_turns(args.build / "bundle" / "policy", episodes)
    same = sum(a == b for a, b in zip(full, half, strict=True))
    print(f"policy: {same}/{len(full)} greedy actions identical "
          f"({len(full) - same} differ) over {len(episodes)} episodes")
    full_em = predictions(args.build / "experience" / "model", buffer, episodes)
    half_em = predictions(args.build / "bundle" / "experience", buffer, episodes)
    text = sum(a[0] == b[0] for a, b in zip(full_em, half_em, strict=True))
    outcome = sum(a[1] == b[1] for a, b in zip(full_em, half_em, strict=True))
    print(f"experience model: {text}/{len(full_em)} answers identical in text, "
          f"{outcome}/{len(full_em)} in reward/done/success")
    right = [sum(p[1] == p[2] for p in em) for em in (full_em, half_em)]
    print(f"experience model verdicts (reward, done, success) matching the real transition: "
          f"float32 {right[0]}/{len(full_em)}, bfloat16 {right[1]}/{len(half_em)}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
