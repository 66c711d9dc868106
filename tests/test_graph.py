import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import counter_tasks
from counter_agents import Babbler, CounterSolver

from dreamgym_agents.episodes.graph import RunConfig, run_episodes, summarize
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import read_trajectories


def run(tasks, factory, agent, out, **kw):
    cfg = RunConfig(out_dir=out, concurrency=kw.pop("concurrency", 2),
                    max_steps=kw.pop("max_steps", 6), meta={"agent": agent.name})
    return asyncio.run(run_episodes(tasks, factory, agent, cfg))


def test_runs_every_episode_once_and_summarizes(tmp_path, counter_env_factory):
    result = run(counter_tasks(7), counter_env_factory, CounterSolver(), tmp_path, concurrency=3)
    trajs = read_trajectories(tmp_path / "trajectories.jsonl")
    assert sorted(t.task.task_id for t in trajs) == [str(i) for i in range(7)]
    assert all(t.success for t in trajs)
    assert result.summary["success_rate"] == 1.0
    assert result.summary["real_transitions"] == sum(len(t.transitions) for t in trajs)
    assert result.summary["synthetic_transitions"] == 0
    # at most `concurrency` environments were made, and all were closed
    assert 1 <= len(counter_env_factory.made) <= 3
    assert all(env.closed for env in counter_env_factory.made)
    t = next(t for t in trajs if t.task.task_id == "2")
    assert [s.action for s in t.transitions] == ["inc", "inc", "stop [2]"]
    assert t.transitions[-1].reward == 1.0 and t.transitions[-1].done
    assert t.transitions[0].next_state == t.transitions[1].state
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == 7 and "wall_seconds" in summary


def test_invalid_action_is_a_recorded_step(tmp_path, counter_env_factory):
    run(counter_tasks(1), counter_env_factory, Babbler(), tmp_path)
    (traj,) = read_trajectories(tmp_path / "trajectories.jsonl")
    first = traj.transitions[0]
    assert not first.valid and "expected" in first.error and first.reward == 0.0
    assert traj.transitions[1].done and traj.success  # target 0, "stop [0]"


def test_max_steps_ends_the_episode(tmp_path, counter_env_factory):
    class Looper:
        name = "looper"

        async def act(self, *a):
            from dreamgym_agents.episodes.agent import Decision
            return Decision(action="inc")

    run(counter_tasks(1), counter_env_factory, Looper(), tmp_path, max_steps=4)
    (traj,) = read_trajectories(tmp_path / "trajectories.jsonl")
    assert traj.termination == "max_steps" and len(traj.transitions) == 4 and not traj.success
    last = traj.transitions[-1]
    # The limit cut the episode: done, but not ended by the environment.
    assert last.done and last.truncated and not last.terminated
    assert not any(t.truncated for t in traj.transitions[:-1])


def test_rerun_skips_finished_episodes(tmp_path, counter_env_factory):
    run(counter_tasks(3), counter_env_factory, CounterSolver(), tmp_path)
    made_before = len(counter_env_factory.made)
    result = run(counter_tasks(5), counter_env_factory, CounterSolver(), tmp_path)
    assert result.skipped == 3
    trajs = read_trajectories(tmp_path / "trajectories.jsonl")
    assert sorted(t.task.task_id for t in trajs) == ["0", "1", "2", "3", "4"]
    resets = sum(env.resets for env in counter_env_factory.made[made_before:])
    assert resets == 2


def test_an_episode_finished_but_not_yet_written_is_written_from_its_checkpoint(
        tmp_path, counter_env_factory, monkeypatch):
    """The run checkpoints each episode once, when it ends (durability "exit"): a run stopped
    between that checkpoint and the trajectory file writes the episode on resume, unplayed."""
    import dreamgym_agents.episodes.graph as graph

    def stopped(*args):
        raise KeyboardInterrupt  # the run is stopped after the graph, before the file

    monkeypatch.setattr(graph, "append_trajectory", stopped)
    with pytest.raises(KeyboardInterrupt):
        run(counter_tasks(1), counter_env_factory, CounterSolver(), tmp_path, concurrency=1)
    assert not (tmp_path / "trajectories.jsonl").exists()
    monkeypatch.undo()
    made_before = len(counter_env_factory.made)
    run(counter_tasks(1), counter_env_factory, CounterSolver(), tmp_path, concurrency=1)
    (traj,) = read_trajectories(tmp_path / "trajectories.jsonl")
    assert traj.success and [t.action for t in traj.transitions] == ["stop [0]"]
    assert len(counter_env_factory.made) == made_before  # nothing played again


