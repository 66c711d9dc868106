"""Multi-turn PPO on GRPO's rollout path: a critic head on the policy's backbone, turn-level GAE.

``algorithm: ppo`` on an RL stage (:class:`~.grpo.GRPOStageConfig`) plays the same rollouts as
GRPO, with the same :class:`~dreamgym_agents.episodes.graph.EnvPool` (dream or real), budget,
validation rule and records, and trains through the same TRL trainer, whose loss takes
per-token advantages of shape (batch, tokens): this module writes only what TRL lacks.

- **The critic**: a scalar head (float32) on the policy's last hidden state, read at the
  context's last token before each turn's first action token: the state after the turn's
  observation, before its action (:func:`~.grpo.turn_logps` with ``value_head``). It starts at
  0.5 (a sigmoid: returns are outcomes in [0, 1]) and has its own learning rate; by default its
  loss does not reach the policy's body (``shared_backbone``), and the first
  ``critic_warmup`` batches train it alone, the policy held still. For larger models the
  critic can have a network of its own, at the cost of a second forward pass: ``critic:
  separate``, a copy of the starting policy, or ``lora``, that copy frozen with the critic's own
  adapters.
- **Advantages**: GAE over each episode's turns (:func:`~.advantages.turn_gae`), the outcome
  as the last turn's reward. An episode the step limit cut ends with its 0 where that limit is
  the task's own (``truncation: terminal``, the default), or is bootstrapped from the critic's
  value of the state its last action led to where the RL limit is shorter than the task's
  (``bootstrap``). Each turn's advantage goes on its action
  tokens, the environment's are masked; in reward units by default (``normalize_advantages``
  scales them by their spread over the batch's turns, never centring them).
- **Losses**: TRL's clipped surrogate and its KL to the reference (its own term, not folded
  into the reward), plus ``vf_coef`` × the clipped value loss at each turn's first action token.
- The head is saved beside the policy (``value_head.safetensors``) and read back when a stage
  starts from a checkpoint that has one (S2R after dream PPO), and ``policy.json`` says
  ``"algorithm": "ppo"``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.rl.advantages import action_runs, turn_gae

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_DIR = "critic"
"""A separate critic's backbone, beside the policy it was trained with (``critic: separate``
or ``lora``; its head is :data:`VALUE_HEAD_FILE`)."""
ALGORITHMS = ("grpo", "ppo")
CRITICS = ("head", "separate", "lora")


TRUNCATIONS = ("terminal", "bootstrap")
"""What a cut episode is worth after its last turn (:attr:`PPOSettings.truncation`)."""


@dataclass
class PPOSettings:
    """PPO's own settings (``--set dream.ppo.<name>=…``; the rest is the stage's).

    Attributes:
        gamma: Discount per turn.
        lam: GAE's λ (1 with γ 1: the return minus the critic's value, the common default).
        vf_coef: Weight of the value loss beside the policy's.
        value_lr: The critic head's learning rate (~10× the policy's: it starts from nothing).
        value_clip: Clip range of the value update, in return units (rewards are 0 or 1).
        critic_warmup: Batches at the stage's start in which only the critic learns.
        normalize_advantages: Divide the batch's advantages by their standard deviation over
            its turns. Off by default: with outcomes of 0 or 1, a batch that all won (or all
            lost) has advantages near 0 whose spread is the critic's noise, and dividing by it
            blows that noise up (the toy task of ``tests/test_ppo.py`` collapsed with it).
        shared_backbone: The value loss trains the policy's body too (one network, as
            CleanRL's Atari PPO); False (the default): the critic is a head on the body's
            features, which only the policy's loss moves, so a critic still learning never
            pulls the policy (a shared backbone is reported to hurt early training).
        critic: What reads the states' values. ``head``, the default, is a head on the
            policy's own features: no second forward pass, no second model in memory.
            ``separate`` is a copy of the starting policy's network, all of it trained as the
            critic, as verl and OpenRLHF run it: its own forward pass, memory and features.
            ``lora`` is that copy frozen, with LoRA adapters of rank ``critic_lora_r`` as the
            critic's own weights: the second forward pass, but only the adapters' gradients
            and optimiser state. A separate critic is saved in
            ``critic/`` beside the policy (LoRA merged) and read back by the next stage.
        critic_lr: The learning rate of a separate critic's network (None: the policy's);
            its head keeps ``value_lr``.
        critic_lora_r: The rank of ``lora``'s adapters.
        truncation: What an episode the RL step limit cut is worth after its last turn.
            ``terminal``: nothing, its 0 ends it, as an evaluation with the same limit scores
            it; right when the stage's limit is the task's own, as in the presets of ALFWorld
            and τ² (15 and 15). ``bootstrap``: the critic's value of the state its last action
            led to, read as a next turn's would be; right when the RL limit is shorter than
            the task's, so a cut episode might still have won, as in the web's presets (RL
            episodes cut at 10 steps, evaluated at 15).
        target_kl: Stop moving the policy on a batch once the approximate KL between the
            policy and the one that played the batch (CleanRL's ``(r - 1) - log r`` over the
            action tokens) exceeds this, for the batch's remaining epochs (the critic goes
            on); None: never (each batch gets all its ``num_iterations``).
    """

    gamma: float = 1.0
    lam: float = 1.0
    vf_coef: float = 0.5
    value_lr: float = 2e-3
    value_clip: float = 0.2
    critic_warmup: int = 0
    normalize_advantages: bool = False
    shared_backbone: bool = False
    target_kl: float | None = None
    critic: str = "head"
    critic_lr: float | None = None
    critic_lora_r: int = 8
    truncation: str = "terminal"

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATIONS:
            raise ConfigError(f"ppo.truncation must be one of {', '.join(TRUNCATIONS)}, got "
                              f"{self.truncation!r}")
        if self.critic not in CRITICS:
            raise ConfigError(f"ppo.critic must be one of {', '.join(CRITICS)}, got "
                              f"{self.critic!r}")
        if (self.critic_lr is not None and self.critic_lr <= 0) or self.critic_lora_r < 1:
            raise ConfigError("ppo.critic_lr must be > 0 (or null: the policy's) and "
                              "ppo.critic_lora_r at least 1")
        if self.shared_backbone and self.critic != "head":
            raise ConfigError(f"ppo.shared_backbone: the {self.critic} critic has a backbone "
                              "of its own (shared_backbone is for critic: head)")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ConfigError(f"ppo.target_kl must be > 0 (or null: never), got "
                              f"{self.target_kl}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"ppo.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.vf_coef < 0 or self.value_lr <= 0 or self.value_clip <= 0:
            raise ConfigError("ppo.vf_coef must be >= 0, ppo.value_lr and ppo.value_clip > 0")
        if self.critic_warmup < 0:
            raise ConfigError(f"ppo.critic_warmup must be >= 0, got {self.critic_warmup}")


def value_head_for(model: Any, policy_path: str | Path) -> Any:
    """The critic head for ``model``: the one saved beside ``policy_path`` when it has one,
    else a new one (:func:`value_head_class`)."""
    from dreamgym_agents.experience.sft import body_and_head

    _, head = body_and_head(model)
    value_head = value_head_class()(head.in_features)
    saved = Path(policy_path) / VALUE_HEAD_FILE
    if saved.is_file():
        from safetensors.torch import load_file

        value_head.load_state_dict(load_file(str(saved)))
        logger.info("ppo: the critic starts from %s", saved)
    return value_head.to(next(model.parameters()).device)


def critic_body_for(policy_path: str | Path, settings: PPOSettings) -> Any:
    """A separate critic's network (None for ``critic: head``): the one saved beside
    ``policy_path`` (:data:`CRITIC_DIR`) when it has one, else a copy of that policy; for
    ``lora`` frozen, with the critic's adapters on it."""
    if settings.critic == "head":
        return None
    from dreamgym_agents.gateway.local import load_causal_lm

    saved = Path(policy_path) / CRITIC_DIR
    _, body = load_causal_lm(saved if saved.is_dir() else policy_path)
    logger.info("ppo: a %s critic from %s", settings.critic,
                saved if saved.is_dir() else f"a copy of {policy_path}")
    if settings.critic == "lora":
        from dreamgym_agents.policy.sft import with_lora

        for p in body.parameters():
            p.requires_grad_(False)
        body = with_lora(body, settings.critic_lora_r)
    body.train()
    return body


