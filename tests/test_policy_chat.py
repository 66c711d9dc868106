"""The chat layout: a checkpoint's own chat template for the policy's turns, in SFT, RL scoring
and play alike (the compact layout's tests are in test_policy.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from conftest import counter_tasks
from test_bench_scripts import load
from test_policy import counter_demos, tiny_sft

from dreamgym_agents.cli.common import Sections, build_agent
from dreamgym_agents.episodes.graph import RunConfig, run_episodes
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.gateway.local import load_causal_lm
from dreamgym_agents.policy.model import (
    PlainView,
    PolicyAgent,
    PolicyConfig,
    PolicyModel,
    episode_tokens,
    turn_format,
    turn_text,
)
from dreamgym_agents.policy.sft import PolicySFTConfig, sft_rows, train_policy_sft
from dreamgym_agents.rl.grpo import ConstraintBook, turn_logps

CHATML = load("gpu_policy_sft").CHATML
CHAT = PolicyConfig(turn_format="chat", max_action_tokens=16)


class Tok:
    """What turn_format reads of a tokenizer."""

    unk_token_id = 0

    def __init__(self, markers: bool, template: str | None) -> None:
        self.markers, self.chat_template = markers, template

    def convert_tokens_to_ids(self, token: str) -> int:
        return 7 if self.markers else self.unk_token_id


def test_the_turn_format_is_the_checkpoints_own():
    assert turn_format(Tok(True, CHATML)) == "compact"  # the from-scratch policy's markers
    assert turn_format(Tok(False, CHATML)) == "chat"  # a pretrained chat model
    assert turn_format(Tok(False, None)) == "compact"  # neither: SFT adds the markers
    assert turn_format(Tok(True, CHATML), "chat") == "chat"
    with pytest.raises(ConfigError, match="no chat template"):
        turn_format(Tok(False, None), "chat")
    with pytest.raises(ConfigError, match="turn_format must be one of"):
        PolicyConfig(turn_format="harmony")


@pytest.fixture()
def chat_base(tmp_path, counter_env_factory):
    """A tiny checkpoint with a ChatML template whose end of turn is its end token."""
    demos = counter_demos(tmp_path, counter_env_factory, 12)
    tiny = tiny_sft(tmp_path, demos, steps=1, name="tiny")
    return load("gpu_policy_sft").as_chat_checkpoint(tiny, tmp_path / "chat-base"), demos


@pytest.mark.slow
def test_a_chat_policy_reads_its_turns_in_its_template_and_ends_actions_with_its_end_of_turn(
        chat_base):
    path, demos = chat_base
    policy = PolicyModel.load(path, CHAT)
    longer = next(d for d in demos if len(d.transitions) >= 2)
    task, steps = longer.task, longer.transitions
    assert policy.format == "chat" and policy.turn_end == [policy.eos_id]
    text = turn_text(task, steps[1].state, [steps[0].action], "", CHAT)
    assert policy.decode(policy.segment_ids(task, steps[1].state, [steps[0].action])) == \
        policy.decode(policy.encode(f"<|im_start|>user\n{text}<|im_end|>\n"
                                    "<|im_start|>assistant\n"))
    assert policy.action_ids("inc") == [*policy.encode("inc"), policy.eos_id]
    start = policy.tokenizer.convert_tokens_to_ids("<|im_start|>")
    rows, _ = sft_rows(policy, demos[:2], max_length=256)
    for row, t in zip(rows, [t for d in demos[:2] for t in d.transitions], strict=True):
        assert row["input_ids"][0] == start  # each turn is its own chat, from its first token
        trained = [i for i, lab in zip(row["input_ids"], row["labels"], strict=True)
                   if lab != -100]
        assert trained == policy.action_ids(t.action)  # the action and the end of turn only


@pytest.mark.slow
def test_sft_in_the_chat_layout_then_play_in_it(tmp_path, chat_base, counter_env_factory):
    path, demos = chat_base
    out = tmp_path / "chat-sft"
    result = train_policy_sft(demos, PolicySFTConfig(
        output_dir=str(out), base_model=path, max_steps=200, batch_size=8, learning_rate=3e-3,
        max_length=256, env_loss_weight=0.3, seed=0), CHAT)
    assert result["last_loss"] < result["first_loss"]
    tokenizer, _ = load_causal_lm(out)
    assert "<|im_end|>" in tokenizer.get_vocab() and tokenizer.chat_template == CHATML
    # the checkpoint says how it plays: `eval --agent hf/<checkpoint>` plays it in its layout
    settings = json.loads((out / "policy.json").read_text())
    assert settings["turn_format"] == "chat" and settings["max_action_tokens"] == 16

    class NoAgents:
        @staticmethod
        def offline_agents(seed):
            return {}

        @staticmethod
        def policy_view():
            return PlainView()

    agent = build_agent(f"hf/{out}", seed=0, family=NoAgents(),
                        sections=Sections(None, None, ("llm",)))
    assert isinstance(agent, PolicyAgent) and agent.policy.format == "chat"
    assert agent.policy.cfg.max_action_tokens == 16 and not agent.keep_tokens
    cfg = RunConfig(out_dir=tmp_path / "eval", concurrency=3, max_steps=6, meta={})
    played = asyncio.run(run_episodes(counter_tasks(6), counter_env_factory, agent, cfg))
    assert played.summary["success_rate"] >= 0.5


@pytest.mark.slow
def test_chat_turns_are_scored_from_their_own_segment_by_the_rollouts_layout(chat_base):
    path, demos = chat_base
    policy = PolicyModel.load(path, CHAT)
    tokens = episode_tokens(policy, demos[2].task, demos[2].transitions)
    prompt, completion = tokens.prompt_ids, tokens.completion_ids
    pad = 3
    ids = torch.tensor([[policy.pad_id] * pad + prompt + completion + [policy.pad_id] * pad])
    mask = torch.tensor([[0] * pad + [1] * (len(prompt) + len(completion)) + [0] * pad])
    keep = len(completion) + pad
    book = ConstraintBook()
    book.add(tokens)
    with torch.no_grad():
        logps, _ = turn_logps(policy.model, ids, mask, keep, user_id=-1, assistant_id=-1,
                              pad_id=policy.pad_id, constraints=book)
        expected = torch.zeros(keep)
        for i in range(len(tokens.turns)):  # each turn alone, from its own chat's first token
            turn, start = tokens.turn_ids(i), tokens.turns[i]
            lp = torch.log_softmax(policy.model(input_ids=torch.tensor([turn])).logits[0].float(),
                                   -1)
            for j in range(1, len(turn)):
                pos = start + j - len(prompt)
                if pos >= 0 and tokens.mask[start + j]:
                    expected[pos] = lp[j - 1, turn[j]]
    assert torch.allclose(logps[0], expected, atol=1e-4)
    assert (expected != 0).sum() == sum(tokens.env_mask)  # every action token, nothing else
