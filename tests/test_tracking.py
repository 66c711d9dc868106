"""Runs a user can watch: a run with ``tracking=tensorboard`` writes event files that
TensorBoard's own reader reads back, with the stage figures and a real trainer's losses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import CounterEnv, counter_tasks
from test_pipeline import Stubbed
from test_policy import counter_demos, tiny_sft

from dreamgym_agents.episodes.graph import EnvPool
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.run import PipelineConfig, preset_config
from dreamgym_agents.policy.model import PolicyConfig
from dreamgym_agents.rl.grpo import GRPOStageConfig, train_grpo


def _scalars(folder) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = EventAccumulator(str(folder))
    found.Reload()
    return {tag: [e.value for e in found.Scalars(tag)] for tag in found.Tags()["scalars"]}


def test_a_tracked_run_writes_stage_figures_and_a_trainers_losses(tmp_path,
                                                                   counter_env_factory):
    pytest.importorskip("tensorboard", reason="the 'track' extra is not installed")
    out = tmp_path / "run"
    calls: list[str] = []
    run = Stubbed(replace(preset_config("quick"), tracking="tensorboard"), out, calls=calls)
    demos = counter_demos(tmp_path, counter_env_factory, 4)
    policy = tiny_sft(tmp_path, demos, steps=3)

    def dream_rl():  # a real GRPO trainer inside the run: its logs are tracked
        calls.append("dream_rl")
        pool = EnvPool(CounterEnv, 2)
        try:
            result = train_grpo(policy, tmp_path / "grpo", counter_tasks(2), pool,
                                GRPOStageConfig(num_generations=2, tasks_per_step=1,
                                                micro_batch=2, max_steps=2,
                                                max_episode_steps=3, concurrency=2),
                                PolicyConfig(max_action_tokens=16), stage="dream_rl")
        finally:
            pool.close()
        return {"path": result["path"], "real_transitions": 0, "synthetic_transitions": 12,
                "rollout_success": 0.5}

    run.stage_dream_rl = dream_rl
    run.run()
    tracked = out / "tracking"
    stages = _scalars(tracked / "pipeline")
    assert stages["eval_sft/success"] == [pytest.approx(0.2)]  # float32, as TensorBoard keeps
    assert stages["eval_s2r/success"] == [pytest.approx(0.4)]
    assert stages["dream_rl/synthetic_transitions"] == [12]
    trainer = _scalars(tracked / "dream_rl")
    losses = [tag for tag in trainer if tag.endswith("loss")]
    assert losses and len(trainer[losses[0]]) == 2  # one per optimisation step
    # what a run shows is not what it computes: it resumes untracked
    config = json.loads((out / "config.json").read_text())
    assert config["tracking"] == "tensorboard"
    Stubbed(preset_config("quick"), out, calls=calls).run()


def test_an_unknown_tracker_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="tracking must be one of none, tensorboard"):
        PipelineConfig(tracking="mlflow")
    with pytest.raises(ConfigError, match="not wired in yet"):
        PipelineConfig(tracking="wandb")
