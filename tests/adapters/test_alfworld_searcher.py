"""The searcher: an ALFWorld expert that acts on what it has seen (no planner, no hidden layout),
so the same agent plays a real game and the dream."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("alfworld")

from dreamgym_agents.adapters.alfworld.agents import SearcherAgent  # noqa: E402
from dreamgym_agents.adapters.alfworld.belief import Belief  # noqa: E402
from dreamgym_agents.adapters.alfworld.goals import Goal  # noqa: E402
from dreamgym_agents.episodes.env import EnvConfig, Observation, make_family  # noqa: E402
from dreamgym_agents.episodes.graph import RunConfig, run_episodes  # noqa: E402
from dreamgym_agents.types import Task, read_trajectories  # noqa: E402


@pytest.mark.parametrize(("instruction", "goal"), [
    ("put a watch in shelf", Goal("watch", "shelf")),
    ("put some pan on countertop", Goal("pan", "countertop")),
    ("put a clean soapbar in bathtubbasin", Goal("soapbar", "bathtubbasin", "clean")),
    ("heat some egg and put it in garbagecan", Goal("egg", "garbagecan", "hot")),
    ("put a cool tomato in sinkbasin", Goal("tomato", "sinkbasin", "cool")),
    ("find two mug and put them in fridge", Goal("mug", "fridge", count=2)),
    ("look at vase under the floorlamp", Goal("vase", lamp="floorlamp")),
    ("examine the pencil with the desklamp", Goal("pencil", lamp="desklamp")),
    ("dance with the moon", None),
])
def test_the_goal_is_read_from_the_instruction(instruction, goal):
    assert Goal.parse(instruction) == goal


def test_it_looks_where_the_object_can_be_opens_what_is_closed_and_takes_it():
    agent = SearcherAgent()
    task = Task(task_id="t", family="alfworld", intent="put a cool apple in countertop")
    belief = Belief.start("You are in the middle of a room. Looking quickly around you, you see "
                          "a cabinet 1, a countertop 1, a fridge 1, and a toilet 1.\n\nYour task "
                          "is to: put a cool apple in countertop.")

    def act() -> str:
        obs = Observation(state=belief.render(), info={})
        return asyncio.run(agent.act(task, obs, [], "e")).action

    assert act() == "go to countertop 1"  # an apple's place, a surface: one step to see it
    belief.update("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you "
                  "see a soapbar 4.")
    assert act() in ("go to cabinet 1", "go to fridge 1")
    belief.update("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.")
    assert act() == "open fridge 1"
    belief.update("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see "
                  "a apple 1, and a egg 2.")
    assert act() == "take apple 1 from fridge 1"
    belief.update("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1.")
    assert act() == "cool apple 1 with fridge 1"
    belief.update("cool apple 1 with fridge 1", "You cool the apple 1 using the fridge 1.")
    assert act() == "go to countertop 1"
    belief.update("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you "
                  "see a soapbar 4.")
    assert act() == "move apple 1 to countertop 1"


@pytest.mark.slow
def test_it_solves_real_games_of_every_type_without_the_expert(tmp_path):
    family = make_family("alfworld")
    cfg = EnvConfig(max_steps=30)
    by_type: dict[str, Task] = {}
    for task in family.load_tasks("test"):
        by_type.setdefault(task.config["task_type"], task)
    tasks = list(by_type.values())
    assert len(tasks) == 6
    agent = family.offline_agents()["searcher"]
    assert not agent.needs_expert
    family.prepare(cfg, tasks)
    try:
        run = RunConfig(out_dir=tmp_path, concurrency=2, max_steps=cfg.max_steps,
                        meta={"command": "test", "agent": "searcher"})
        result = asyncio.run(run_episodes(tasks, lambda: family.make_env(cfg), agent, run))
    finally:
        family.close()
    assert not result.failed
    episodes = read_trajectories(tmp_path / "trajectories.jsonl")
    assert [t.task.task_id for t in episodes if not t.success] == []
    assert all(t.valid for traj in episodes for t in traj.transitions)


def test_the_decoy_misses_first_then_the_expert_reaches_the_goal(tmp_path):
    """Real games: the decoy's first move or use never meets the goal (the game says so), and
    the expert it follows then does, in most games."""
    family = make_family("alfworld")
    by_type: dict[str, list[Task]] = {}
    for task in family.load_tasks("train"):
        by_type.setdefault(task.config["task_type"], []).append(task)
    picked = [t for tasks in by_type.values() for t in tasks[:2]]  # two of each of the six
    agent = family.offline_agents()["decoy"]
    cfg = EnvConfig(max_steps=30)
    family.prepare(cfg, picked)
    try:
        asyncio.run(run_episodes(picked, lambda: family.make_env(cfg), agent,
                                 RunConfig(out_dir=tmp_path, concurrency=2)))
    finally:
        family.close()
    episodes = read_trajectories(tmp_path / "trajectories.jsonl")
    firsts = [next((t for t in ep.transitions
                    if t.valid and t.action.startswith(("move ", "use "))), None)
              for ep in episodes]
    assert sum(f is not None for f in firsts) >= 9
    assert all(f.reward == 0 for f in firsts if f is not None)
    # marked as exploration: the warm start does not imitate a near miss
    assert all(f.reasoning.startswith("exploration") for f in firsts if f is not None)
    assert sum(ep.success for ep in episodes) >= 9


def test_a_warm_start_never_learns_from_the_decoy(tmp_path):
    """The decoy's episodes teach the experience model only (its near miss is no example for
    a policy): a warm start's offline data leaves them out, from a collection folder or from
    a bundle's compact file."""
    from dreamgym_agents.pipeline.bundle import write_episodes
    from dreamgym_agents.pipeline.embedded import warm_start_excluded
    from dreamgym_agents.pipeline.run import read_offline
    from dreamgym_agents.types import Trajectory

    task = make_family("alfworld").load_tasks("train")[0]
    made = {name: Trajectory(episode_id=f"{name}-1", task=task, agent=name, success=True)
            for name in ("decoy", "noisy", "oracle", "random")}
    for name, traj in made.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "trajectories.jsonl").write_text(
            json.dumps(traj.to_dict()) + "\n")
    write_episodes(tmp_path / "collect.jsonl.gz", list(made.items()))
    excluded = warm_start_excluded(make_family("alfworld"))
    assert set(excluded) == {"oracle", "decoy"}
    for source in (tmp_path / "runs", tmp_path / "collect.jsonl.gz"):
        assert sorted(t.agent for t in read_offline(source, exclude=excluded)) == [
            "noisy", "random"]
    assert warm_start_excluded(make_family("webarena")) == ("oracle",)


def test_the_expert_plans_only_for_an_agent_that_follows_it():
    """A run's environments plan with the expert for the oracle, the noisy expert and the decoy
    (they read its plan), not for the searcher, the random agent or a hosted model; what the
    user set stays."""
    from dreamgym_agents.episodes.env import env_config_for_agent, env_options

    family = make_family("alfworld")
    agents = family.offline_agents()

    class Hosted:  # an agent with no needs_expert (a hosted model, a trained policy)
        name = "openai/x"

    def expert(agent, **options) -> bool:
        cfg = env_config_for_agent(family, EnvConfig(options=options), agent)
        return env_options(family, cfg).expert

    assert expert(agents["oracle"]) and expert(agents["noisy"]) and expert(agents["decoy"])
    assert not expert(agents["searcher"]) and not expert(agents["random"])
    assert not expert(agents["decoy-searcher"]) and not expert(Hosted())
    assert expert(Hosted(), expert=True)  # --set env.expert=true
    assert not expert(agents["oracle"], expert=False)
    env = family.make_env(env_config_for_agent(family, EnvConfig(), Hosted()))
    assert env._expert is False
