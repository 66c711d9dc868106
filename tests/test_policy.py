"""The policy's episode layout, its agent, and its SFT warm start on a tiny model."""

from __future__ import annotations

import asyncio
import re

import pytest
from conftest import counter_tasks
from counter_agents import CounterSolver

from dreamgym_agents.adapters.webarena.actions import WebActionSet
from dreamgym_agents.adapters.webarena.policy_view import WebPolicyView, compact_page
from dreamgym_agents.episodes.graph import RunConfig, run_episodes
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.policy.model import (
    ASSISTANT,
    USER,
    Generated,
    PolicyAgent,
    PolicyConfig,
    PolicyModel,
    episode_tokens,
    render_segment,
)
from dreamgym_agents.policy.sft import PolicySFTConfig, sft_rows, train_policy_sft
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
                                            learning_rate=3e-3, max_length=256, env_loss_weight=0.3,
                                            seed=0))
    return str(out)


def test_compact_page_and_segment():
    page = "URL: http://s/\nTitle: Shop\n[3] link 'Laptops'\nStaticText 'Hello there'\n" \
           "heading 'Featured'\nStaticText '" + "x" * 150 + "'"
    shown = compact_page(page, max_lines=80, max_chars=100)
    assert shown.splitlines()[2:5] == ["[3] link 'Laptops'", "Hello there", "# Featured"]
    assert compact_page(page, bids=False).splitlines()[2] == "link 'Laptops'"
    assert shown.splitlines()[5].endswith("…") and len(shown.splitlines()[5]) == 101
    assert compact_page(page, max_lines=3).splitlines()[-1] == "(… 3 more lines)"
    task = Task(task_id="1", family="webarena", intent="Buy it")
    web = WebPolicyView()
    seg = render_segment(task, page, ["click('3')", "go_back()"], "no such element",
                         PolicyConfig(history_actions=1), web)
    assert seg.startswith(f"{USER}URL: http://s/\nTitle: Shop\nlink 'Laptops'\n")
    assert "[3] link 'Laptops'" in render_segment(task, page, cfg=PolicyConfig(
        options={"element_refs": "bid"}), view=web)
    # no view: the state as plain text (bids and roles kept)
    assert "[3] link 'Laptops'\nStaticText 'Hello there'" in render_segment(task, page)
    assert seg.endswith(f"\nTask: Buy it\nSteps: go_back()\nError: no such element\n{ASSISTANT}")


def test_the_lines_a_task_mentions_are_marked():
    from dreamgym_agents.adapters.webarena.policy_view import mentions

    page = ("URL: http://s/\nTitle: Shop\n[3] link 'Laptops'\n[5] link 'Acme Red Chair'\n"
            "[6] link 'Acme Red Chair, Oak'\nStaticText 'Jacket | PVC'\n"
            "StaticText 'Rating: 4.0 out of 5'\n[9] link 'View Order #100062'\n"
            "StaticText '100031 | Sep 30, 2024 | $989.32'")
    task = "What is the jacket of Acme Red Chair in order #100062 of Sep 2024?"
    marked = [ln[2:] for ln in compact_page(page, bids=False, intent=task).splitlines()
              if ln.startswith("* ")]
    assert marked == ["link 'Acme Red Chair'", "Jacket | PVC", "link 'View Order #100062'"]
    assert mentions("Rating: 4.0 out of 5", "What is the average rating of X?")
    assert mentions("Acme Red Chair, Walnut Ba…", "Open Acme Red Chair, Walnut Base.")
    assert not mentions("Qty", "Set the qty")  # too short to mean anything
    assert not any(ln.startswith("* ") for ln in compact_page(page).splitlines())


def test_policy_config_validates():
    with pytest.raises(ConfigError, match="max_action_tokens"):
        PolicyConfig(max_action_tokens=1)
    with pytest.raises(ConfigError, match="lora_r must be >= 0"):
        PolicySFTConfig(output_dir="x", lora_r=-1)


def test_lora_sft_adapts_a_checkpoint_and_saves_it_merged(tmp_path, counter_env_factory):
    import torch

    from dreamgym_agents.gateway.local import load_causal_lm

    demos = counter_demos(tmp_path, counter_env_factory, 4)
    with pytest.raises(ConfigError, match="sft.lora_r needs a checkpoint"):
        train_policy_sft(demos, PolicySFTConfig(output_dir=str(tmp_path / "x"), lora_r=4))
    base = tiny_sft(tmp_path, demos, steps=1, name="base")
    out = tmp_path / "lora"
    result = train_policy_sft(demos, PolicySFTConfig(
        output_dir=str(out), base_model=base, lora_r=4, max_steps=3, batch_size=4,
        learning_rate=1e-2, max_length=256, seed=0))
    assert result["lora_r"] == 4 and result["steps"] == 3 and not result["from_scratch"]
    assert result["last_loss"] < result["first_loss"]
    assert not (out / "adapter_config.json").exists()  # merged: a plain checkpoint
    before, after = load_causal_lm(base)[1].state_dict(), load_causal_lm(out)[1].state_dict()
    assert before.keys() == after.keys()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.endswith("q_proj.weight") for k in moved)  # the adapted linear layers
    assert not any("embed_tokens" in k or "norm" in k for k in moved)  # nothing else
    assert PolicyModel.load(str(out)).eos_id is not None


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


