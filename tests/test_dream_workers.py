"""`dg-agents dream --workers N`: the episodes split over processes, merged once, resumable
whatever N is, against a real (latency) OpenAI-compatible server."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym_agents.cli.dream_workers import shares
from dreamgym_agents.types import read_trajectories

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stub_server():
    pytest.importorskip("aiohttp")
    spec = importlib.util.spec_from_file_location(
        "dream_concurrency", ROOT / "benchmarks" / "dream_concurrency.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ctx = multiprocessing.get_context("fork")
    ports = ctx.Queue()
    server = ctx.Process(target=bench.serve, args=(0.01, ports), daemon=True)
    server.start()
    yield f"http://127.0.0.1:{ports.get(timeout=60)}/v1"
    server.terminate()
    server.join()


def dream(base_url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dreamgym_agents.cli.main", "dream", "--task", "alfworld",
         "--agent", "random", "--experience-model", "openai/latency-stub", "--limit", "6",
         "--concurrency", "4", "--max-steps", "3", "--out", str(out),
         "--set", f"llm.api_base={base_url}", "--set", "llm.api_key_env=STUB_API_KEY",
         "--set", "llm.max_retries=0", *extra],
        env={**os.environ, "STUB_API_KEY": "stub-key"}, capture_output=True, text=True,
        timeout=900)


def test_shares_split_the_concurrency():
    assert shares(64, 2) == [32, 32] and shares(5, 3) == [2, 2, 1] and shares(1, 3) == [1, 1, 1]


@pytest.mark.slow
def test_workers_play_each_episode_once_then_resume_with_any_count(stub_server, tmp_path):
    pytest.importorskip("alfworld")
    out = tmp_path / "dream"
    done = dream(stub_server, out, "--workers", "2", "--set", "buffer.index=memory")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "over 2 worker process(es)" in done.stdout + done.stderr
    trajs = read_trajectories(out / "trajectories.jsonl")
    assert sorted(t.task.task_id for t in trajs) == sorted({t.task.task_id for t in trajs})
    assert len(trajs) == 6 and all(t.provenance == "synthetic" for t in trajs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["synthetic_transitions"] == 18
    assert summary["experience_usage"]["calls"] == 18 and summary["em_failures"] == 0
    assert summary["workers"] == 2 and summary["resumed_episodes"] == 0
    assert summary["wall_seconds"] > 0 and summary["setup_seconds"] > 0  # workers' start-up
    folders = sorted((out / "workers").glob("w*"))
    assert [len(read_trajectories(f / "trajectories.jsonl")) for f in folders] == [3, 3]

    # stopped before the merge finished: the workers' folders still hold every episode
    lines = (out / "trajectories.jsonl").read_text().splitlines(keepends=True)
    (out / "trajectories.jsonl").write_text("".join(lines[:2]))
    again = dream(stub_server, out, "--workers", "3", "--set", "buffer.index=memory")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "worker process" not in again.stdout + again.stderr  # nothing left to play
    resumed = read_trajectories(out / "trajectories.jsonl")
    assert sorted(t.episode_id for t in resumed) == sorted(t.episode_id for t in trajs)
    assert json.loads((out / "summary.json").read_text())["resumed_episodes"] == 6

    # one process on the same folder reads it as its own run
    single = dream(stub_server, out, "--set", "buffer.index=memory")
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-2000:]
    assert len(read_trajectories(out / "trajectories.jsonl")) == 6


def test_a_bad_worker_count_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dreamgym_agents.cli.main", "dream", "--task",
                           "alfworld", "--out", str(tmp_path / "x"), "--workers", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--workers" in done.stderr