def test_different_run_in_same_folder_is_refused(tmp_path, counter_env_factory):
    run(counter_tasks(1), counter_env_factory, CounterSolver(), tmp_path)
    with pytest.raises(ConfigError, match="different run"):
        run(counter_tasks(1), counter_env_factory, Babbler(), tmp_path)


SCRIPT = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from conftest import CounterEnv, counter_tasks
    from counter_agents import CounterSolver
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes

    class Stalls(CounterSolver):  # tasks 4 on never answered: the kill always lands mid-run,
        async def act(self, task, *args):  # however fast the machine plays the first four
            if {stall} and int(task.task_id) >= 4:
                await asyncio.Event().wait()
            return await super().act(task, *args)

    cfg = RunConfig(out_dir={out!r}, concurrency=2, max_steps=6, meta={{"agent": "counter-solver"}})
    asyncio.run(run_episodes(counter_tasks(12), CounterEnv, Stalls(), cfg))
""")


def test_kill_9_then_rerun_resumes_with_each_episode_once(tmp_path):
    tests = os.path.dirname(__file__)
    out = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=tests, out=out,
                                                                 stall=True)])
    traj_file = tmp_path / "run" / "trajectories.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:
        if traj_file.exists() and len(traj_file.read_text().splitlines()) >= 4:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(read_trajectories(traj_file, repair=True))
    assert done_before == 4, "the kill lands while tasks 4 and 5 wait"
    subprocess.run([sys.executable, "-c", SCRIPT.format(tests=tests, out=out, stall=False)],
                   check=True, timeout=120)
    trajs = read_trajectories(traj_file)
    ids = [t.episode_id for t in trajs]
    assert len(ids) == 12 and len(set(ids)) == 12
    assert all(t.success for t in trajs)


def test_every_episode_steps_at_once_beyond_the_default_thread_pool(tmp_path):
    """A run brings one thread per episode: 24 environments whose step blocks (a dream's step
    waits on the experience model) all wait at once, not the loop's default 6 or so."""
    import threading

    from conftest import CounterEnv

    lock, waiting, most = threading.Lock(), [0], [0]
    everyone = threading.Barrier(24, timeout=10)

    class Blocking(CounterEnv):
        def step(self, action):
            with lock:
                waiting[0] += 1
                most[0] = max(most[0], waiting[0])
            try:
                if not getattr(self, "waited", False):
                    self.waited = True
                    everyone.wait()  # first steps: passes only when all 24 wait at once
            except threading.BrokenBarrierError:
                pass
            finally:
                with lock:
                    waiting[0] -= 1
            return super().step(action)

    cfg = RunConfig(out_dir=tmp_path, concurrency=24, max_steps=4)
    result = asyncio.run(run_episodes(counter_tasks(24), Blocking, CounterSolver(), cfg))
    assert most[0] == 24 and not everyone.broken
    assert result.summary["episodes"] == 24 and result.summary["success_rate"] == 1.0


def test_summarize_empty():
    assert summarize([])["episodes"] == 0


def test_a_stage_goes_on_without_tasks_that_can_never_be_played(tmp_path, caplog):
    """A stage that needs every episode (a collection, an evaluation) leaves out a task whose
    game can never be played, saying so, and stops in one line for an episode a rerun may
    play."""
    from dreamgym_agents.episodes.graph import RunResult
    from dreamgym_agents.errors import ConfigError

    broken = {"episode_id": "e1", "error": "could not start", "unplayable": True}
    flaky = {"episode_id": "e2", "error": "the browser closed"}
    errors = tmp_path / "errors.jsonl"
    with caplog.at_level("WARNING"):
        RunResult({}, [broken], 0).check("demonstration", errors)
    assert "demonstration: 1 task(s) could not be played" in caplog.text
    assert str(errors) in caplog.text
    assert RunResult({}, [broken, flaky], 0).retryable == [flaky]
    with pytest.raises(ConfigError, match=r"^1 evaluation episode\(s\) failed"):
        RunResult({}, [broken, flaky], 0).check("evaluation", errors)
    RunResult({}, [], 0).check("evaluation", errors)
