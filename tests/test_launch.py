"""Training under a launcher (``torchrun`` / ``accelerate launch``): one process per device, data
prepared once, gradients averaged, one model written. On CPU the processes join a gloo group,
so the same code path that runs on several GPUs (NCCL) runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym_agents import launch

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_launcher_every_helper_is_the_plain_call(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert launch.world_size() == 1 and launch.is_main()
    assert launch.shared(lambda: [1, 2], "cpu") == [1, 2]
    assert launch.any_process(True, "cpu") and not launch.any_process(False, "cpu")
    ran = []
    with launch.main_first("cpu"):
        ran.append(1)
    assert ran == [1]
    launch.barrier("cpu")
    launch.check_weights_agree(object(), "cpu")  # nothing to compare with


def test_a_launcher_s_other_processes_are_not_the_main_one(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert launch.world_size() == 4 and launch.rank() == 3 and not launch.is_main()


def test_commands_that_do_not_train_in_several_processes_refuse_a_launcher(monkeypatch, capsys):
    from dreamgym_agents.cli.main import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["run", "--task", "alfworld"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: dg-agents run runs in one process: under torchrun or accelerate "
                   "launch only train-experience trains in several (docs/GPU.md)"]


@pytest.mark.slow
def test_train_experience_under_torchrun_trains_one_model_in_two_processes(tmp_path):
    from dreamgym_agents.pipeline.bundle import read_episodes
    from dreamgym_agents.types import append_trajectory

    episodes = read_episodes(next((ROOT / "bundles" / "alfworld" / "episodes")
                                  .glob("collect*.jsonl.gz")))[:6]
    data = tmp_path / "episodes.jsonl"
    for traj in episodes:
        append_trajectory(data, traj)
    out = tmp_path / "model"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", "29517", "-m", "dreamgym_agents.cli", "train-experience", str(data),
         "--out", str(out), "--buffer-path", str(tmp_path / "buffer"), "--steps", "3"],
        capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 processes" in proc.stderr
    assert proc.stderr.count("training on 6 episodes") == 1  # the main process prints
    manifest = json.loads((out / "dreamgym_manifest.json").read_text())
    assert manifest["processes"] == 2 and manifest["steps"] == 3
    # the processes compared their weights after training (launch.check_weights_agree): a run
    # whose gradients were not averaged exits 1 with "ended with different weights"
    from dreamgym_agents.gateway.local import load_causal_lm

    tokenizer, model = load_causal_lm(str(out))  # one complete model was written
    assert model.num_parameters() > 0 and len(tokenizer) > 0
