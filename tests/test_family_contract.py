"""The contract every registered task family honours, run against each of them.

- its environment resets to a non-empty abstract state; an unparseable or impossible action is a
  recorded invalid step (reward 0, not done, state unchanged), never an exception;
- its oracle solves its test tasks; episodes written to ``trajectories.jsonl`` read back equal;
- evaluation is deterministic: the same agent on the same task gives the same states and outcome;
- a run killed after some episodes resumes: a rerun plays only the missing ones.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from dreamgym_agents.episodes.env import EnvConfig, TaskFamily, family_names, make_family
from dreamgym_agents.episodes.graph import TRAJECTORIES_FILE, RunConfig, run_episodes
from dreamgym_agents.types import read_trajectories


@dataclass(frozen=True)
class Case:
    """What the suites need to know of a family: an action text it cannot parse
    (``garbage``), one it parses but cannot execute (``impossible``), a valid one for the
    dream, one that ends an episode by its type (None: it has none), the marks of the tests
    that play its real environment (``marks``) and of every test of it (``needs``)."""

    garbage: str
    impossible: str
    valid: str
    terminal: str | None
    marks: tuple = ()
    needs: tuple = ()


def _needs(module: str, extra: str) -> tuple:
    import importlib.util

    found = importlib.util.find_spec(module) is not None
    return (pytest.mark.skipif(not found, reason=f"{module} is not installed ({extra})"),)


CASES = {
    "webarena": Case("dance [wildly]", "click('99999')", "click('1')",
                     "send_msg_to_user('done')", (pytest.mark.browser,)),
    "alfworld": Case("dance wildly", "take unicorn 1 from moon 1", "look", None,
                     (pytest.mark.slow,)),
    "tau2": Case("dance wildly", "fly_to_the_moon(speed=3)", "toggle_airplane_mode()",
                 "done()", needs=_needs("tau2", "make install-tau2")),
    # defined in the tests, registered at run time (conftest.py): a stranger's family
    "tally": Case("dance wildly", "add 99", "add 1", "submit"),
}
GARBAGE = {name: case.garbage for name, case in CASES.items()}


def _params(real: bool = True):
    """The registered families as parameters; ``real``: with the marks of their real
    environments (a browser, a slow game)."""
    return [pytest.param(name, marks=(*CASES[name].needs, *(CASES[name].marks if real else ())))
            for name in sorted(CASES)]


def test_every_family_is_covered():
    assert set(family_names()) == set(CASES), "add the new family to this contract suite"


def test_a_family_written_on_the_base_class_needs_five_hooks():
    from stranger_family import TallyFamily

    from dreamgym_agents.episodes.family_base import FamilyBase

    written = {n for n in vars(TallyFamily) if not n.startswith("_")}
    assert written == {"name", "load_tasks", "make_env", "action_set", "offline_agents"}
    assert isinstance(TallyFamily(), TaskFamily)
    # what it writes is the protocol's core part (close: FamilyBase's); the other three parts
    # are FamilyBase's defaults
    from dreamgym_agents.episodes.env import DreamParts, FamilyCore, FamilySetup, RecipeParts

    def members(part: type) -> set[str]:
        return {n for n in vars(part) if not n.startswith("_")} | set(part.__annotations__)

    assert members(FamilyCore) == written | {"close"}
    for part in (FamilySetup, DreamParts, RecipeParts):
        assert isinstance(FamilyBase(), part) and members(part) and not members(part) & written
    with pytest.raises(NotImplementedError, match="load_tasks"):
        FamilyBase().load_tasks("test")


@pytest.mark.parametrize("name", _params(real=False))
def test_every_family_has_the_protocols_hooks(name):
    family = make_family(name)
    try:
        assert isinstance(family, TaskFamily)
        assert {"oracle", "random"} <= set(family.offline_agents(0))
        assert family.action_set().describe().strip()
    finally:
        family.close()


@pytest.fixture(scope="module", params=_params())
def family_case(request):
    family = make_family(request.param)
    cfg = EnvConfig(max_steps=20)
    tasks = family.load_tasks("test")[:3]
    family.prepare(cfg, tasks)
    yield request.param, family, cfg, tasks
    family.close()


def _play(family, cfg, tasks, out, agent, on_episode=None):
    run = RunConfig(out_dir=out, concurrency=1, max_steps=cfg.max_steps,
                    meta={"command": "contract", "agent": agent.name})
    return asyncio.run(run_episodes(tasks, lambda: family.make_env(cfg), agent, run,
                                    on_episode=on_episode))


def test_reset_invalid_actions_and_close(family_case):
    name, family, cfg, tasks = family_case
    env = family.make_env(cfg)
    try:
        obs = env.reset(tasks[0])
        assert obs.state.strip()
        for action in (CASES[name].garbage, CASES[name].impossible):
            bad = env.step(action)
            assert not bad.valid and bad.error and bad.reward == 0.0 and not bad.done
            assert bad.observation.state == obs.state
    finally:
        env.close()


def test_the_oracle_solves_and_records_round_trip(family_case, tmp_path):
    _, family, cfg, tasks = family_case
    oracle = family.offline_agents()["oracle"]
    result = _play(family, cfg, tasks, tmp_path / "oracle", oracle)
    assert not result.failed and result.summary["success_rate"] == 1.0
    episodes = read_trajectories(tmp_path / "oracle" / TRAJECTORIES_FILE)
    assert len(episodes) == len(tasks)
    for traj in episodes:
        assert traj.success and traj.transitions[-1].reward == 1.0
        assert type(traj).from_dict(traj.to_dict()) == traj
        for prev, step in zip(traj.transitions, traj.transitions[1:], strict=False):
            assert step.state == prev.next_state  # each step starts where the last ended


def test_evaluation_is_deterministic(family_case, tmp_path):
    _, family, cfg, tasks = family_case
    runs = []
    for n in range(2):
        agent = family.offline_agents(seed=7)["random"]
        _play(family, cfg, tasks[:1], tmp_path / f"random{n}", agent)
        (traj,) = read_trajectories(tmp_path / f"random{n}" / TRAJECTORIES_FILE)
        runs.append([(t.state, t.action, t.next_state, t.reward) for t in traj.transitions])
    assert runs[0] == runs[1]


KILLED_RUN = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[3])
import stranger_family  # a test-defined family: registered as conftest.py registers it
from dreamgym_agents.episodes.env import register_family
register_family("tally", stranger_family.TallyFamily)
from dreamgym_agents.episodes.env import EnvConfig, make_family
from dreamgym_agents.episodes.graph import RunConfig, run_episodes

family = make_family(sys.argv[1])
cfg = EnvConfig(max_steps=20)
tasks = family.load_tasks("test")[:4]
oracle = family.offline_agents()["oracle"]

class Stalls:  # the oracle for the first task; then it never answers, so the run is always
    name = oracle.name  # cut mid-way by the kill, however fast the machine plays

    async def act(self, task, *args):
        if task.task_id != tasks[0].task_id:
            await asyncio.Event().wait()
        return await oracle.act(task, *args)

family.prepare(cfg, tasks)
run = RunConfig(out_dir=sys.argv[2], concurrency=1, max_steps=20,
                meta={"command": "contract", "agent": "oracle"})
asyncio.run(run_episodes(tasks, lambda: family.make_env(cfg), Stalls(), run))
"""


