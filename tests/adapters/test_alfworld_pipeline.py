"""ALFWorld through the pipeline's family hooks: the presets' RL episode length, the oracle's
demonstrations and their progress."""

from __future__ import annotations

import pytest

pytest.importorskip("alfworld")


def test_the_presets_give_alfworld_rl_episodes_room_to_recover():
    """The expert's plans take up to 9 commands: an RL episode in the presets gets the family's
    15 steps (the web keeps 10), and --set still overrides it."""
    from dreamgym_agents.cli.policy import _pipeline_config
    from dreamgym_agents.pipeline.run import RL_EPISODE_STEPS, preset_config

    alfworld, web = preset_config("quick", 0, "alfworld"), preset_config("quick", 0, "webarena")
    assert alfworld.dream.max_episode_steps == alfworld.s2r.max_episode_steps == 15
    assert web.dream.max_episode_steps == web.s2r.max_episode_steps == RL_EPISODE_STEPS == 10
    assert preset_config("full").dream.max_episode_steps == RL_EPISODE_STEPS  # no family given
    # no family is the core's default: a preset without one names none
    assert (alfworld.task, web.task, preset_config("full").task) == ("alfworld", "webarena", "")
    cfg = _pipeline_config("quick", 0, "embedded", None, None, ["dream.max_episode_steps=7"],
                           "alfworld")
    assert cfg.dream.max_episode_steps == 7 and cfg.s2r.max_episode_steps == 15


def test_the_demonstrations_bar_counts_every_train_task(tmp_path, monkeypatch):
    """With no task count (every train task), the progress bar is made once the tasks are
    known: its total is theirs and it ticks once per episode (it used to be a bar of 0)."""
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily
    from dreamgym_agents.pipeline.embedded import ensure_demos

    real = AlfworldFamily.load_tasks
    monkeypatch.setattr(AlfworldFamily, "load_tasks",
                        lambda self, split: real(self, split)[:3])
    bars: list[tuple[str, int]] = []
    ticks: list[int] = []

    def bar(label: str, total: int):
        bars.append((label, total))
        return lambda n, *rest: ticks.append(n)

    folder = ensure_demos("alfworld", None, concurrency=1, max_steps=15, bar=bar,
                          folder=tmp_path / "demos")
    assert bars == [("demonstrations", 3)] and ticks == [1, 1, 1]
    assert (folder / "COMPLETE").exists()
