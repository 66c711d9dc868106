"""`dg-agents buffer …`, `dream` and `fidelity`: offline (mock experience model, temp buffer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym_agents.adapters.webarena.family import WebArenaFamily
from dreamgym_agents.cli.main import main
from dreamgym_agents.experience.fidelity import RUBRIC
from dreamgym_agents.types import Trajectory, Transition, read_trajectories, write_trajectories

HOME = ("URL: http://shop/\nTitle: One Stop Market\n[1] link 'Office Furniture'\n"
        "[2] searchbox 'Search'\n[3] button 'Search'")
CATEGORY = ("URL: http://shop/office\nTitle: Office Furniture\n"
            "[4] link 'Ergonix Harbor Ergonomic Office Chair, Walnut'\nStaticText '$546.99'")
PRODUCT = ("URL: http://shop/chair\nTitle: Ergonix Harbor Ergonomic Office Chair, Walnut\n"
           "heading 'Ergonix Harbor Ergonomic Office Chair, Walnut'\nStaticText '$546.99'")
# String settings are taken verbatim (no YAML reading), so the answer may hold ": " and newlines.
END_ANSWER = ("llm.mock_response=<reasoning>r</reasoning><next_state>URL: x\nTitle: y"
              "</next_state><reward>0</reward><done>true</done><success>false</success>")
JUDGE_ANSWER = ("judge.mock_response=" + "".join(f"<{k}>2</{k}>" for k in RUBRIC))


@pytest.fixture(autouse=True)
def _no_shared_buffer(monkeypatch, tmp_path):
    for name in ("DG_BUFFER_URL", "SHOPPING", "WA_SHOPPING", "WEBARENA_TASKS_FILE"):
        monkeypatch.delenv(name, raising=False)
    # Never build the real embedded default here (minutes of collection and training).
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tasks():
    return WebArenaFamily(environ={}).load_tasks("test")[:2]


def oracle_episode(task, episode_id: str) -> Trajectory:
    steps = [
        Transition(episode_id, 0, task.task_id, HOME, "click('1')", CATEGORY),
        Transition(episode_id, 1, task.task_id, CATEGORY, "click('4')", PRODUCT),
        Transition(episode_id, 2, task.task_id, PRODUCT, "send_msg_to_user('$546.99')", PRODUCT,
                   reward=1.0, done=True, success=True),
    ]
    return Trajectory(episode_id, task, steps, success=True, reward=1.0, agent="oracle")


def random_episode(task, episode_id: str) -> Trajectory:
    steps = [
        Transition(episode_id, 0, task.task_id, HOME, "click('2')", HOME),
        Transition(episode_id, 1, task.task_id, HOME, "dance wildly", HOME, valid=False,
                   error="unparseable"),
        Transition(episode_id, 2, task.task_id, HOME, "send_msg_to_user('Search')", HOME,
                   done=True),
    ]
    return Trajectory(episode_id, task, steps, agent="random")


def write_run(folder: Path, agent: str, trajectories: list[Trajectory]) -> Path:
    folder.mkdir(parents=True)
    write_trajectories(folder / "trajectories.jsonl", trajectories)
    meta = {"command": "eval", "agent": agent, "split": "test", "max_steps": 4, "seed": 0}
    (folder / "run.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture
def real_runs(tmp_path, tasks) -> tuple[Path, Path]:
    oracle = write_run(tmp_path / "oracle", "oracle",
                       [oracle_episode(t, f"webarena-test-{t.task_id}") for t in tasks])
    random = write_run(tmp_path / "random", "random",
                       [random_episode(t, f"rnd-webarena-test-{t.task_id}") for t in tasks])
    return oracle, random


def dg(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- buffer ----------------------------------------------------------------------------------


def test_buffer_seed_stats_query_export_import_prune(tmp_path, capsys, real_runs):
    oracle, random = real_runs
    buf = ["--path", str(tmp_path / "buf")]
    code, out, _ = dg(capsys, "buffer", "seed", str(oracle / "trajectories.jsonl"),
                      str(random / "trajectories.jsonl"), *buf)
    assert code == 0 and "added 12 transitions as offline" in out

    code, out, _ = dg(capsys, "buffer", "stats", "--json", *buf)
    stats = json.loads(out)
    assert code == 0 and stats["total"] == 12 and stats["by_provenance"] == {"offline": 12}
    assert stats["episodes"] == 4 and stats["tasks"] == 2
    code, out, _ = dg(capsys, "buffer", "stats", *buf)
    assert code == 0 and "total" in out and "provenance offline" in out and "12" in out

    state = tmp_path / "state.txt"
    state.write_text(HOME)
    code, out, _ = dg(capsys, "buffer", "query", "--state-file", str(state), "--action",
                      "click('1')", "--k", "2", "--json", *buf)
    rows = json.loads(out)
    assert code == 0 and len(rows) == 2
    assert rows[0]["action"] == "click('1')" and rows[0]["next_state"].startswith("URL: http")
    assert rows[0]["id"].endswith(":0") and rows[0]["similarity"] >= rows[1]["similarity"]
    code, out, _ = dg(capsys, "buffer", "query", "--state-file", str(state), "--action",
                      "click('1')", *buf)
    assert code == 0 and "similarity" in out and "Furniture" in out
    code, out, _ = dg(capsys, "buffer", "query", "--state-file", str(state), "--action", "x",
                      "--provenance", "synthetic", *buf)
    assert code == 0 and "no transitions found" in out

    export = tmp_path / "export.jsonl"
    code, out, _ = dg(capsys, "buffer", "export", str(export), *buf)
    assert code == 0 and "exported 12" in out and len(export.read_text().splitlines()) == 12

    code, out, _ = dg(capsys, "buffer", "prune", "--provenance", "offline", "--max-size", "5",
                      "--keep", "oldest", *buf)
    assert code == 0 and "removed 7 transitions (5 left" in out
    code, out, _ = dg(capsys, "buffer", "import", str(export), *buf)
    assert code == 0 and "imported 12" in out and "(12 in total)" in out
    code, out, _ = dg(capsys, "buffer", "prune", "--max-size", "0", *buf)
    assert code == 0 and "removed 12" in out


def test_buffer_errors(tmp_path, capsys):
    buf = ["--path", str(tmp_path / "buf")]
    code, _, err = dg(capsys, "buffer", "prune", *buf)
    assert_one_line_error(code, err, "--provenance", "--max-size")
    code, _, err = dg(capsys, "buffer", "seed", str(tmp_path / "nope.jsonl"), *buf)
    assert_one_line_error(code, err, "no such file", "nope.jsonl")
    code, _, err = dg(capsys, "buffer", "import", str(tmp_path / "nope.jsonl"), *buf)
    assert_one_line_error(code, err, "no such file", "buffer export")
    code, _, err = dg(capsys, "buffer", "query", "--state-file", str(tmp_path / "s.txt"), *buf)
    assert_one_line_error(code, err, "--action")
    code, _, err = dg(capsys, "buffer", "stats", "--url", "ftp://somewhere", *buf)
    assert_one_line_error(code, err, "not a Chroma server URL")
    code, _, err = dg(capsys, "buffer", "stats", "--embedding", "word2vec", *buf)
    assert_one_line_error(code, err, "word2vec")
    code, _, err = dg(capsys, "buffer", "prune", "--keep", "middle", *buf)
    assert_one_line_error(code, err, "middle")
    code, _, err = dg(capsys, "buffer", "stats", "--frobnicate", *buf)
    assert_one_line_error(code, err, "--frobnicate")


def test_buffer_without_a_subcommand_shows_help(capsys):
    code, out, err = dg(capsys, "buffer")
    assert code == 0 and "seed" in out and "export" in out and not err.strip()


def test_unreachable_buffer_url_is_one_line(tmp_path):
    """Through a subprocess: the real entry point, with nothing else on stderr."""
    env = {**os.environ, "DG_BUFFER_URL": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-m", "dreamgym_agents.cli.main", "buffer", "stats"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, "cannot reach the Chroma server",
                          "127.0.0.1:9")


# -- dream -----------------------------------------------------------------------------------


def test_dream_random_agent_with_a_mock_experience_model(tmp_path, capsys):
    out = tmp_path / "dream"
    code, stdout, err = dg(capsys, "dream", "--task", "webarena", "--agent", "random", "--split",
                           "test", "--limit", "2", "--out", str(out), "--experience-model",
                           "openai/test", "--buffer-path", str(tmp_path / "buf"), "--set",
                           END_ANSWER)
    assert code == 0, err
    assert "no real transitions to ground on" in err and "dg-agents buffer seed" in err
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert len(trajectories) == 2
    steps = [t for traj in trajectories for t in traj.transitions]
    assert steps and all(t.provenance == "synthetic" for t in steps)
    assert all(traj.provenance == "synthetic" and traj.agent == "random" for traj in trajectories)
    assert steps[-1].next_state == "URL: x\nTitle: y" and steps[-1].done
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real_transitions"] == 0 and summary["synthetic_transitions"] == len(steps)
    assert summary["em_failures"] == 0 and summary["experience_model"] == "openai/test"
    # the experience model's calls are counted apart from the (random) agent's, which has none
    assert summary["experience_usage"]["calls"] == len(steps)
    assert summary["experience_usage"]["total_tokens"] > 0 and summary["usage"]["calls"] == 0
    assert f"experience model: {len(steps)} calls" in err + stdout
    assert summary["use_history"] and summary["use_retrieval"] and summary["use_reasoning"]
    assert json.loads(stdout)["synthetic_transitions"] == len(steps)


def test_dream_counts_experience_model_failures_and_records_ablations(tmp_path, capsys,
                                                                      real_runs):
    oracle, _ = real_runs
    buf = str(tmp_path / "buf")
    assert dg(capsys, "buffer", "seed", str(oracle / "trajectories.jsonl"), "--path", buf)[0] == 0
    out = tmp_path / "dream"
    code, _, err = dg(capsys, "dream", "--agent", "oracle", "--split", "test", "--limit", "2",
                      "--out", str(out), "--experience-model", "openai/test", "--buffer-path",
                      buf, "--no-history", "--no-reasoning", "--set", "llm.mock_response=garbage",
                      "--set", "experience.max_parse_retries=0")
    assert code == 0, err
    assert "ground on" not in err  # the buffer is seeded
    summary = json.loads((out / "summary.json").read_text())
    assert summary["em_failures"] == 2 and summary["episodes"] == 2
    assert summary["experience_usage"]["calls"] == 2  # one unreadable answer per episode
    assert not summary["use_history"] and not summary["use_reasoning"]
    assert summary["use_retrieval"]
    for traj in read_trajectories(out / "trajectories.jsonl"):
        # the oracle found its first element in the recorded start state from the buffer
        first = traj.transitions[0]
        assert first.state == HOME and first.valid and first.action.startswith(("click", "fill"))
        assert first.info["em_failure"] and first.done and not traj.success


def test_dream_warns_that_an_expert_following_agent_has_no_plan_there(tmp_path, capsys):
    code, out, err = dg(capsys, "dream", "--task", "alfworld", "--agent", "oracle", "--limit",
                        "1", "--max-steps", "1", "--out", str(tmp_path / "d"),
                        "--experience-model", "openai/test", "--buffer-path",
                        str(tmp_path / "buf"), "--set", "llm.mock_response=garbage",
                        "--set", "experience.max_parse_retries=0")
    assert code == 0, err
    said = " ".join((out + err).split())
    assert "expert plan, which a dream has not" in said and "dg-agents fidelity" in said
    steps = read_trajectories(tmp_path / "d" / "trajectories.jsonl")[0].transitions
    assert [t.action for t in steps] == ["look"]


@pytest.mark.parametrize("args,needles", [
    (["--experience-model", "openai/test", "--set", "bogus.key=1"], ["bogus.key"]),
    (["--experience-model", "openai/test", "--set", "experience.top_k=0"],
     ["experience.top_k"]),
    (["--experience-model", "openai/test", "--set", "experience.colour=1"],
     ["experience.colour"]),
    (["--experience-model", "notaprovider/xyz"], ["notaprovider"]),
    (["--experience-model", "openai/test", "--agent", "notaprovider/abc"], ["notaprovider/abc"]),
    (["--experience-model", "openai/test", "--split", "dev"], ["dev"]),
    (["--experience-model", "openai/test", "--task", "alfworld-in-space"],
     ["unknown task family"]),
    (["--experience-model", "openai/test", "--frobnicate"], ["--frobnicate"]),
    (["--experience-model", "openai/test", "--buffer-url", "http://127.0.0.1:9"],
     ["cannot reach the Chroma server"]),
])
def test_dream_errors(tmp_path, capsys, args, needles):
    code, _, err = dg(capsys, "dream", "--out", str(tmp_path / "d"), "--buffer-path",
                      str(tmp_path / "buf"), *args)
    assert_one_line_error(code, err, *needles)


# -- fidelity --------------------------------------------------------------------------------

FIDELITY_KEYS = ("reward_accuracy", "done_accuracy", "success_accuracy", "state_f1",
                 "em_failure_rate", "oracle_real_success", "oracle_dream_success",
                 "random_real_success", "random_dream_success", "counts", "use_history",
                 "use_retrieval", "use_reasoning", *RUBRIC)


def test_fidelity_report_with_a_mock_experience_model_and_judge(tmp_path, capsys, real_runs):
    oracle, random = real_runs
    out = tmp_path / "fid"
    code, stdout, err = dg(capsys, "fidelity", "--task", "webarena", "--experience-model",
                           "openai/test", "--out", str(out), "--buffer-path",
                           str(tmp_path / "buf"), "--real", str(oracle), "--real", str(random),
                           "--judge", "openai/judge", "--judge-samples", "3", "--no-retrieval",
                           "--set", END_ANSWER, "--set", JUDGE_ANSWER)
    assert code == 0, err
    report = json.loads((out / "fidelity.json").read_text())
    for key in FIDELITY_KEYS:
        assert key in report, key
    # 6 oracle steps + 4 valid random steps; the model always says "done, no reward"
    counts = report["counts"]
    assert counts["transitions"] == 10 and counts["invalid_transitions_skipped"] == 2
    assert counts["tasks"] == 2 and counts["oracle_episodes"] == 2
    assert counts["random_episodes"] == 2 and counts["random_dream_episodes"] == 2
    assert report["done_accuracy"] == pytest.approx(4 / 10)
    assert report["reward_accuracy"] == pytest.approx(8 / 10)
    assert report["em_failure_rate"] == 0.0 and 0.0 <= report["state_f1"] < 1.0
    assert report["oracle_real_success"] == 1.0 and report["oracle_dream_success"] == 0.0
    assert report["random_real_success"] == 0.0 and report["random_dream_success"] == 0.0
    assert report["use_history"] and not report["use_retrieval"] and report["use_reasoning"]
    assert all(report[k] == 2.0 for k in RUBRIC)
    usage = report["judge"].pop("usage")
    assert report["judge"] == {"model": "openai/judge", "samples": 3, "judged": 3,
                               "unparseable": 0}
    assert usage["calls"] == 3  # one judgement a sampled episode, counted
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 10
    replays = read_trajectories(out / "oracle_replay.jsonl")
    assert len(replays) == 2 and all(t.transitions[0].state == HOME for t in replays)
    assert json.loads(stdout)["oracle_real_success"] == 1.0


def test_fidelity_limit_and_no_judge(tmp_path, capsys, real_runs):
    oracle, _ = real_runs
    out = tmp_path / "fid"
    code, _, err = dg(capsys, "fidelity", "--experience-model", "openai/test", "--out", str(out),
                      "--buffer-path", str(tmp_path / "buf"), "--real", str(oracle), "--limit",
                      "1", "--set", END_ANSWER)
    assert code == 0, err
    report = json.loads((out / "fidelity.json").read_text())
    assert report["counts"]["tasks"] == 1 and report["counts"]["transitions"] == 3
    assert report["random_real_success"] is None and report["random_dream_success"] == 0.0
    assert all(report[k] is None for k in RUBRIC) and report["judge"] is None


def test_fidelity_errors(tmp_path, capsys, real_runs):
    oracle, _ = real_runs
    base = ["fidelity", "--out", str(tmp_path / "f"), "--buffer-path", str(tmp_path / "buf")]
    model = ["--experience-model", "openai/test"]
    code, _, err = dg(capsys, *base, *model, "--real", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "missing", "does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = dg(capsys, *base, *model, "--real", str(oracle), "--real", str(empty))
    assert_one_line_error(code, err, str(empty), "no trajectories.jsonl")
    code, _, err = dg(capsys, *base, *model)
    assert_one_line_error(code, err, "--real")
    code, _, err = dg(capsys, *base, *model, "--real", str(oracle), "--set", "env.max_steps=3")
    assert_one_line_error(code, err, "env.max_steps")
    code, _, err = dg(capsys, *base, *model, "--real", str(oracle), "--judge-samples", "0")
    assert_one_line_error(code, err, "--judge-samples")
    code, _, err = dg(capsys, *base, *model, "--real", str(oracle), "--task", "textworld")
    assert_one_line_error(code, err, "unknown task family")


def test_dream_defaults_to_the_embedded_model(tmp_path, capsys, monkeypatch):
    """No --experience-model and no bundle: the cached embedded default (here a tiny stand-in)
    and its buffer. (With the shipped bundle: tests/test_bundle.py.)"""
    from dreamgym_agents.pipeline.embedded import embedded_dir, family_recipe

    monkeypatch.setenv("DG_BUNDLE", "none")
    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    folder = embedded_dir(family_recipe("webarena"), "webarena")
    make_tiny_checkpoint(folder / "model")
    (folder / "model" / "dreamgym_manifest.json").write_text(json.dumps(
        {"prompt_style": "compact", "example_config": {"top_k": 2, "use_history": True,
                                                        "use_retrieval": True,
                                                        "use_reasoning": True}}))
    (folder / "READY").write_text("{}")
    out = tmp_path / "dream"
    code, _, err = dg(capsys, "dream", "--agent", "random", "--split", "test", "--limit", "1",
                      "--max-steps", "1", "--out", str(out), "--set", "llm.max_tokens=8",
                      "--set", "experience.max_parse_retries=0")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experience_model"] == f"hf/{folder / 'model'}"
    assert str(folder / "buffer") in json.dumps(summary)  # the model's own buffer
    assert summary["em_failures"] == 1  # a random tiny model writes nothing readable
