"""The policy's warm-start SFT in the chat layout on whatever device training picks (a GPU when
one is visible): a small chat checkpoint made here (ChatML template, its own end of turn), the
shipped ALFWorld oracle demonstrations, full fine-tuning and LoRA. Prints, per run, the device,
bfloat16, steps, losses and seconds, then how many demonstration turns the trained policy
writes back exactly (greedy)::

    python benchmarks/gpu_policy_sft.py OUT_DIR [--steps 200]

Needs only torch, transformers, peft, trl and datasets (no browser, game or buffer).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.gateway.local import load_causal_lm, make_tiny_checkpoint
from dreamgym_agents.pipeline.bundle import read_episodes
from dreamgym_agents.policy.model import PolicyConfig, PolicyModel, episode_tokens
from dreamgym_agents.policy.sft import PolicySFTConfig, train_policy_sft

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
DEMOS = Path(__file__).resolve().parents[1] / "bundles" / "alfworld" / "episodes" / \
    "demos.jsonl.gz"


def as_chat_checkpoint(source: str | Path, out: Path) -> str:
    """``source`` saved to ``out`` as a chat model: a ChatML template whose end of turn,
    ``<|im_end|>``, is its end token (the tests' small stand-in for a pretrained chat model)."""
    tokenizer, model = load_causal_lm(source)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHATML
    model.resize_token_embeddings(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--turns", type=int, default=40, help="Turns checked after SFT.")
    args = parser.parse_args()
    demos = read_episodes(DEMOS, collectors=("oracle",))
    family = make_family("alfworld")
    base = as_chat_checkpoint(
        make_tiny_checkpoint(args.out / "base", hidden_size=256, num_layers=4, vocab_size=2000),
        args.out / "chat")
    view = PolicyConfig(turn_format="chat", constrained_decoding=False, max_action_tokens=24)
    for lora in (0, 8):
        result = train_policy_sft(demos, PolicySFTConfig(
            output_dir=str(args.out / f"sft-lora{lora}"), base_model=base, lora_r=lora,
            max_steps=args.steps, batch_size=16, learning_rate=2e-3, max_length=1024,
            entity_swaps=0, seed=0), view, family=family)
        policy = PolicyModel.load(result["path"], view, family.policy_view())
        started, exact, seen = time.perf_counter(), 0, 0
        for traj in demos:
            tokens = episode_tokens(policy, traj.task, traj.transitions)
            for i in range(len(tokens.turns)):
                segment = tokens.turn_ids(i)
                cut = next(j for j, m in enumerate(tokens.mask[tokens.turns[i]:]) if m)
                written = policy.decode(policy.generate(segment[:cut], 0.0)).strip()
                exact += written == traj.transitions[i].action
                seen += 1
                if seen >= args.turns:
                    break
            if seen >= args.turns:
                break
        print(json.dumps({"lora_r": lora, **{k: result[k] for k in (
            "device", "bf16", "steps", "turns", "first_loss", "last_loss", "seconds")},
            "steps_per_s": round(result["steps"] / result["seconds"], 2),
            "demo_turns_written_back": f"{exact}/{seen}",
            "check_seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
