import json

import pytest

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import (
    FORMAT_VERSION,
    ModelUsage,
    Task,
    Trajectory,
    Transition,
    append_trajectory,
    read_trajectories,
    to_hf_dataset,
    write_trajectories,
)


def make_traj(i: int = 0) -> Trajectory:
    task = Task(task_id=f"t{i}", family="webarena", intent="Find the price «X»", split="test",
                config={"eval": {"eval_types": ["string_match"]}, "nested": [1, {"a": None}]},
                oracle=[{"op": "stop", "answer": "$1.00"}])
    steps = [
        Transition(episode_id=f"e{i}", step=0, task_id=f"t{i}", state="[1] link 'A'",
                   action="click('1')", next_state="StaticText 'b'", reasoning="go",
                   usage=ModelUsage(calls=1, prompt_tokens=10, completion_tokens=3, cost_usd=0.01),
                   agent_seconds=0.5, env_seconds=0.25, info={"code": "x"}),
        Transition(episode_id=f"e{i}", step=1, task_id=f"t{i}", state="StaticText 'b'",
                   action="stop [b]", next_state="", reward=1.0, done=True, success=True,
                   valid=False, error="oops", provenance="synthetic"),
    ]
    return Trajectory(episode_id=f"e{i}", task=task, transitions=steps, success=True, reward=1.0,
                      agent="oracle", wall_seconds=1.5, info={"k": "v"})


def test_jsonl_round_trip_is_lossless(tmp_path):
    trajs = [make_traj(0), make_traj(1)]
    path = tmp_path / "t.jsonl"
    assert write_trajectories(path, trajs) == 2
    back = read_trajectories(path)
    assert back == trajs
    line = json.loads(path.read_text().splitlines()[0])
    assert line["format"] == FORMAT_VERSION
    assert back[0].usage.prompt_tokens == 10


def test_append_and_repair_partial_last_line(tmp_path):
    path = tmp_path / "t.jsonl"
    append_trajectory(path, make_traj(0))
    with open(path, "a") as fh:
        fh.write('{"episode_id": "e1", "task"')  # a write cut off by kill -9
    with pytest.raises(ConfigError):
        read_trajectories(path)
    assert [t.episode_id for t in read_trajectories(path, repair=True)] == ["e0"]
    append_trajectory(path, make_traj(2))
    assert [t.episode_id for t in read_trajectories(path)] == ["e0", "e2"]


def test_bad_provenance_and_future_format_are_rejected():
    with pytest.raises(ConfigError, match="provenance"):
        Transition(episode_id="e", step=0, task_id="t", state="", action="", next_state="",
                   provenance="dreamt")
    data = make_traj().to_dict()
    data["format"] = FORMAT_VERSION + 1
    with pytest.raises(ConfigError, match="not supported"):
        Trajectory.from_dict(data)


def test_hf_dataset_export():
    ds = to_hf_dataset([make_traj(0), make_traj(1)])
    assert len(ds) == 4
    assert set(["state", "action", "next_state", "reward", "intent", "provenance"]) <= set(
        ds.column_names)
    assert ds[1]["provenance"] == "synthetic" and ds[1]["reward"] == 1.0
    episodes = to_hf_dataset([make_traj(0)], level="episode")
    assert len(episodes) == 1 and len(episodes[0]["transitions"]) == 2


def test_records_cut_by_the_step_limit_read_as_truncated(tmp_path):
    old = make_traj(0)
    old.termination, old.success = "max_steps", False
    old.transitions[-1].success = False
    data = old.to_dict()  # as written before transitions carried the flag
    back = Trajectory.from_dict(json.loads(json.dumps(data)))
    assert back.transitions[-1].truncated and not back.transitions[-1].terminated
    assert make_traj(0).transitions[-1].terminated  # an environment's own ending stays one
