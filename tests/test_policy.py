"""The policy's episode layout, its agent, and its SFT warm start on a tiny model."""

from __future__ import annotations

import asyncio

import pytest
from conftest import counter_tasks
from counter_agents import CounterSolver

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.graph import RunConfig, run_episodes
from dreamgym_agents.policy import (
    ASSISTANT,
    USER,
    PolicyAgent,
    PolicyConfig,
    PolicyModel,
    compact_page,
    episode_tokens,
    render_segment,
)
from dreamgym_agents.training.policy_sft import PolicySFTConfig, sft_rows, train_policy_sft
from dreamgym_agents.types import Task, Trajectory, read_trajectories

pytestmark = pytest.mark.slow


def counter_demos(tmp_path, counter_env_factory, n: int = 12) -> list[Trajectory]:
    """Solved counter episodes (inc … stop [n]), recorded by the episode runner."""
    cfg = RunConfig(out_dir=tmp_path / "demos", concurrency=2, max_steps=6, meta={})
    asyncio.run(run_episodes(counter_tasks(n), counter_env_factory, CounterSolver(), cfg))
    return read_trajectories(tmp_path / "demos" / "trajectories.jsonl")


def tiny_sft(tmp_path, demos: list[Trajectory], steps: int = 150, name: str = "sft") -> str:
    out = tmp_path / name
    train_policy_sft(demos, PolicySFTConfig(output_dir=str(out), vocab_size=300, hidden_size=64,
                                            num_layers=2, max_steps=steps, batch_size=8,
                                            learning_rate=3e-3, max_length=256, seed=0))
    return str(out)


def test_compact_page_and_segment():
    page = "URL: http://s/\nTitle: Shop\n[3] link 'Laptops'\nStaticText 'Hello there'\n" \
           "heading 'Featured'\nStaticText '" + "x" * 150 + "'"
    shown = compact_page(page, max_lines=80, max_chars=100)
    assert shown.splitlines()[2:5] == ["[3] link 'Laptops'", "Hello there", "# Featured"]
    assert shown.splitlines()[5].endswith("…") and len(shown.splitlines()[5]) == 101
    assert compact_page(page, max_lines=3).splitlines()[-1] == "(… 3 more lines)"
    task = Task(task_id="1", family="f", intent="Buy it")
    seg = render_segment(task, page, ["click('3')", "go_back()"], "no such element",
                         PolicyConfig(history_actions=1))
    assert seg.startswith(f"{USER}URL: http://s/\n")
    assert seg.endswith(f"\nTask: Buy it\nSteps: go_back()\nError: no such element\n{ASSISTANT}")


def test_policy_config_validates():
    with pytest.raises(ConfigError, match="max_action_tokens"):
        PolicyConfig(max_action_tokens=1)
    with pytest.raises(ConfigError, match="lora_r needs sft.base_model"):
        PolicySFTConfig(output_dir="x", lora_r=4)


def test_sft_rows_train_action_tokens_only(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 3)
    path = tiny_sft(tmp_path, demos, steps=1)
    policy = PolicyModel.load(path)
    rows, dropped = sft_rows(policy, demos, max_length=256)
    assert dropped == 0
    assert len(rows) == sum(len(t.transitions) for t in demos)  # one row per turn
    for row, t in zip(rows, [t for d in demos for t in d.transitions], strict=True):
        trained = [i for i, lab in zip(row["input_ids"], row["labels"], strict=True)
                   if lab != -100]
        assert policy.decode(trained) == t.action  # the action and its end token, nothing else
        assert trained[-1] == policy.eos_id
        assert row["input_ids"][0] == policy.user_id
    tokens = episode_tokens(policy, demos[0].task, demos[0].transitions)
    assert len(tokens.turns) == len(demos[0].transitions)
    assert policy.decode([i for i, m in zip(tokens.ids, tokens.mask, strict=True) if m]) == \
        "".join(t.action for t in demos[0].transitions)


def test_warm_started_policy_solves_the_counter(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 12)
    path = tiny_sft(tmp_path, demos, steps=200)
    agent = PolicyAgent(PolicyModel.load(path), keep_tokens=False)
    cfg = RunConfig(out_dir=tmp_path / "eval", concurrency=3, max_steps=6, meta={})
    result = asyncio.run(run_episodes(counter_tasks(6), counter_env_factory, agent, cfg))
    assert result.summary["success_rate"] >= 0.5
    assert not agent._episodes  # evaluation keeps no tokens