def test_a_killed_run_resumes_with_the_missing_episodes(family_case, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    name, family, cfg, _ = family_case
    tasks = family.load_tasks("test")[:4]
    out = tmp_path / "killed"
    log = tmp_path / "killed.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, name, str(out),
                                 os.path.dirname(__file__)],
                                stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    traj_file = out / TRAJECTORIES_FILE
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if traj_file.exists() and traj_file.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before the kill: {log.read_text()[-3000:]}"
    os.killpg(proc.pid, signal.SIGKILL)  # the run and any browser it started
    proc.wait()
    before = len(read_trajectories(traj_file, repair=True))
    assert before == 1  # the first task's; the second stalled until the kill
    result = _play(family, cfg, tasks, out, family.offline_agents()["oracle"])
    ids = [t.task.task_id for t in read_trajectories(traj_file)]
    assert sorted(ids) == sorted(t.task_id for t in tasks)  # each once, none lost
    assert result.summary["resumed_episodes"] == before and result.summary["episodes"] == 4


@pytest.mark.slow
def test_alfworld_games_start_in_parallel_threads():
    """textworld's PDDL parser is shared by threads: games started at once (concurrent
    episodes) must all load (they used to corrupt it for the whole process)."""
    import concurrent.futures

    family = make_family("alfworld")
    cfg = EnvConfig(max_steps=5)
    tasks = family.load_tasks("test")[:4]
    family.prepare(cfg, tasks)
    envs = [family.make_env(cfg) for _ in tasks]
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            starts = list(pool.map(lambda env, task: env.reset(task), envs, tasks))
        assert all(obs.state.strip() for obs in starts)
    finally:
        for env in envs:
            env.close()
        family.close()


@pytest.mark.slow
def test_alfworld_games_are_generated_safely_by_concurrent_episodes(tmp_path, monkeypatch):
    """A game not generated yet is made when an episode first meets it, in that episode's
    worker thread: two generated at once must not corrupt textworld's parser either (a tiny
    run on an empty cache failed so, "pop from empty list")."""
    import concurrent.futures

    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))  # no game generated yet
    family = make_family("alfworld")
    cfg = EnvConfig(max_steps=5)
    tasks = family.load_tasks("validation")[:4]
    envs = [family.make_env(cfg) for _ in tasks]  # no prepare: the resets generate them
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            starts = list(pool.map(lambda env, task: env.reset(task), envs, tasks))
        assert all(obs.state.startswith("Task: ") for obs in starts)
    finally:
        for env in envs:
            env.close()
        family.close()
