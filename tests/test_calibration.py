"""Calibration: one agent on the same tasks in the dream and for real, compared task by task."""

from __future__ import annotations

import json

import pytest

from dreamgym_agents.cli.main import main
from dreamgym_agents.experience.calibration import compare, render, summary_line
from dreamgym_agents.types import Task, Trajectory, Transition

WON = ("llm.mock_response=<reasoning>r</reasoning><next_state>You won.</next_state>"
       "<reward>1</reward><done>true</done><success>true</success>")


def episode(task_id: str, success: bool, kinds: list[str]) -> Trajectory:
    task = Task(task_id=task_id, intent="do it", family="webarena",
                config={"eval": {"eval_types": kinds}})
    step = Transition(f"e{task_id}", 0, task_id, "s", "a", "s2", reward=float(success),
                      done=True, success=success)
    return Trajectory(f"e{task_id}", task, [step], success=success)


def test_dream_and_real_outcomes_are_compared_per_task_and_evaluator_kind():
    kinds = {"1": ["string_match"], "2": ["string_match"], "3": ["url_match"],
             "4": ["string_match", "url_match"], "5": ["url_match"]}
    dream = [episode(t, t in {"1", "2", "4"}, kinds[t]) for t in kinds]
    real = [episode(t, t in {"2", "3"}, kinds[t]) for t in kinds if t != "5"]
    out = compare(dream, real, lambda task: task.config["eval"]["eval_types"])
    every = out["all"]
    assert (every["tasks"], every["dream_successes"], every["real_successes"]) == (4, 3, 2)
    assert (every["agree"], every["false_rewards"], every["missed_rewards"]) == (1, 2, 1)
    assert every["false_reward_rate"] == 1.0 and every["missed_reward_rate"] == 0.5
    assert every["gap"] == 0.25
    answers = out["by_kind"]["string_match"]  # tasks 1, 2 and 4
    assert (answers["tasks"], answers["false_rewards"], answers["missed_rewards"]) == (3, 2, 0)
    assert answers["false_reward_rate"] == 1.0 and answers["missed_reward_rate"] == 0.0
    urls = out["by_kind"]["url_match"]  # tasks 3 and 4
    assert (urls["tasks"], urls["dream_successes"], urls["real_successes"]) == (2, 1, 1)
    assert out["unpaired"] == {"dream": 1, "real": 0}
    assert [p["task_id"] for p in out["tasks"]] == ["1", "2", "3", "4"]
    text = "\n".join(render(out))
    assert "| string_match | 3 | 3 (1.00) | 1 (0.33) | 1 | 2 (1.00) | 0 (0.00) |" in text
    assert summary_line(out) == "dream 3/4 vs real 2/4, false rewards 2 (1.00), missed 1 (0.50)"


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))


def calibrate(capsys, tmp_path, *extra: str) -> tuple[int, str, str]:
    code = main(["calibrate", "--task", "alfworld", "--agent", "random", "--limit", "2",
                 "--max-steps", "2", "--experience-model", "openai/test", "--buffer-path",
                 str(tmp_path / "buffer"), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_the_calibrate_command_counts_a_kind_dream_false_rewards(tmp_path, capsys):
    """A dream that says every step wins, against real ALFWorld games a random agent fails:
    every real failure is a false reward. Then the same real episodes (``--real``) against a
    dream that never ends a game: nothing played for real, nothing rewarded."""
    out = tmp_path / "kind"
    code, stdout, err = calibrate(capsys, tmp_path, "--out", str(out), "--set", WON)
    assert code == 0, err
    report = json.loads((out / "calibration.json").read_text())
    assert report["all"]["tasks"] == 2 and report["all"]["false_reward_rate"] == 1.0
    assert report["by_kind"]["goal"]["dream_successes"] == 2
    assert report["real_transitions"] == 4  # two games, two real steps each
    assert "false rewards 2 (1.00)" in err + stdout
    assert (out / "calibration.md").read_text().startswith("**random: dream against reality")
    strict = tmp_path / "strict"
    code, _, err = calibrate(capsys, tmp_path, "--out", str(strict), "--real", str(out / "real"),
                             "--set", WON.replace("<reward>1", "<reward>0").replace(
                                 "<done>true</done><success>true", "<done>false</done><success>"
                                 "false"))
    assert code == 0, err
    report = json.loads((strict / "calibration.json").read_text())
    assert report["real_transitions"] == 0 and report["real_folder"] == str(out / "real")
    assert report["all"]["dream_successes"] == 0 and report["all"]["agree"] == 2
    assert report["all"]["false_reward_rate"] == 0.0
