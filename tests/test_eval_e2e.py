"""`dg-agents eval` end to end on the bundled shopping site, in Chromium.

The full test-split runs (oracle 1.0, random ≤ 0.05) are the issue's acceptance figures; they are
slow (minutes) but offline, so `make test` runs them.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes_openai_server import serve_openai_compatible

from dreamgym_agents.adapters.webarena.family import WebArenaFamily
from dreamgym_agents.types import read_trajectories

pytestmark = pytest.mark.browser


def dg(*args, env=None, timeout=1500):
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("SHOPPING", "WA_SHOPPING", "WEBARENA_TASKS_FILE")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "dreamgym_agents.cli.main", *args],
                          capture_output=True, text=True, env=full_env, timeout=timeout)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def test_tasks():
    return WebArenaFamily(environ={}).load_tasks("test")


@pytest.mark.slow
def test_oracle_solves_every_test_task(tmp_path, test_tasks):
    out = tmp_path / "oracle"
    proc = dg("eval", "--task", "webarena", "--agent", "oracle", "--split", "test",
              "--concurrency", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "bundled shopping site" in proc.stderr.splitlines()[0]
    s = summary(out)
    assert s["episodes"] == len(test_tasks) >= 60
    failed = [t.task.task_id for t in read_trajectories(out / "trajectories.jsonl")
              if not t.success]
    assert failed == [] and s["success_rate"] == 1.0
    assert s["real_transitions"] > 0 and s["synthetic_transitions"] == 0
    assert s["mean_env_step_seconds"] > 0 and s["wall_seconds"] > 0


@pytest.mark.slow
def test_random_agent_is_near_zero(tmp_path, test_tasks):
    out = tmp_path / "random"
    proc = dg("eval", "--agent", "random", "--split", "test", "--concurrency", "2",
              "--max-steps", "8", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    s = summary(out)
    assert s["episodes"] == len(test_tasks)
    assert s["success_rate"] <= 0.05


def test_mock_model_through_gateway(tmp_path):
    out = tmp_path / "mock"
    answer = "<think>I cannot tell.</think><action>stop [I do not know]</action>"
    proc = dg("eval", "--agent", "openai/gpt-4o-mini", "--limit", "2", "--out", str(out),
              "--set", f"llm.mock_response={answer}", env={"OPENAI_API_KEY": "sk-test-secret"})
    assert proc.returncode == 0, proc.stderr
    trajs = read_trajectories(out / "trajectories.jsonl")
    assert len(trajs) == 2
    step = trajs[0].transitions[0]
    assert step.reasoning == "I cannot tell." and step.action == "stop [I do not know]"
    assert step.done and not trajs[0].success
    assert step.usage.calls == 1
    assert "sk-test-secret" not in (out / "trajectories.jsonl").read_text()


def test_local_openai_compatible_server_solves_tasks(tmp_path, test_tasks):
    """A scripted 'model' on 127.0.0.1 answering with each task's reference: success."""
    by_intent = {}
    for task in test_tasks:
        ref = task.config["eval"].get("reference_answers") or {}
        if task.config["eval"]["eval_types"] == ["string_match"] and "exact_match" in ref:
            by_intent[task.intent] = ref["exact_match"]
    chosen = [t for t in test_tasks if t.intent in by_intent][:3]
    assert chosen, "the bundled test split has exact-match tasks"

    def answer(body):
        prompt = body["messages"][-1]["content"]
        intent = next(i for i in by_intent if i in prompt)
        return 200, f"<think>I know this.</think><action>stop [{by_intent[intent]}]</action>"

    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps([t.config for t in chosen]))
    with serve_openai_compatible(answer) as server:
        out = tmp_path / "served"
        proc = dg("eval", "--agent", "openai/served-model", "--tasks", str(tasks_file),
                  "--out", str(out), "--set", f"llm.api_base={server.base_url}",
                  "--set", "llm.api_key_env=FAKE_KEY", env={"FAKE_KEY": "k-123"})
        assert proc.returncode == 0, proc.stderr
        assert len(server.requests) == len(chosen)
    s = summary(out)
    assert s["episodes"] == len(chosen) and s["success_rate"] == 1.0
    assert s["usage"]["prompt_tokens"] > 0


def test_in_process_local_checkpoint(tmp_path):
    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny"))
    out = tmp_path / "local"
    proc = dg("eval", "--agent", f"hf/{ckpt}", "--limit", "1", "--max-steps", "2",
              "--out", str(out), "--set", "llm.max_tokens=8")
    assert proc.returncode == 0, proc.stderr
    (traj,) = read_trajectories(out / "trajectories.jsonl")
    assert 1 <= len(traj.transitions) <= 2
    assert traj.transitions[0].usage.completion_tokens > 0
    # a random tiny model's answers are recorded as they came; one that is no action is an
    # invalid step with its error, and the episode goes on to its step limit (no crash)
    from dreamgym_agents.adapters.webarena.actions import WebActionSet

    assert traj.termination in ("max_steps", "done")
    for t in traj.transitions:
        try:
            WebActionSet().parse(t.action)
        except ValueError:
            assert not t.valid and t.error, (t.action, t.error)


