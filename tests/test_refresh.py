"""The experience model's refresh on a run's fresh real transitions (the Dyna schedule)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers", reason="the 'train' extra is not installed")

from test_experience_sft import tiny  # noqa: E402
from test_experience_training_data import episode  # noqa: E402

from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer  # noqa: E402
from dreamgym_agents.episodes.env import make_family  # noqa: E402
from dreamgym_agents.errors import ConfigError  # noqa: E402
from dreamgym_agents.experience.data import ExampleConfig  # noqa: E402
from dreamgym_agents.experience.refresh import (  # noqa: E402
    ExperienceRefreshConfig,
    refresh_experience_model,
)
from dreamgym_agents.experience.training import read_manifest, train_from_trajectories  # noqa

WEB_FAMILY = make_family("webarena")


def real(traj):
    traj = replace(traj, transitions=[replace(t, provenance="real") for t in traj.transitions])
    traj.provenance = "real"
    return traj


def weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_refresh_fine_tunes_on_fresh_transitions_resumes_and_is_kept(tmp_path):
    recorded = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    buffer = ReplayBuffer(BufferConfig(path=str(tmp_path / "buf")))
    train_from_trajectories(recorded, buffer, ExampleConfig(top_k=1),
                            tiny(tmp_path / "base", epochs=1), family=WEB_FAMILY)
    fresh = [real(episode("s2r-0-0-0", "$4.50", False)), real(episode("s2r-0-0-1", "$9.99",
                                                                      True))]
    buffer.add_trajectories(fresh, stage="s2r")
    cfg = ExperienceRefreshConfig(enabled=True, steps=4, batch_size=2, learning_rate=1e-2)
    out = tmp_path / "refresh"

    steps = []

    def interrupted(advance, *args, **kwargs):
        steps.append(advance)
        if len(steps) == 2:
            raise KeyboardInterrupt  # the run was stopped half-way through the refresh
    with pytest.raises(KeyboardInterrupt):
        refresh_experience_model(tmp_path / "base", fresh, recorded, buffer, out, cfg,
                                 family=WEB_FAMILY, on_step=interrupted)
    assert not (out / "READY").exists()
    figures = refresh_experience_model(tmp_path / "base", fresh, recorded, buffer, out, cfg,
                                       family=WEB_FAMILY)
    assert figures["resumed_from_step"] == 1 and figures["steps"] == 4
    assert figures["fresh_transitions"] == 4 and figures["fresh_examples"] == 4
    assert figures["replayed_examples"] == 4  # one recorded example per fresh one
    before, after = weights(tmp_path / "base"), weights(out / "model")
    assert before.keys() == after.keys()
    assert any(not (before[k] == after[k]).all() for k in before)  # it learnt something
    manifest = read_manifest(out / "model")
    assert manifest["prompt_style"] == "compact"  # prompted as the model it came from
    assert manifest["refreshed"][-1]["fresh_transitions"] == 4
    assert not (out / "model" / "trainer").exists()
    again = refresh_experience_model(tmp_path / "base", [], recorded, buffer, out, cfg,
                                     family=WEB_FAMILY)
    assert again == json.loads((out / "READY").read_text()) == figures  # finished: kept
    buffer.close()


def test_a_model_without_a_recipe_cannot_be_refreshed(tmp_path):
    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    make_tiny_checkpoint(tmp_path / "foreign")
    with pytest.raises(ConfigError, match="not an experience model trained by dg-agents"):
        refresh_experience_model(tmp_path / "foreign", [episode("a", "$1", True)], [], None,
                                 tmp_path / "out", ExperienceRefreshConfig(enabled=True),
                                 family=WEB_FAMILY)
    with pytest.raises(ConfigError, match="every_batches must be >= 0"):
        ExperienceRefreshConfig(every_batches=-1)