def _shop_episode(n: int, product: str, typed: str | None = None) -> Trajectory:
    from dreamgym_agents.types import Transition

    task = Task(task_id=f"t{n}", family="webarena", intent=f"What is the price of {product}?",
                params={"product": product, "word": "cheapest"})
    pages = [f"[37] searchbox ''\n{product} $5", f"# {product}\nPrice $5"]
    actions = [f"fill('37', '{typed or product}')", "send_msg_to_user('$5')"]
    steps = [Transition(episode_id=f"e{n}", step=i, task_id=task.task_id, state=pages[i],
                        action=actions[i], next_state=pages[min(i + 1, 1)])
             for i in range(2)]
    return Trajectory(episode_id=f"e{n}", task=task, transitions=steps, success=True)


def test_entity_swaps_replace_the_copied_entity_everywhere():
    from dreamgym_agents.policy.sft import swap_entities

    episodes = [_shop_episode(0, "Acme Red Chair"), _shop_episode(1, "Bolt Blue Lamp"),
                _shop_episode(2, "Cora Desk Fan", typed="Cora")]  # typed in part: not swapped
    swapped = swap_entities(episodes, copies=2, seed=0, action_set=WebActionSet())
    assert len(swapped) == 4 and {s.task.task_id for s in swapped} == {
        "t0~swap0", "t0~swap1", "t1~swap0", "t1~swap1"}
    for s in swapped:
        source = episodes[int(s.task.task_id[1])]
        new = s.task.params["product"]
        assert new != source.task.params["product"] and new in ("Acme Red Chair",
                                                                  "Bolt Blue Lamp",
                                                                  "Cora Desk Fan")
        assert s.task.intent == f"What is the price of {new}?"
        assert s.transitions[0].action == f"fill('37', '{new}')"
        assert all(new in t.state for t in s.transitions)
        assert s.task.params["word"] == "cheapest"  # not on a page: a word the task decides by


def test_novel_swaps_invent_a_value_of_the_same_shape_and_use_it_everywhere():
    import random

    from dreamgym_agents.policy.sft import novel_value, swap_entities

    made = novel_value("Acme Red-Chair, 10 ft", random.Random(1))
    assert made != "Acme Red-Chair, 10 ft" and made[0].isupper()
    assert [len(w) for w in re.findall(r"[A-Za-z]+", made)] == [4, 3, 5, 2]
    assert re.sub(r"[A-Za-z]", "x", made) == "xxxx xxx-xxxxx, 10 xx"  # digits, marks kept
    episodes = [_shop_episode(0, "Acme Red Chair"), _shop_episode(1, "Bolt Blue Lamp")]
    swapped = swap_entities(episodes, copies=3, seed=0, novel=1.0, action_set=WebActionSet())
    assert len(swapped) == 6
    for s in swapped:
        new = s.task.params["product"]
        assert new not in ("Acme Red Chair", "Bolt Blue Lamp")
        assert s.task.intent == f"What is the price of {new}?"
        assert s.transitions[0].action == f"fill('37', '{new}')"
        assert all(new in t.state for t in s.transitions)


def test_episode_tokens_write_elements_by_name_and_the_agent_resolves_them(tmp_path,
                                                                            counter_env_factory):
    from dreamgym_agents.episodes.env import Observation

    policy = PolicyModel.load(tiny_sft(tmp_path, counter_demos(tmp_path, counter_env_factory, 2),
                                       steps=1), view=WebPolicyView())
    episode = _shop_episode(0, "Acme Red Chair")
    tokens = episode_tokens(policy, episode.task, episode.transitions)
    written = policy.decode([i for i, m in zip(tokens.ids, tokens.mask, strict=True) if m])
    assert written == "fill(searchbox '', 'Acme Red Chair')send_msg_to_user('$5')"
    assert "[37]" not in policy.decode(tokens.ids)  # pages without bids
    second = policy.decode(tokens.turn_ids(1))
    assert "Steps: fill(searchbox '', 'Acme Red Chair')" in second  # history as written

    answer = policy.encode("click(link 'Acme Red Chair')") + [policy.eos_id]
    policy.generate_traced = (  # a fixed answer
        lambda ids, temperature=None, constraint=None, trace=True, seed=None:
        Generated(answer, [None] * len(answer), [0.0] * len(answer)))
    agent = PolicyAgent(policy, keep_tokens=False)
    page = "URL: http://s/\nTitle: T\n[5] link 'Acme Red Chair'"
    decision = asyncio.run(agent.act(episode.task, Observation(page), [], "e"))
    assert decision.action == "click('5')" and decision.raw == "click(link 'Acme Red Chair')"
    gone = asyncio.run(agent.act(episode.task, Observation("URL: x\nTitle: T"), [], "e2"))
    assert gone.action == "click(link 'Acme Red Chair')"  # not on the page: refused as written


def test_sft_rows_weigh_pages_at_a_share_of_the_actions(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 2)
    policy = PolicyModel.load(tiny_sft(tmp_path, demos, steps=1))
    rows, _ = sft_rows(policy, demos, max_length=256, env_weight=0.5)
    for row in rows:
        acted = [w for w in row["token_weights"] if w == 1.0]
        pages = [w for w in row["token_weights"][1:] if w != 1.0]
        assert row["token_weights"][0] == 0.0 and acted
        assert sum(pages) == pytest.approx(0.5 * len(acted))  # pages: half the actions' weight
