"""Benchmark scripts whose figures docs/history/results-2026-11-to-12.md quotes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from dreamgym_agents.types import Task, Trajectory, Transition, write_trajectories

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answered(task: Task, answer: str, success: bool, i: int) -> Trajectory:
    step = Transition(episode_id=f"e{i}", step=0, task_id=task.task_id, state="URL: http://s/",
                      action=f"send_msg_to_user('{answer}')", next_state="", done=True,
                      success=success)
    return Trajectory(episode_id=f"e{i}", task=task, transitions=[step], success=success)


def count_task(task_id: str, **extra) -> Task:
    config = {"intent": "How many orders? Answer with a number.", "start_url": "http://s/",
              "intent_template": "How many orders?", "sites": ["shopping"],
              "eval": {"eval_types": ["string_match"],
                       "reference_answers": {"exact_match": "2"}}, **extra}
    return Task(task_id=task_id, family="webarena", intent=config["intent"], config=config)


def test_dream_answers_scores_the_dreams_verdicts_with_the_sites_check(tmp_path, capsys):
    dream_answers = load("dream_answers")
    seed, variant = count_task("1"), count_task("1~v1", synthetic_of="1")
    run = tmp_path / "run"
    (run / dream_answers.ROLLOUTS).parent.mkdir(parents=True)
    write_trajectories(run / dream_answers.ROLLOUTS, [
        answered(seed, "2", True, 0), answered(seed, "3", True, 1), answered(seed, "3", False, 2),
        answered(seed, "7", True, 3), answered(variant, "2", True, 4),  # variants: left out
    ])
    assert sorted(dream_answers.judged(run)) == [("How many orders?", False, False)] + \
        [("How many orders?", False, True)] * 2 + [("How many orders?", True, True)]
    assert dream_answers.main([str(run)]) == 0
    assert "| **all** | 1 | 0 | 2 | 1 | 0.33 |" in capsys.readouterr().out
    assert dream_answers.main([str(tmp_path / "none")]) == 2


@pytest.mark.slow
def test_dream_concurrency_plays_the_dream_against_the_latency_server(tmp_path, monkeypatch):
    pytest.importorskip("alfworld")
    pytest.importorskip("aiohttp")
    out = tmp_path / "curve.json"
    monkeypatch.setattr(sys, "argv", ["dream_concurrency", "--task", "alfworld", "--latency",
                                      "0.05", "--levels", "1", "3", "--max-steps", "2",
                                      "--json", str(out)])
    load("dream_concurrency").main()
    rows = json.loads(out.read_text())["rows"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for row in rows:
        # every step asked the (latency) server once and read its answer back
        assert row["steps"] == row["episodes"] * 2 == row["em_calls"]
        assert row["em_failures"] == 0 and row["steps_per_s"] > 0
        assert row["ideal"] == row["concurrency"] / 0.05
    # the buffer's memory index in the dream (what the curve in
    # docs/history/results-2026-11-to-12.md plays)
    monkeypatch.setattr(sys, "argv", ["dream_concurrency", "--task", "alfworld", "--latency",
                                      "0.05", "--levels", "3", "--max-steps", "2", "--set",
                                      "buffer.index=memory", "--json", str(out)])
    load("dream_concurrency").main()
    [row] = json.loads(out.read_text())["rows"]
    assert row["steps"] == row["episodes"] * 2 == row["em_calls"] and row["em_failures"] == 0
    # the same curve for eval with a hosted agent on real games
    monkeypatch.setattr(sys, "argv", ["dream_concurrency", "--mode", "eval", "--task",
                                      "alfworld", "--latency", "0.05", "--levels", "2",
                                      "--max-steps", "2", "--json", str(out)])
    load("dream_concurrency").main()
    [row] = json.loads(out.read_text())["rows"]
    assert row["steps"] == row["episodes"] * 2 == row["em_calls"]  # one agent call a step


def test_request_path_times_each_layer_of_a_hosted_call(monkeypatch, capsys):
    pytest.importorskip("aiohttp")
    monkeypatch.setattr(sys, "argv", ["request_path", "--levels", "2", "--calls", "6",
                                      "--latency", "0.01"])
    load("request_path").main()
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line and "layer" not in line]
    assert [r[0].strip("| ") for r in rows] == [
        "aiohttp", "httpx", "openai-sdk", "litellm openai/", "litellm aiohttp_openai/",
        "gateway (threads)"]
    assert all(r[1] == "2" and float(r[2]) > 0 and float(r[3].strip(" |")) > 0 for r in rows)


def test_dream_scaling_spends_each_budget_by_the_batch_and_gives_its_interval():
    scaling = load("dream_scaling")
    assert scaling.batches_for([512, 2048, 8192], 16) == [32, 128, 512]
    assert scaling.batches_for([10, 17], 16) == [1, 2]  # a budget is spent, rounded up
    low, high = scaling.wilson(11, 60)  # worked by hand: p = 0.1833, z = 1.96
    assert (round(low, 3), round(high, 3)) == (0.106, 0.299)
    assert scaling.wilson(0, 31)[0] == 0.0 and scaling.wilson(0, 0) == (0.0, 0.0)


def test_rl_cost_reads_a_finished_stage_s_seconds_per_batch_and_memory(tmp_path):
    rl_cost = load("rl_cost")
    run = tmp_path / "round0-ppo"
    assert rl_cost.stage_figures(run, "dream_rl") is None  # not started
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"done": {"sft": {"seconds": 3}}}))
    assert rl_cost.stage_figures(run, "dream_rl") is None  # not finished
    (run / "state.json").write_text(json.dumps({"done": {"dream_rl": {
        "seconds": 120.0, "batches": 4, "episodes": 64, "peak_rss_mb": 2048.5}}}))
    assert rl_cost.stage_figures(run, "dream_rl") == {
        "seconds_per_batch": 30.0, "peak_rss_mb": 2048.5, "episodes": 64}