@pytest.mark.slow
def test_kill_9_mid_eval_then_resume(tmp_path, test_tasks):
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "dreamgym_agents.cli.main", "eval", "--agent", "oracle",
            "--split", "test", "--limit", "12", "--concurrency", "2", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("SHOPPING", "WA_SHOPPING")}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    traj_file = out / "trajectories.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if traj_file.exists() and len(traj_file.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its Chromium children
    proc.wait()
    before = len(read_trajectories(traj_file, repair=True))
    assert 3 <= before < 12
    again = dg(*args[3:])
    assert again.returncode == 0, again.stderr
    ids = [t.episode_id for t in read_trajectories(traj_file)]
    assert len(ids) == 12 and len(set(ids)) == 12
    s = summary(out)
    assert s["episodes"] == 12 and s["success_rate"] == 1.0 and s["resumed_episodes"] == before
    assert isinstance(s["wall_seconds"], float) and s["wall_seconds"] > 0


def test_real_site_mode_against_a_user_hosted_site(tmp_path, test_tasks):
    """SHOPPING set: the WebArena task file runs against that site (here the bundled one, served
    like a user-hosted site on 127.0.0.1), and the command says so first."""
    from dreamgym_agents.adapters.shopping.server import ShoppingSite

    info = [t.config for t in test_tasks
            if t.config["eval"]["eval_types"] == ["string_match"]][:2]
    task_file = tmp_path / "test.raw.json"
    task_file.write_text(json.dumps(info))
    with ShoppingSite(seed=0) as site:
        site.start()
        base = site.new_instance(login=True)
        proc = dg("eval", "--agent", "oracle", "--split", "test", "--out", str(tmp_path / "o"),
                  env={"SHOPPING": base, "WEBARENA_TASKS_FILE": str(task_file)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("webarena: real WebArena sites: SHOPPING=")
    s = summary(tmp_path / "o")
    assert s["episodes"] == 2 and s["success_rate"] == 1.0


def test_collect_with_the_explorer_and_a_quitter(tmp_path):
    out = tmp_path / "collect"
    proc = dg("collect", "--agents", "explorer,quitter", "--limit", "2", "--max-steps", "3",
              "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    explored = read_trajectories(out / "explorer" / "trajectories.jsonl")
    assert len(explored) == 2
    # The explorer runs past --max-steps: it opens a section, then every item of its listing
    # page, going back after each (slot 0: the first section's first page, 12 items). Episodes
    # are written as they finish (two at once): find slot 0's by its task, not by its line.
    first_task = WebArenaFamily(environ={}).load_tasks("train")[0].task_id
    steps = next(t for t in explored if t.task.task_id == first_task).transitions
    assert len(steps) > 3 and steps[0].action.startswith("click(")
    assert [t.action for t in steps[2:8:2]] == ["go_back()"] * 3
    assert all("/product/" in t.next_state.splitlines()[0] for t in steps[1:7:2])
    assert json.loads((out / "explorer" / "run.json").read_text())["max_steps"] == 27
    quit_steps = read_trajectories(out / "quitter" / "trajectories.jsonl")
    assert all(len(t.transitions) <= 3 for t in quit_steps)
    merged = read_trajectories(out / "offline.jsonl")
    assert len(merged) == 4 and {t.provenance for t in merged} == {"offline"}


def test_an_episode_at_the_step_limit_is_scored_like_webarenas_early_stop(tmp_path):
    """With score_at_step_limit (real WebArena's default), an agent that never stops is
    evaluated on its last page at the limit; the bundled shop keeps its figures without it."""
    config = {"sites": ["shopping"], "task_id": 9001, "require_login": False,
              "storage_state": None, "start_url": "__SHOPPING__/category/laptops",
              "geolocation": None, "intent_template": "x", "instantiation_dict": {},
              "intent": "Open the laptops category", "require_reset": False,
              "eval": {"eval_types": ["url_match"], "reference_answers": None,
                       "reference_url": "__SHOPPING__/category/laptops", "program_html": []}}
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([config]))
    waiting = ["eval", "--task", "webarena", "--tasks", str(tasks), "--agent", "openai/waiter",
               "--max-steps", "2", "--set", "llm.mock_response=<action>noop()</action>"]
    proc = dg(*waiting, "--set", "env.score_at_step_limit=true", "--out", str(tmp_path / "on"))
    assert proc.returncode == 0, proc.stderr
    [traj] = read_trajectories(tmp_path / "on" / "trajectories.jsonl")
    assert traj.success and traj.termination == "max_steps" and len(traj.transitions) == 2
    assert traj.transitions[-1].info["eval"]["answer"].startswith("Early stop")
    proc = dg(*waiting, "--out", str(tmp_path / "off"))  # the bundled shop's default
    assert proc.returncode == 0, proc.stderr
    [traj] = read_trajectories(tmp_path / "off" / "trajectories.jsonl")
    assert not traj.success and traj.termination == "max_steps"
