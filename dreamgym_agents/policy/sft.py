"""Policy warm start: SFT on successful offline episodes (TRL SFTTrainer).

Each turn of a successful episode becomes one example in the policy's own layout
(:mod:`dreamgym_agents.policy.model`): the environment's segment carries no loss, the action
tokens (and the end token) carry it, so the warm-started policy sees turns exactly as the GRPO
rollouts and the evaluation present them. An invalid step inside a successful episode (a detour the
environment refused) is not imitated, nor is a noisy oracle's random step (its recovery from the
detour is).

Starts from any local transformers causal-LM checkpoint (optionally with LoRA adapters, merged
into the saved checkpoint), or from scratch: a byte-level BPE tokenizer trained on the episodes'
text and a small Qwen2 (the embedded default policy).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreamgym_agents import launch
from dreamgym_agents.episodes.agent import EXPLORATION
from dreamgym_agents.episodes.env import ActionSet, TaskFamily
from dreamgym_agents.errors import ConfigError, MissingExtraError
from dreamgym_agents.policy.model import (
    ASSISTANT,
    USER,
    PolicyConfig,
    PolicyModel,
    PolicyView,
    episode_tokens,
    render_segment,
    turn_format,
)
from dreamgym_agents.types import Trajectory

logger = logging.getLogger(__name__)


@dataclass
class PolicySFTConfig:
    """Settings of the policy's warm start.

    Attributes:
        output_dir: Where the checkpoint is saved (loadable as a policy or ``hf/<dir>``).
        base_model: A local causal-LM checkpoint to start from; None trains from scratch.
        lora_r: LoRA rank for a ``base_model`` (0: every weight is trained); the adapters are
            merged into the saved checkpoint.
        vocab_size: Tokenizer size when training from scratch.
        hidden_size: Model width when training from scratch.
        num_layers: Transformer layers when training from scratch.
        max_length: Longest turn in tokens (longer ones are dropped, and counted); also the
            from-scratch model's context.
        epochs: Passes over the turns (unless ``max_steps`` is set).
        max_steps: Optimisation steps, whatever the data's size.
        batch_size: Turns per step.
        learning_rate: Peak learning rate (from scratch ~2e-3, fine-tuning ~5e-5, LoRA ~2e-4).
        entity_swaps: Variants of each successful episode with its task's entities swapped for
            others (:func:`swap_entities`); 0: the episodes as recorded.
        novel_swaps: Share of swapped entities given an invented value instead of another
            task's (:func:`novel_value`), so that copying is the only way to write them.
        env_loss_weight: Weight of the environment's tokens (the pages) in the loss, as a
            share of the actions' (the loss is the actions' mean plus this times the pages'
            mean): predicting pages teaches a small model the site's text and, above all,
            to copy (a search query recurs in the URL, the title and the heading), which the
            actions need (a product's name copied from the task into a search). 0: actions only.
        time_budget_s: Wall-time cap: training stops there, and the result says it is
            ``partial`` (the schedule stays the steps'; a partial warm start is never cached).
        checkpoint_every: Save a resumable checkpoint every this many steps (0: none); a rerun
            into the same ``output_dir`` resumes from the newest one.
        seed: Seed of initialisation and data order.
        bf16: bfloat16 autocast (None: where the training device computes it natively).
    """

    output_dir: str = ""
    base_model: str | None = None
    lora_r: int = 0
    vocab_size: int = 4000
    hidden_size: int = 192
    num_layers: int = 4
    max_length: int = 1024
    epochs: float = 20.0
    max_steps: int | None = 300
    batch_size: int = 16
    learning_rate: float = 2e-3
    entity_swaps: int = 4
    novel_swaps: float = 1.0
    env_loss_weight: float = 1.0
    time_budget_s: float | None = None
    checkpoint_every: int = 0
    seed: int = 0
    bf16: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ConfigError(f"sft.checkpoint_every must be >= 0 (0: none), got "
                              f"{self.checkpoint_every}")
        if self.epochs <= 0 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ConfigError("sft.epochs, sft.batch_size and sft.learning_rate must be positive")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"sft.max_steps must be at least 1, got {self.max_steps}")
        if self.entity_swaps < 0:
            raise ConfigError(f"sft.entity_swaps must be >= 0, got {self.entity_swaps}")
        if not 0 <= self.novel_swaps <= 1:
            raise ConfigError(f"sft.novel_swaps must be in [0, 1], got {self.novel_swaps}")
        if self.env_loss_weight < 0:
            raise ConfigError(f"sft.env_loss_weight must be >= 0, got {self.env_loss_weight}")
        if self.lora_r < 0:
            raise ConfigError(f"sft.lora_r must be >= 0 (0: no LoRA), got {self.lora_r}")
        if self.base_model is not None and not Path(self.base_model).is_dir():
            raise ConfigError(f"sft.base_model not found: {self.base_model} (a local "
                              "checkpoint directory)")


LORA_NEEDS_A_BASE = ("sft.lora_r needs a checkpoint to adapt (--policy hf/<checkpoint>, "
                     "sft.base_model, or the embedded policy started from the experience "
                     "model): a policy trained from scratch trains every weight")


def successful(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The episodes the warm start imitates: successful ones with at least one step."""
    return [t for t in trajectories if t.success and t.transitions]


def sft_rows(policy: PolicyModel, trajectories: list[Trajectory], max_length: int,
             env_weight: float = 0.0) -> tuple[list[dict[str, list]], int]:
    """Tokenized examples (``input_ids``, ``labels``, ``token_weights``) of the successful
    episodes, one per valid turn (the policy conditions on its turn only), and how many turns
    were longer than ``max_length`` and dropped. The loss is the actions' mean plus
    ``env_weight`` times the pages' mean (0: pages not trained)."""
    rows, dropped = [], 0
    for traj in successful(trajectories):
        tokens = episode_tokens(policy, traj.task, traj.transitions)
        for i, t in enumerate(traj.transitions):
            if not t.valid or t.reasoning.startswith(EXPLORATION):
                continue  # a refused or random detour stays in the episode, but is not imitated
            start = tokens.turns[i]
            end = tokens.turns[i + 1] if i + 1 < len(tokens.turns) else len(tokens.ids)
            ids, mask = tokens.ids[start:end], tokens.mask[start:end]
            if len(ids) > max_length:
                dropped += 1
                continue
            # The pages' tokens share ``env_weight`` of an action token's weight per action
            # token: a turn's page has tens of times its action's tokens, and at equal weights
            # the pages would drown the actions.
            acted, shown = sum(mask), len(mask) - sum(mask) - 1
            per_page_token = env_weight * acted / max(shown, 1)
            weights = [1.0 if m else per_page_token for m in mask]
            weights[0] = 0.0  # the turn's first token has no context in the turn
            rows.append({"input_ids": ids,
                         "labels": [x if w else -100 for x, w in zip(ids, weights, strict=True)],
                         "token_weights": weights})
    return rows, dropped


def swap_entities(trajectories: list[Trajectory], copies: int,
                  seed: int = 0, novel: float = 0.0,
                  action_set: ActionSet | None = None) -> list[Trajectory]:
    """``copies`` variants of each episode whose task names an entity that the episode copies, with
    that entity replaced by another value of the same parameter everywhere it appears: the task,
    every page and every action. An entity is a task parameter of at least 5 characters with a
    letter that a page or an action shows (a product, an email, a category …). The pages stay
    consistent (a product's page shows its new name where it showed the old one); what changes is
    *which* string the policy must copy, so a small model trained on few episodes learns to copy
    from the task instead of memorising the training tasks' strings.

    With probability ``novel`` the new value is made up (:func:`novel_value`: each word of the
    old one replaced by an invented word of its length and case) rather than another task's:
    other tasks' values are a closed set a model can learn to pick from by partial cues (a
    warm start then writes a *training* product's name for a test product); a name never seen
    elsewhere can only be copied.

    ``action_set`` (the episodes' family's) reads the texts their actions type: an entity
    typed in parts is not swapped (without one, every action is taken as typing nothing).
    """
    import random
    from dataclasses import replace

    rng = random.Random(seed)
    values: dict[str, list[str]] = {}
    for traj in trajectories:
        for key, value in traj.task.params.items():
            if _entity(value) and value not in values.setdefault(key, []):
                values[key].append(value)
    out: list[Trajectory] = []
    for traj in trajectories:
        seen = "\n".join(f"{t.state}\n{t.action}" for t in traj.transitions)
        # only strings the episode copies (on a page or in an action): a word of the task
        # alone ("cheapest") decides what to do, and swapping it would teach the wrong thing
        names = {k: v for k, v in traj.task.params.items()
                 if _entity(v) and len(values[k]) > 1 and v in seen}
        if not names or any(text != v and text in v for text in typed_texts(traj, action_set)
                            for v in names.values()):
            continue  # an entity typed in parts (an address over four fields) cannot be swapped
        for n in range(copies):
            swap = {v: novel_value(v, rng) if rng.random() < novel
                    else rng.choice([o for o in values[k] if o != v]) for k, v in names.items()}

            def sub(text: str, swap: dict[str, str] = swap) -> str:
                for old, new in swap.items():
                    text = text.replace(old, new)
                return text

            params = {k: sub(v) for k, v in traj.task.params.items()}
            task = replace(traj.task, task_id=f"{traj.task.task_id}~swap{n}",
                           intent=sub(traj.task.intent), params=params)
            steps = [replace(t, state=sub(t.state), next_state=sub(t.next_state),
                             action=sub(t.action), episode_id=f"{t.episode_id}~swap{n}")
                     for t in traj.transitions]
            out.append(replace(traj, episode_id=f"{traj.episode_id}~swap{n}", task=task,
                               transitions=steps))
    return out


_WORD = re.compile(r"[A-Za-z]+")
_CONSONANTS, _VOWELS = "bcdfghklmnprstvwz", "aeiou"


def novel_value(value: str, rng: Any) -> str:
    """``value`` with every word replaced by an invented one of the same length and case
    (``Ergonix Harbor Chair, 10 ft`` → ``Dovemil Kusapo Tibel, 10 vu``); digits and punctuation
    stay, so an email stays an email and a size a size."""
    def word(m: re.Match[str]) -> str:
        old = m.group(0)
        new = "".join(rng.choice(_VOWELS if i % 2 else _CONSONANTS) for i in range(len(old)))
        if old.isupper() and len(old) > 1:
            return new.upper()
        return new.capitalize() if old[0].isupper() else new
    return _WORD.sub(word, value)


def typed_texts(traj: Trajectory, action_set: ActionSet | None) -> list[str]:
    """The texts the episode's actions type into fields (its family's actions' ``typed``,
    parsed by the family's ``action_set``; none without one)."""
    if action_set is None:
        return []
    out = []
    for t in traj.transitions:
        try:
            actions = action_set.parse(t.action)
        except ValueError:
            continue  # an invalid step types nothing
        out += [text for a in actions if (text := getattr(a, "typed", None))]
    return out


def _entity(value: str) -> bool:
    return len(value) >= 5 and any(c.isalpha() for c in value)


def corpus(trajectories: list[Trajectory], policy_cfg: PolicyConfig,
           view: PolicyView | None = None) -> list[str]:
    """Texts a from-scratch tokenizer learns its merges from: every turn (as ``view`` shows
    it) and action seen."""
    texts = []
    for traj in trajectories:
        for t in traj.transitions:
            texts.append(render_segment(traj.task, t.state, cfg=policy_cfg, view=view))
            texts.append(t.action)
    return texts


def train_policy_sft(trajectories: list[Trajectory], cfg: PolicySFTConfig,
                     policy_cfg: PolicyConfig | None = None, *,
                     family: TaskFamily | None = None,
                     on_step: Callable[..., None] | None = None) -> dict[str, Any]:
    """Warm-start a policy on the successful episodes among ``trajectories``; save it to
    ``cfg.output_dir``; return what was done (examples, steps, losses, seconds).

    ``family`` (the episodes', resolved by the caller) shows the policy its states
    (``policy_view``) and reads what its actions type (``action_set``, for the entity swaps);
    without one, states are plain text.

    Raises:
        ConfigError: No successful episode to learn from.
    """
    from dreamgym_agents.experience.sft import fit_weighted, starting_model

    policy_cfg = policy_cfg or PolicyConfig()
    wins = successful(trajectories)
    if not cfg.output_dir:
        raise ConfigError("sft.output_dir: say where the policy is saved")
    if not wins:
        raise ConfigError("no successful episode to warm-start the policy from: collect "
                          "offline data with successes (e.g. dg-agents collect --agents oracle)")
    if cfg.lora_r and cfg.base_model is None:
        raise ConfigError(LORA_NEEDS_A_BASE)
    start = time.perf_counter()
    out = Path(cfg.output_dir)
    view = family.policy_view() if family is not None else None
    tokenizer, model = starting_model(cfg, out, lambda: corpus(trajectories, policy_cfg, view))
    _add_turn_tokens(tokenizer, model, turn_format(tokenizer, policy_cfg.turn_format))
    if cfg.lora_r:
        model = with_lora(model, cfg.lora_r)
    policy = PolicyModel(model, tokenizer, policy_cfg, view=view)
    action_set = family.action_set() if family is not None else None
    examples = wins + swap_entities(wins, cfg.entity_swaps, cfg.seed, cfg.novel_swaps,
                                    action_set)
    rows, cut = sft_rows(policy, examples, cfg.max_length, cfg.env_loss_weight)
    if not rows:
        raise ConfigError(f"no turn of a successful episode fits sft.max_length="
                          f"{cfg.max_length} tokens")
    logger.info("policy SFT on %d turns of %d successful episodes (%d longer than %d tokens "
                "dropped)", len(rows), len(wins), cut, cfg.max_length)
    result = fit_weighted(model, tokenizer, rows, cfg, out=out, start=start, on_step=on_step)
    trained = result.model
    if cfg.lora_r:
        trained = trained.merge_and_unload()
    if launch.is_main():
        trained.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        policy.save_settings(out)
    return {"path": str(out), "episodes": len(wins), "swapped_episodes": len(examples) - len(wins),
            "turns": len(rows), "dropped_too_long": cut,
            "steps": result.steps,
            "first_loss": result.first_loss, "last_loss": result.last_loss,
            "seconds": round(time.perf_counter() - start, 1), "bf16": result.bf16,
            "device": result.device,
            "from_scratch": cfg.base_model is None, "lora_r": cfg.lora_r,
            "planned_steps": result.planned_steps, "partial": result.partial,
            "resumed_from_step": result.resumed_from_step}


def _add_turn_tokens(tokenizer: Any, model: Any, layout: str) -> None:
    """Give a checkpoint a pad token and, in the compact layout, the policy's turn markers if
    it lacks them (a chat model in the chat layout keeps its vocabulary)."""
    missing = [t for t in (USER, ASSISTANT) if t not in tokenizer.get_vocab()]
    if missing and layout == "compact":
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))


def with_lora(model: Any, rank: int) -> Any:
    """``model`` with LoRA adapters of ``rank`` on every linear layer (alpha 2r, no dropout):
    the one LoRA setup of the policy's SFT and GRPO."""
    try:
        import peft
    except ImportError:
        raise MissingExtraError("peft", "train") from None
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                             target_modules="all-linear", task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)