def save_critic_body(body: Any, target: str | Path) -> None:
    """A separate critic's network in ``target/critic`` (a LoRA critic's adapters merged into
    a copy)."""
    import copy

    if hasattr(body, "merge_and_unload"):
        body = copy.deepcopy(body).merge_and_unload()
    body.save_pretrained(str(Path(target) / CRITIC_DIR))


@functools.cache
def value_head_class() -> type:
    """PPO's critic head (a class made on first use: torch is imported lazily)."""
    import torch

    class ValueHead(torch.nn.Module):
        """The value of the policy's hidden state, an outcome's probability: a sigmoid of a
        linear function of the state read through a layer norm without weights. Returns here
        are outcomes in [0, 1]. An unbounded linear head overshoots them as the policy trains
        its features, every turn's advantage turns negative and the policy collapses; bounded
        and scale-free, this one stays below 1 (evidence:
        docs/history/results-2026-11-to-12.md). Starts at 0.5 for every state."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(width, elementwise_affine=False)
            self.linear = torch.nn.Linear(width, 1, dtype=torch.float32)
            torch.nn.init.zeros_(self.linear.weight)
            torch.nn.init.zeros_(self.linear.bias)

        def forward(self, hidden: Any) -> Any:
            return torch.sigmoid(self.linear(self.norm(hidden.float())))

    return ValueHead


def save_value_head(value_head: Any, target: str | Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in value_head.state_dict().items()},
              str(Path(target) / VALUE_HEAD_FILE))


def token_targets(values: Any, action: Any, outcomes: list[float],
                  settings: PPOSettings,
                  last_values: list[float | None] | None = None) -> dict[str, Any]:
    """Per-token PPO targets of a batch (tensors of shape (batch, tokens)).

    Args:
        values: The critic's values at each completion token (:func:`~.grpo.turn_logps`).
        action: 1 on the policy's action tokens, 0 on the environment's and on padding.
        outcomes: Each row's episode reward (the outcome; 0 for an episode the step limit cut).
        last_values: Each row's value of the state after its last turn where the step limit
            cut it and ``truncation`` is ``bootstrap`` (it stands in for what would have
            followed), None where the episode ended there (by the task, or cut and terminal).
        settings: γ and λ.

    Returns:
        ``advantages``, ``returns`` and ``old_values`` at each turn's first action token, and
        ``turn_start`` (1 there). ``advantages`` holds each turn's GAE advantage on its action
        tokens, divided by their standard deviation over the batch's turns with
        ``normalize_advantages``.
    """
    import torch

    advantages = torch.zeros_like(values)
    returns = torch.zeros_like(values)
    turn_start = torch.zeros_like(values)
    for b, reward in enumerate(outcomes):
        following = last_values[b] if last_values is not None else None
        runs = action_runs(action[b].tolist())
        if not runs:  # an episode kept out of the loss (an infrastructure failure)
            continue
        turn_values = [float(values[b, start]) for start, _ in runs]
        rewards = [0.0] * (len(runs) - 1) + [float(reward)]
        adv, ret = turn_gae(rewards, turn_values, gamma=settings.gamma, lam=settings.lam,
                            terminal=following is None,
                            last_value=0.0 if following is None else float(following))
        for (start, end), a, r in zip(runs, adv, ret, strict=True):
            advantages[b, start:end] = a
            returns[b, start] = r
            turn_start[b, start] = 1.0
    starts = turn_start.bool()
    if settings.normalize_advantages and starts.sum() > 1:
        # scaled, not centred: a turn whose advantage is 0 (one that changed nothing) is
        # pushed neither way, however many tokens the batch's other turns have
        advantages = advantages / (advantages[starts].std() + 1e-8)
    return {"advantages": advantages, "returns": returns, "turn_start": turn_start,
            "old_values": values * turn_start}


def value_loss(values: Any, old_values: Any, returns: Any, turn_start: Any,
               clip: float) -> Any:
    """PPO's clipped value loss, averaged over the turns (one term at each turn's first
    action token)."""
    import torch

    clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_turn = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return (per_turn * turn_start).sum() / turn_start.sum().clamp(min=1.0)


def ppo_trainer_class(base: type, *, value_head: Any, settings: PPOSettings,
                      outcomes: Any, num_iterations: int, score: Any,
                      critic_body: Any = None, cut_segments: Any = None,
                      pad_id: int = 0) -> type:
    """``base`` (the turn-level GRPO trainer) trained as PPO.

    Args:
        critic_body: A separate critic's network (:func:`critic_body_for`; None: the head
            reads the policy's features).
        score: Scores a batch's turns with the critic (:func:`~.grpo.turn_logps`, given here
            so that this module does not import the trainer's).
        value_head: The critic head (:func:`value_head_for`).
        settings: PPO's settings.
        cut_segments: Returns, per row of the last batch, the policy's segment of the state
            its last action led to where the step limit cut it and ``truncation`` is
            ``bootstrap`` (the critic's value of it bootstraps the row), else None.
        pad_id: The tokenizer's padding token (for those segments).
        outcomes: Returns the last batch's reward per row, in the rollout's
            order (:meth:`~.grpo.EpisodeRollout.outcomes`).
        num_iterations: Optimisation steps per batch (for the critic's warm-up in batches).
    """
    import torch

    class TurnPPOTrainer(base):  # type: ignore[misc, valid-type]
        """The turn-level trainer with a critic, GAE advantages and a value loss."""

        value_head_module = value_head

        def _get_per_token_logps_and_entropies(self, model: Any, input_ids: Any,
                                               attention_mask: Any, logits_to_keep: int,
                                               batch_size: int | None = None,
                                               compute_entropy: bool = False,
                                               compute_aux_loss: bool = False,
                                               **unused: Any) -> tuple[Any, Any, Any]:
            if model is getattr(self, "ref_model", None):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep,
                    compute_entropy=compute_entropy)
            logps, entropies, values = self.turn_scores(model, input_ids, attention_mask,
                                                        logits_to_keep, compute_entropy)
            self._values, self._logps = values, logps
            return logps, entropies, None

        def turn_scores(self, model: Any, input_ids: Any, attention_mask: Any,
                        logits_to_keep: int, compute_entropy: bool = False) -> tuple[Any, ...]:
            device = input_ids.device
            for part in (value_head, critic_body):  # beside the batch (once: before any step)
                if part is not None and next(part.parameters()).device != device:
                    part.to(device)
            if critic_body is not None:  # its own forward pass, its own features
                logps, entropies = score(model, input_ids, attention_mask, logits_to_keep,
                                         temperature=self.temperature,
                                         compute_entropy=compute_entropy, **self.turn_args)
                _, _, values = score(critic_body, input_ids, attention_mask, logits_to_keep,
                                     temperature=self.temperature, value_head=value_head,
                                     **self.turn_args)
                return logps, entropies, values

            def critic(hidden: Any) -> Any:  # the body's features, detached unless shared
                return value_head(hidden if getattr(self, "_train_body", False)
                                  else hidden.detach())

            return score(model, input_ids, attention_mask, logits_to_keep,
                         temperature=self.temperature, compute_entropy=compute_entropy,
                         value_head=critic, **self.turn_args)

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            width = out["completion_ids"].shape[1]
            with torch.no_grad():
                _, _, values = self.turn_scores(self.model, ids, mask, width)
            action = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out \
                else out["completion_mask"]
            segments = cut_segments() if cut_segments is not None else None
            following = self.segment_values(segments, ids.device) if segments else None
            targets = token_targets(values, action, outcomes(), settings, following)
            out["advantages"] = targets["advantages"]
            for key in ("returns", "turn_start", "old_values"):
                out[f"ppo_{key}"] = targets[key]
            starts = targets["turn_start"].bool()
            if starts.any():
                metrics = self._metrics["train"]
                metrics["ppo/value_mean"].append(float(values[starts].mean()))
                metrics["ppo/return_mean"].append(float(targets["returns"][starts].mean()))
                if segments:
                    metrics["ppo/bootstrapped"].append(float(sum(v is not None
                                                                 for v in following or [])))
            return out

        def segment_values(self, segments: list[list[int] | None],
                           device: Any) -> list[float | None]:
            """The critic's value of each segment (None stays None), read at its last token,
            as a turn's value is read before its first action token."""
            from dreamgym_agents.experience.sft import last_hidden

            rows = {i: seg for i, seg in enumerate(segments) if seg}
            found: list[float | None] = [None] * len(segments)
            if not rows:
                return found
            width = max(len(seg) for seg in rows.values())
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for n, seg in enumerate(rows.values()):
                ids[n, :len(seg)] = torch.tensor(seg, dtype=torch.long)
                mask[n, :len(seg)] = 1
            ids, mask = ids.to(device), mask.to(device)
            body = critic_body if critic_body is not None else self.model
            with torch.no_grad():
                hidden = last_hidden(body, ids, mask)
                ends = mask.sum(dim=1) - 1
                last = hidden[torch.arange(len(rows), device=device), ends].float()
                values = value_head(last).squeeze(-1).float().tolist()
            for i, v in zip(rows, values, strict=True):
                found[i] = float(v)
            return found

        def _compute_loss(self, model: Any, inputs: Any) -> Any:
            self._values = self._logps = None
            step = self.state.global_step
            warming = step < settings.critic_warmup * num_iterations
            self._train_body = settings.shared_backbone and not warming
            loss = super()._compute_loss(model, inputs)
            self._train_body = False
            held = warming or self.kl_stopped(step, inputs)
            if held:
                loss = loss * 0.0  # the critic learns alone: the policy is held still
                if model.training:  # and no step of the optimiser's momentum moves it
                    self.optimizer.param_groups[0]["lr"] = 0.0
            assert self._values is not None, "the policy's forward pass read no values"
            v_loss = value_loss(self._values, inputs["ppo_old_values"], inputs["ppo_returns"],
                                inputs["ppo_turn_start"], settings.value_clip)
            self._metrics["train"]["ppo/value_loss"].append(float(v_loss.detach()))
            scale = self.current_gradient_accumulation_steps if model.training else 1.0
            return loss + settings.vf_coef * v_loss / scale

        def kl_stopped(self, step: int, inputs: Any) -> bool:
            """Whether the policy is held for the rest of this step's batch: its approximate
            KL to the policy that played the batch passed ``target_kl`` (logged as
            ``ppo/approx_kl``; each stop counted in ``ppo/kl_stops``)."""
            batch = step // num_iterations
            if getattr(self, "_kl_stopped_batch", None) == batch:
                return True
            old = inputs.get("old_per_token_logps")
            if settings.target_kl is None or old is None or self._logps is None:
                return False
            mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs \
                else inputs["completion_mask"]
            log_ratio = (self._logps.detach() - old) * mask
            approx_kl = float(((log_ratio.exp() - 1) - log_ratio).sum() / mask.sum().clamp(min=1))
            self._metrics["train"]["ppo/approx_kl"].append(approx_kl)
            if approx_kl <= settings.target_kl:
                return False
            self._kl_stopped_batch = batch
            self._metrics["train"]["ppo/kl_stops"].append(1.0)
            logger.info("ppo: batch %d: approximate KL %.4f > target %.4f at epoch %d: the "
                        "policy is held for its remaining epochs", batch + 1, approx_kl,
                        settings.target_kl, step % num_iterations + 1)
            return True

        def create_optimizer(self, *args: Any, **kwargs: Any) -> Any:
            if self.optimizer is None:
                a = self.args
                self.optimizer = torch.optim.AdamW(
                    [{"params": [p for p in self.model.parameters() if p.requires_grad],
                      "lr": a.learning_rate, "weight_decay": a.weight_decay},
                     {"params": list(value_head.parameters()), "lr": settings.value_lr,
                      "weight_decay": 0.0},
                     *([{"params": [p for p in critic_body.parameters() if p.requires_grad],
                         "lr": settings.critic_lr or a.learning_rate,
                         "weight_decay": a.weight_decay}] if critic_body is not None else [])],
                    betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_epsilon)
            return self.optimizer

    return TurnPPOTrainer


def check_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {name!r}")
