"""Multi-turn GRPO (TRL's GRPOTrainer with a ``rollout_func``) in the dream or on a real site.

Each optimisation step draws ``tasks_per_step`` tasks (the curriculum may swap a share λ of them
for synthetic variants, dream only), plays ``num_generations`` whole episodes of each through the
episode graph (:func:`~dreamgym_agents.episodes.graph.play_episodes`) with the policy sampling at
``temperature``, and hands TRL one sequence per episode: the first turn's environment segment as
the prompt, every later token as the completion, with ``env_mask`` 0 on the environment's tokens
so only the policy's action tokens are trained. The reward is the episode's outcome (1 for
success, else 0); advantages are normalised within each task's group; the KL term keeps the policy
near the warm start (``beta``). The environment is whatever the
:class:`~dreamgym_agents.episodes.graph.EnvPool` makes — dream or real, one code path.

The policy is turn-level (:mod:`dreamgym_agents.policy.model`): :class:`TurnGRPOTrainer` scores each
turn from its own ``<|user|>`` token, exactly the context the action was sampled in.

Episodes that end in an infrastructure failure or an experience-model failure are kept out of the
loss (their tokens are masked, their reward set to their group's mean) and counted. Every rollout
is appended to ``rollouts.jsonl`` and every logged figure to ``metrics.jsonl`` in the output folder.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import logging
import math
import os
import pickle
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dreamgym_agents import tracking
from dreamgym_agents.episodes.graph import EnvPool, play_episodes
from dreamgym_agents.errors import ConfigError, DreamGymError, MissingExtraError
from dreamgym_agents.experience.sft import body_and_head, last_hidden
from dreamgym_agents.policy.model import (
    ASSISTANT,
    USER,
    PolicyAgent,
    PolicyConfig,
    PolicyModel,
    PolicyView,
    error_seen,
    save_policy_settings,
    turn_format,
    written_actions,
)
from dreamgym_agents.policy.sft import with_lora
from dreamgym_agents.rl.curriculum import Curriculum
from dreamgym_agents.rl.ppo import (
    CRITIC_DIR,
    PPOSettings,
    check_algorithm,
    critic_body_for,
    ppo_trainer_class,
    save_critic_body,
    save_value_head,
    value_head_for,
)
from dreamgym_agents.types import Task, Trajectory, append_trajectory

logger = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"
METRICS_FILE = "metrics.jsonl"
RESUME_STATE = "dreamgym_resume.json"
"""In a trainer checkpoint of a stage (``<stage>/trainer/checkpoint-<step>/``): what else the
stage needs to go on from it; written last, so a checkpoint without it is not a resume point."""
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
VLLM_MODES = ("server", "colocate")


@dataclass
class GRPOStageConfig:
    """One GRPO stage (dream RL, real RL or sim-to-real).

    Attributes:
        num_generations: Rollouts per task (the group advantages are normalised over).
        tasks_per_step: Tasks (groups) per optimisation step.
        max_steps: Batches of rollouts (each gives ``num_iterations`` optimisation steps).
        num_iterations: Optimisation steps on each batch of rollouts (GRPO's μ; above 1 the
            later steps are PPO-clipped against the rollout policy's log-probabilities): a
            rollout costs far more than a gradient step (an experience-model or browser step
            per turn), so reusing it is cheap.
        max_episode_steps: Episode length limit of a rollout.
        temperature: Sampling temperature of the rollouts (and of the trained log-probs).
        learning_rate: Learning rate, constant from the first step. A warmup would give the
            first step a rate of 0, and a one-batch stage, such as sim-to-real on a small
            budget, would not learn at all.
        beta: KL coefficient to the warm-start policy (0: no reference model).
        loss_type: How the token losses are normalised (TRL's ``loss_type``): ``dapo`` (the
            default: by the number of action tokens in the whole accumulated batch, no length
            bias), ``grpo`` (each episode by its own length, then averaged: favours short
            successful and long failed episodes), ``dr_grpo`` (by a constant), ``bnpo`` (by
            the action tokens of the micro-batch).
        epsilon: PPO-style clipping range of the ratio.
        micro_batch: Episodes per forward/backward pass (gradient accumulation makes the step).
        real_transition_budget: Real transitions the stage may take (None: no cap): never
            exceeded — the episodes running when it is spent are cut and kept out of the loss,
            and training stops after that step.
        time_budget_s: Stop after this many seconds (None: no cap).
        concurrency: Episodes played at once (dream: experience-model calls batched together;
            real: browsers).
        seed: Seed of task order and sampling.
        bf16: bfloat16 autocast of the scoring passes (None: where the training device
            computes it natively).
        gradient_checkpointing: Recompute the activations in the backward pass, trading a
            third more forward work for memory (TRL's default is on). None: on a GPU only; a
            CPU has the memory to spare for these models.
        lora_r: LoRA rank (0: every weight is trained): only the adapters learn, the
            reference of the KL term is the adapters switched off, and they are merged into the
            saved checkpoint.
        use_vllm: The rollouts' actions sampled by vLLM through TRL (``use_vllm``; TRL copies
            the trained weights into vLLM before each batch) instead of the trainer's model:
            a GPU and ``pip install vllm``. vLLM samples whole actions without the family's
            grammar, so the policy's ``constrained_decoding`` must be off.
        vllm_mode: ``server`` (a ``trl vllm-serve --model CHECKPOINT`` process on other GPUs,
            at ``vllm_server_base_url``) or ``colocate`` (vLLM inside the training process,
            sharing its GPU).
        vllm_server_base_url: The server's address in ``server`` mode (None: TRL's default,
            ``http://localhost:8000``).
        vllm_gpu_memory_utilization: The share of the GPU vLLM takes in ``colocate`` mode.
        validate_every: Play the policy on the validation split before the first batch and
            every this many batches (greedy, real episodes, counted apart from the stage's
            training transitions) and end the stage with the policy that did best there (the
            earliest of the best: the starting policy if no batch beat it); 0: off, the
            stage's last weights are its result.
        validate_limit: Validation tasks played each time (spread over the split; None: all).
        validate_patience: End the stage after this many validations in a row below the best
            (0: play every batch).
        algorithm: ``grpo`` (group-normalised outcome advantages) or ``ppo`` (a critic head
            and turn-level GAE: :mod:`.ppo`, its settings under ``ppo``).
        ppo: PPO's settings (:class:`~.ppo.PPOSettings`), read when ``algorithm`` is ``ppo``.
        keep_at: Keep a copy of the policy after each of these batches, in
            ``<stage>/kept/batch-<n>/``, with the stage's episodes and seconds so far in
            ``kept/kept.jsonl``: the points of a scaling curve
            (``benchmarks/dream_scaling.py``); the stage's result stays its own rule's.
        resume_every: Keep a resume point every this many batches, so that a stage killed
            mid-way goes on from its last point when it is started again on the same folder
            (``train_grpo``'s ``resumable``; the pipeline's dream stages); 0: never. A resume
            point, in ``<stage>/trainer/``, holds the weights, the optimiser, the random state,
            the rollouts' counters, the curriculum and the stop rule; it is removed when the
            stage ends.
    """

    num_generations: int = 4
    tasks_per_step: int = 4
    max_steps: int = 20
    num_iterations: int = 1
    max_episode_steps: int = 8
    temperature: float = 1.0
    learning_rate: float = 1e-4
    beta: float = 0.04
    loss_type: str = "dapo"
    epsilon: float = 0.2
    micro_batch: int = 4
    real_transition_budget: int | None = None
    time_budget_s: float | None = None
    concurrency: int = 16
    seed: int = 0
    bf16: bool | None = None
    gradient_checkpointing: bool | None = None
    lora_r: int = 0
    use_vllm: bool = False
    vllm_mode: str = "server"
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = 0.3
    validate_every: int = 0
    validate_limit: int | None = None
    validate_patience: int = 0
    keep_at: list[int] = field(default_factory=list)
    algorithm: str = "grpo"
    ppo: PPOSettings = field(default_factory=PPOSettings)
    resume_every: int = 4

    def __post_init__(self) -> None:
        for name in ("validate_every", "validate_patience", "resume_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0: off), got {getattr(self, name)}")
        check_algorithm(self.algorithm)
        if any(int(b) < 1 for b in self.keep_at):
            raise ConfigError(f"keep_at lists batches, each at least 1, got {self.keep_at}")
        if self.validate_limit is not None and self.validate_limit < 1:
            raise ConfigError(f"validate_limit must be at least 1 task (None: the whole "
                              f"validation split), got {self.validate_limit}")
        if self.vllm_mode not in VLLM_MODES:
            raise ConfigError(f"vllm_mode must be one of {', '.join(VLLM_MODES)}, got "
                              f"{self.vllm_mode!r}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(f"vllm_gpu_memory_utilization is a share of the GPU in (0, 1], got "
                              f"{self.vllm_gpu_memory_utilization}")
        if self.lora_r < 0:
            raise ConfigError(f"lora_r must be >= 0 (0: no LoRA), got {self.lora_r}")
        if self.num_generations < 2:
            raise ConfigError(f"num_generations must be at least 2 (GRPO compares rollouts of "
                              f"one task), got {self.num_generations}")
        for name in ("tasks_per_step", "max_steps", "num_iterations", "max_episode_steps",
                     "micro_batch", "concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if (self.tasks_per_step * self.num_generations) % self.micro_batch:
            raise ConfigError(f"micro_batch ({self.micro_batch}) must divide tasks_per_step × "
                              f"num_generations ({self.tasks_per_step * self.num_generations})")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be positive for RL rollouts, got "
                              f"{self.temperature}")
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got "
                              f"{self.loss_type!r}")
        if self.learning_rate <= 0 or self.beta < 0 or self.epsilon <= 0:
            raise ConfigError("learning_rate and epsilon must be positive, beta >= 0")
        if self.real_transition_budget is not None and self.real_transition_budget < 1:
            raise ConfigError(f"real_transition_budget must be at least 1, got "
                              f"{self.real_transition_budget}")

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.num_generations


@dataclass
class RolloutCounters:
    """What the rollouts of a stage used and found (``rollout/*`` metrics)."""

    episodes: int = 0
    successes: int = 0
    real_transitions: int = 0
    synthetic_transitions: int = 0
    invalid_actions: int = 0
    masked_episodes: int = 0
    em_failures: int = 0
    batches: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


class BudgetSpent(DreamGymError):
    """A real step was refused: the stage's real-transition budget is spent (the episode is
    cut and kept out of the loss)."""


class TransitionBudget:
    """Real transitions a stage may still take, shared by its environments (thread-safe): a
    budget is never overrun, however many episodes run at once."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.total:
                return False
            self.used += 1
            return True

    @property
    def spent(self) -> bool:
        return self.used >= self.total


class _BudgetedEnv:
    """An environment whose real steps draw on a :class:`TransitionBudget`."""

    def __init__(self, env: Any, budget: TransitionBudget) -> None:
        self.env = env
        self.budget = budget
        self.provenance = getattr(env, "provenance", "real")
        self.action_set = getattr(env, "action_set", None)

    def reset(self, task: Task) -> Any:
        return self.env.reset(task)

    def step(self, action: str) -> Any:
        if self.provenance == "real" and not self.budget.take():
            raise BudgetSpent(f"the real-transition budget of {self.budget.total} is spent")
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


class _BudgetedPool:
    """An :class:`EnvPool` whose environments draw on one budget."""

    def __init__(self, pool: EnvPool, budget: TransitionBudget) -> None:
        self.pool = pool
        self.budget = budget
        self.size = pool.size
        self._wrapped: dict[int, _BudgetedEnv] = {}

    async def acquire(self) -> Any:
        env = await self.pool.acquire()
        return self._wrapped.setdefault(id(env), _BudgetedEnv(env, self.budget))

    def release(self, env: Any) -> None:
        self.pool.release(env.env)

    def close(self) -> None:
        self.pool.close()


def _em_failure(traj: Trajectory) -> bool:
    return any(t.info.get("em_failure") for t in traj.transitions)


EpisodeSink = Callable[[list[Trajectory]], None]
"""Takes each batch's finished episodes after they are recorded (the run's replay buffer
learns from them: :mod:`dreamgym_agents.pipeline.run`); it may block (a refresh of the
experience model between batches)."""


class EpisodeRollout:
    """TRL's ``rollout_func``: whole episodes through the episode graph (see the module doc).

    Dataset prompts are task ids; TRL hands each ``num_generations`` times in a row.
    """

    def __init__(self, tasks: list[Task], pool: EnvPool, cfg: GRPOStageConfig,
                 policy_cfg: PolicyConfig, out_dir: Path, *, curriculum: Curriculum | None = None,
                 stage: str = "grpo",
                 on_batch: Callable[[dict[str, Any]], None] | None = None,
                 on_episodes: EpisodeSink | None = None,
                 view: PolicyView | None = None) -> None:
        self.tasks = {str(t.task_id): t for t in tasks}
        self.view = view
        self.budget = TransitionBudget(cfg.real_transition_budget) \
            if cfg.real_transition_budget is not None else None
        self.pool: Any = _BudgetedPool(pool, self.budget) if self.budget else pool
        self.cfg = cfg
        self.policy_cfg = policy_cfg
        self.out_dir = out_dir
        self.curriculum = curriculum
        self.stage = stage
        self.on_batch = on_batch
        self.on_episodes = on_episodes
        self.counters = RolloutCounters()
        self.outcomes: list[float] = []
        """The last batch's reward per row (PPO's GAE reads them)."""
        self.cut_segments: list[list[int] | None] = []
        """Per row of the last batch, the policy's segment of the state a cut episode's last
        action led to, where PPO bootstraps cut episodes (``ppo.truncation``), else None."""
        self._policy: PolicyModel | None = None
        self.constraints = ConstraintBook()
        """The decoding constraint of every sampled token of the current batch, for the
        trainer to score actions under the distribution they were sampled from."""

    def _policy_for(self, trainer: Any) -> PolicyModel:
        if self._policy is None or self._policy.model is not trainer.model:
            engine = vllm_engine(trainer.vllm_generation, self.policy_cfg.max_action_tokens) \
                if getattr(trainer, "use_vllm", False) else None
            self._policy = PolicyModel(trainer.model, trainer.processing_class, self.policy_cfg,
                                       engine=engine, view=self.view)
        return self._policy

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        group = trainer.num_generations
        seeds = [self.tasks[str(p)] for p in prompts[::group]]
        tasks = self.curriculum.mix(seeds) if self.curriculum else seeds
        batch = self.counters.batches
        episodes = [(f"{self.stage}-{batch}-{i}-{g}", task)
                    for i, task in enumerate(tasks) for g in range(group)]
        policy = self._policy_for(trainer)
        agent = PolicyAgent(policy, temperature=self.cfg.temperature, name=f"{self.stage}-policy")
        self.constraints.clear()  # the previous batch has been scored
        started = time.perf_counter()
        outcomes = run_async(play_episodes(episodes, self.pool, agent,
                                           max_steps=self.cfg.max_episode_steps),
                             workers=2 * self.pool.size + 4)
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "env_mask": [],
                                     "episode_reward": []}
        rewards: list[float | None] = []
        self.outcomes = []
        self.cut_segments = []
        bootstrap = self.cfg.algorithm == "ppo" and self.cfg.ppo.truncation == "bootstrap"
        played: list[Trajectory] = []
        for (eid, _), outcome in zip(episodes, outcomes, strict=True):
            tokens = agent.pop_episode(eid)
            usable = (isinstance(outcome, Trajectory) and tokens is not None
                      and tokens.completion_ids and not _em_failure(outcome))
            if isinstance(outcome, Trajectory):
                self._count(outcome)
                append_trajectory(self.out_dir / ROLLOUTS_FILE, outcome)
                played.append(outcome)
            elif getattr(outcome, "partial", None) is not None:
                # cut (a budget spent mid-episode): its real steps are kept, not trained on
                append_trajectory(self.out_dir / ROLLOUTS_FILE, outcome.partial)
                played.append(outcome.partial)
            if usable:
                assert tokens is not None and isinstance(outcome, Trajectory)
                out["prompt_ids"].append(tokens.prompt_ids)
                out["completion_ids"].append(tokens.completion_ids)
                out["env_mask"].append(tokens.env_mask)
                self.constraints.add(tokens)
                rewards.append(1.0 if outcome.success else 0.0)
                self.outcomes.append(rewards[-1])
                cut = bootstrap and outcome.termination == "max_steps" and outcome.transitions
                self.cut_segments.append(_next_segment(policy, outcome) if cut else None)
            else:  # kept out of the loss: every token masked, a neutral reward (below)
                self.counters.masked_episodes += 1
                head = tokens.prompt_ids if tokens and tokens.prompt_ids else [policy.eos_id]
                out["prompt_ids"].append(head)
                out["completion_ids"].append([policy.eos_id])
                out["env_mask"].append([0])
                rewards.append(None)
                self.outcomes.append(0.0)
                self.cut_segments.append(None)
        if self.budget is not None:  # every real step, those of episodes the budget cut too
            self.counters.real_transitions = self.budget.used
        if self.on_episodes is not None and played:
            self.on_episodes(played)
        groups = [rewards[i:i + group] for i in range(0, len(rewards), group)]
        for members in groups:
            seen = [r for r in members if r is not None]
            mean = sum(seen) / len(seen) if seen else 0.0
            out["episode_reward"].extend(mean if r is None else r for r in members)
        if self.curriculum is not None:
            self.curriculum.observe(tasks, [[r for r in g if r is not None] for g in groups])
            self.curriculum.refresh()
        self.counters.batches += 1
        figures = self._figures(tasks, groups, time.perf_counter() - started)
        self.counters.history.append(figures)
        if self.on_batch:
            self.on_batch(figures)
        out["logprobs"] = None  # type: ignore[assignment]  # no sampling-side correction
        return out

    def _count(self, traj: Trajectory) -> None:
        c = self.counters
        c.episodes += 1
        c.successes += traj.success
        c.em_failures += _em_failure(traj)
        for t in traj.transitions:
            c.real_transitions += t.provenance == "real"
            c.synthetic_transitions += t.provenance == "synthetic"
            c.invalid_actions += not t.valid

    def _figures(self, tasks: list[Task], groups: list[list[float | None]],
                 seconds: float) -> dict[str, Any]:
        flat = [r for g in groups for r in g if r is not None]
        c = self.counters
        figures = {
            "stage": self.stage, "batch": c.batches,
            "rollout/success": round(sum(flat) / len(flat), 4) if flat else 0.0,
            "rollout/episodes": c.episodes, "rollout/real_transitions": c.real_transitions,
            "rollout/synthetic_transitions": c.synthetic_transitions,
            "rollout/invalid_actions": c.invalid_actions,
            "rollout/masked_episodes": c.masked_episodes, "rollout/em_failures": c.em_failures,
            "rollout/seconds": round(seconds, 2),
            "rollout/synthetic_tasks": sum(t.split == "synthetic" for t in tasks),
            # the splits this batch trained on (train, synthetic), episodes cut by a budget too
            "rollout/task_splits": dict(sorted(Counter(t.split for t in tasks).items())),
        }
        if self.curriculum is not None:
            s = self.curriculum.stats
            figures.update({"curriculum/proposed": s.proposed, "curriculum/accepted": s.accepted,
                            "curriculum/malformed": s.malformed,
                            "curriculum/infeasible": s.infeasible,
                            "curriculum/held_out": s.held_out,
                            "curriculum/pool": len(self.curriculum.pool)})
        return figures


def vllm_engine(generation: Any, max_tokens: int) -> Any:
    """TRL's vLLM generation (``trainer.vllm_generation``, holding the trained weights: TRL copies
    them in before each batch) as the policy's engine
    (:data:`~dreamgym_agents.gateway.local.Engine`): each batch of waiting turns is one
    ``generate`` call, one action each, at most ``max_tokens`` tokens (the trainer's completion
    length is a whole episode's). The log-probabilities are vLLM's; no constraint applies."""
    generation.max_completion_length = max_tokens

    def engine(batch: list[Any]) -> list[list[int]]:
        _, completions, logprobs, _ = generation.generate(
            prompts=[list(r.ids) for r in batch], images=None, num_generations=1)
        rows = []
        for r, ids, lps in zip(batch, completions, logprobs, strict=True):
            ids = list(ids)[: r.max_tokens]
            if r.trace:
                r.logps = [float(lp[0]) for lp in lps][: len(ids)]
                r.allowed = [None] * len(ids)
            rows.append(ids)
        return rows

    return engine


def run_async(coro: Any, workers: int) -> Any:
    """Run ``coro`` in a new event loop whose thread pool has ``workers`` threads (each
    episode holds a thread while its environment or policy works)."""
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        loop.set_default_executor(executor)
        return await coro

    return asyncio.run(main())


# --------------------------------------------------------------------------------------------
# Scoring turns
# --------------------------------------------------------------------------------------------


class ConstraintBook:
    """Each rollout's layout, by the episode's whole token sequence: where its turns start,
    which tokens are the policy's actions, and the tokens each sampled action token was
    allowed (its decoding constraint). The trainer finds a batch row's by its tokens, whatever
    order and padding TRL gives the rows, so a turn is scored from its own segment in any
    layout (the chat template's turns have no marker token of their own)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, ...], list[list[int] | None]] = {}
        self._layouts: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}

    def clear(self) -> None:
        self._rows.clear()
        self._layouts.clear()

    def add(self, tokens: Any) -> None:
        key = tuple(tokens.ids)
        self._layouts[key] = (list(tokens.turns), list(tokens.mask))
        if tokens.constrained:
            self._rows[key] = list(tokens.allowed)

    def row(self, ids: list[int]) -> list[list[int] | None] | None:
        """Per token of ``ids`` (a row's tokens, padding removed), the allowed tokens; None
        for a row decoded unconstrained."""
        return self._rows.get(tuple(ids))

    def layout(self, ids: list[int]) -> tuple[list[int], list[int]] | None:
        """``(turn starts, action mask)`` of a row's tokens (padding removed); None for a row
        not recorded."""
        return self._layouts.get(tuple(ids))

    def __len__(self) -> int:
        return len(self._rows)


def _next_segment(policy: PolicyModel, episode: Trajectory) -> list[int]:
    """The policy's segment of the state an episode's last action led to: the context a next
    turn would have acted in (a cut episode's bootstrap, :mod:`.ppo`)."""
    steps = episode.transitions
    return policy.segment_ids(episode.task, steps[-1].next_state,
                              written_actions(steps, policy.cfg, policy.view),
                              error_seen(steps, len(steps)))


def turn_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *,
               user_id: int, assistant_id: int, pad_id: int, temperature: float = 1.0,
               compute_entropy: bool = False, bf16: bool = False,
               rows_per_pass: int = 16,
               constraints: ConstraintBook | None = None,
               value_head: Any = None) -> tuple[Any, ...]:
    """Log-probabilities (and entropies) of the completion tokens, each turn scored from its own
    segment; only action tokens are scored, the others get 0 (they are masked out of the loss).
    A row the ``constraints`` book recorded says where its turns start and which tokens are
    actions; another row is split at ``user_id`` (the compact layout's ``<|user|>``) and scored
    after each turn's ``assistant_id``.

    With ``constraints``, a token sampled under a decoding constraint is scored under the same
    constraint (the softmax over the tokens it allowed), so the log-probabilities, the ratio and
    the KL are those of the distribution the actions were sampled from; scored over the whole
    vocabulary they would be biased by the mass of the forbidden tokens.

    With ``value_head`` (PPO's critic, :mod:`.ppo`), each action token also gets the critic's
    value of the context before it (the hidden state its logits come from): at a turn's first
    action token that is the turn's state, after its observation and before its action.

    Returns:
        ``(logps, entropies)`` of shape ``(batch, logits_to_keep)`` (entropies None unless asked),
        and ``values`` of that shape third when ``value_head`` is given.
    """
    import torch

    batch, length = input_ids.shape
    first_completion = length - logits_to_keep
    rows: list[tuple[int, int, int]] = []
    allowed_of: dict[int, tuple[int, list[list[int] | None]]] = {}  # row → (its start, allowed)
    acts_of: dict[int, tuple[int, list[int]]] = {}  # row → (its start, action mask)
    for b in range(batch):
        present = attention_mask[b].nonzero().flatten()
        if not len(present):
            continue
        lo, hi = int(present[0]), int(present[-1]) + 1
        laid = None
        if constraints is not None:
            row_ids = input_ids[b, lo:hi].tolist()
            laid = constraints.layout(row_ids)
            found = constraints.row(row_ids) if len(constraints) else None
            if found is not None:
                allowed_of[b] = (lo, found)
        if laid is not None:
            starts = [lo + t for t in laid[0]]
            acts_of[b] = (lo, laid[1])
        else:
            starts = [lo + int(i) for i in (input_ids[b, lo:hi] == user_id).nonzero().flatten()]
        if not starts or starts[0] != lo:
            starts = [lo, *starts]
        for s, e in zip(starts, [*starts[1:], hi], strict=True):
            if e > first_completion:
                rows.append((b, s, e))
    rows.sort(key=lambda r: r[2] - r[1])
    _, head = body_and_head(model)
    device = input_ids.device  # where the trainer keeps the batch: the model's device
    logps = torch.zeros((batch, logits_to_keep), dtype=torch.float32, device=device)
    entropies = torch.zeros((batch, logits_to_keep), dtype=torch.float32, device=device) \
        if compute_entropy else None
    values = torch.zeros((batch, logits_to_keep), dtype=torch.float32, device=device) \
        if value_head is not None else None
    for k in range(0, len(rows), rows_per_pass):
        chunk = rows[k:k + rows_per_pass]
        width = max(e - s for _, s, e in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        src_r, src_c, dst_b, dst_c = [], [], [], []
        for i, (b, s, e) in enumerate(chunk):
            ids[i, :e - s] = input_ids[b, s:e]
            mask[i, :e - s] = 1
            if b in acts_of:
                row_lo, acts = acts_of[b]
                scored = [j for j in range(1, e - s) if acts[s + j - row_lo]]
            else:
                marks = (ids[i, :e - s] == assistant_id).nonzero().flatten()
                first_action = int(marks[0]) + 1 if len(marks) else e - s
                scored = list(range(max(first_action, 1), e - s))
            for j in scored:
                if s + j >= first_completion:
                    src_r.append(i)
                    src_c.append(j)
                    dst_b.append(b)
                    dst_c.append(s + j - first_completion)
        if not src_r:
            continue
        ids, mask = ids.to(device), mask.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = last_hidden(model, ids, mask)
        rows_t = torch.tensor(src_r, device=device)
        cols_t = torch.tensor(src_c, device=device)
        before = hidden[rows_t, cols_t - 1].float()  # the context each scored token follows
        logits = head(before).float() / temperature
        if allowed_of:
            mask = torch.zeros_like(logits, dtype=torch.bool)
            for n, (i, j) in enumerate(zip(src_r, src_c, strict=True)):
                b, s = chunk[i][0], chunk[i][1]
                if b in allowed_of:
                    lo, allowed = allowed_of[b]
                    choice = allowed[s + j - lo]
                    if choice is not None:
                        mask[n, torch.tensor(choice, dtype=torch.long, device=device)] = True
                        continue
                mask[n] = True  # unconstrained
            logits = logits.masked_fill(~mask, float("-inf"))
        logp_all = torch.log_softmax(logits, dim=-1)
        token_lp = logp_all.gather(-1, ids[rows_t, cols_t].unsqueeze(-1)).squeeze(-1)
        where = (torch.tensor(dst_b, device=device), torch.tensor(dst_c, device=device))
        logps = logps.index_put(where, token_lp)
        if entropies is not None:
            ent = -(logp_all.exp() * logp_all.masked_fill(logp_all == float("-inf"), 0.0)).sum(-1)
            entropies = entropies.index_put(where, ent.detach())
        if values is not None:
            values = values.index_put(where, value_head(before).squeeze(-1).float())
    if values is not None:
        return logps, entropies, values
    return logps, entropies


def _trainer_class(trl: Any, *, user_id: int, assistant_id: int, pad_id: int,
                   bf16: bool, constraints: ConstraintBook | None = None) -> type:
    class TurnGRPOTrainer(trl.GRPOTrainer):
        """GRPOTrainer whose log-probabilities score each turn from its own ``<|user|>``."""

        turn_args = {"user_id": user_id, "assistant_id": assistant_id, "pad_id": pad_id,
                     "bf16": bf16, "constraints": constraints}

        def _get_per_token_logps_and_entropies(self, model: Any, input_ids: Any,
                                               attention_mask: Any, logits_to_keep: int,
                                               batch_size: int | None = None,
                                               compute_entropy: bool = False,
                                               compute_aux_loss: bool = False,
                                               **unused: Any) -> tuple[Any, Any, Any]:
            logps, entropies = turn_logps(
                model, input_ids, attention_mask, logits_to_keep, user_id=user_id,
                assistant_id=assistant_id, pad_id=pad_id, temperature=self.temperature,
                compute_entropy=compute_entropy, bf16=bf16, constraints=constraints)
            return logps, entropies, None

    return TurnGRPOTrainer


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


Validate = Callable[[Path, int], dict[str, Any]]
"""Plays the policy checkpoint in a folder on the validation split (the stage's optimisation
step, 0 before the first, names its episodes' folder) and returns its figures: ``success``
(and ``successes``, ``episodes``, ``eval_real_transitions``)."""


class ValidationRule:
    """The stop rule of a stage (:attr:`GRPOStageConfig.validate_every`): each validated
    policy is kept only while it is the best so far, the earliest of the best winning."""

    def __init__(self, folder: Path, validate: Validate, patience: int) -> None:
        self.folder = folder
        self.validate = validate
        self.patience = patience
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.below = 0

    def check(self, path: Path, step: int, *, keep: bool = True) -> bool:
        """Validate the policy in ``path`` (the stage's state after ``step`` optimisation
        steps); whether the stage should stop (patience spent). ``keep``: ``path`` is this
        rule's own copy, removed unless it is the best."""
        figures = self.validate(path, step)
        entry = {"step": step, "success": float(figures["success"]),
                 **{k: figures[k] for k in ("successes", "episodes", "eval_real_transitions")
                    if k in figures}}
        self.history.append(entry)
        if self.best is None or entry["success"] > self.best["success"]:
            if self.best is not None and self.best["owned"]:
                shutil.rmtree(self.best["path"], ignore_errors=True)
            self.best = {**entry, "path": path, "owned": keep}
            self.below = 0
        else:
            if keep:
                shutil.rmtree(path, ignore_errors=True)
            self.below += 1
        return bool(self.patience) and self.below >= self.patience

    @property
    def real_transitions(self) -> int:
        return sum(int(h.get("eval_real_transitions", 0)) for h in self.history)

    def summary(self) -> dict[str, Any]:
        best = self.best or {}
        return {"history": self.history, "selected_step": best.get("step"),
                "selected_success": best.get("success"),
                "real_transitions": self.real_transitions}


def save_trained(model: Any, tokenizer: Any, target: Path, policy_cfg: PolicyConfig, *,
                 lora: bool, merge_copy: bool = False, value_head: Any = None,
                 critic_body: Any = None) -> None:
    """Save a stage's policy (LoRA adapters merged) with its settings; ``merge_copy``: merge a
    copy, leaving ``model`` training (a validation mid-stage). With PPO's ``value_head``, the
    critic beside it (a separate one's network in ``critic/``) and ``"algorithm": "ppo"`` in
    its settings."""
    if lora:
        model = (copy.deepcopy(model) if merge_copy else model).merge_and_unload()
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    save_policy_settings(target, policy_cfg, turn_format(tokenizer, policy_cfg.turn_format),
                         algorithm="ppo" if value_head is not None else "grpo")
    if value_head is not None:
        save_value_head(value_head, target)
    if critic_body is not None:
        save_critic_body(critic_body, target)


def train_grpo(
    policy_path: str | Path, out_dir: str | Path, tasks: list[Task], pool: EnvPool,
    cfg: GRPOStageConfig, policy_cfg: PolicyConfig | None = None, *,
    curriculum: Curriculum | None = None, stage: str = "grpo",
    metrics_file: str | Path | None = None,
    on_batch: Callable[[dict[str, Any]], None] | None = None,
    validate: Validate | None = None,
    on_episodes: EpisodeSink | None = None,
    resumable: bool = False,
    view: PolicyView | None = None,
) -> dict[str, Any]:
    """Continue training the policy in ``policy_path`` with multi-turn GRPO; save it to
    ``out_dir/policy``; return the stage's figures.

    Args:
        policy_path: The policy to start from (a checkpoint directory).
        out_dir: The stage's folder (``policy/``, ``rollouts.jsonl``, ``metrics.jsonl``).
        tasks: The seed tasks (their ids are the dataset).
        pool: Where episodes are played (dream or real environments).
        cfg: Settings.
        policy_cfg: How the policy sees turns.
        curriculum: Task variants and the λ mix (dream only: synthetic tasks have no evaluator).
        stage: Name of the stage in metrics and episode ids.
        metrics_file: Where figures are appended (default ``out_dir/metrics.jsonl``).
        on_batch: Called with each batch's figures (progress display).
        validate: Plays a checkpoint on the validation split (:data:`Validate`); needed by,
            and only used with, ``cfg.validate_every``.
        on_episodes: Takes each batch's episodes (:data:`EpisodeSink`).
        resumable: Keep resume points (``cfg.resume_every``) and go on from the last one in
            ``out_dir`` (:func:`resume_point`): the caller says so where nothing outside this
            function depends on the batches a resume plays again (``on_episodes`` is called
            again for them).
        view: How the policy sees the tasks' family's states (its ``policy_view``, from the
            caller that resolved the family; None: plain text).
    """
    try:
        import datasets
        import transformers
        import trl
    except ImportError as exc:
        raise MissingExtraError(exc.name or "trl", "train") from None
    from dreamgym_agents.experience.sft import native_bf16, training_device
    from dreamgym_agents.gateway.local import load_causal_lm

    if not tasks:
        raise ConfigError(f"{stage}: no tasks to train on")
    if cfg.validate_every and validate is None:
        raise ConfigError(f"{stage}: validate_every needs a validation split to play "
                          "(the pipeline's stages have one)")
    policy_cfg = policy_cfg or PolicyConfig()
    if cfg.use_vllm:
        check_vllm(cfg, policy_cfg, stage)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    every = cfg.resume_every if resumable else 0
    point = resume_point(out) if every else None
    resumed = json.loads((point / RESUME_STATE).read_text()) if point else None
    tokenizer, model = load_causal_lm(policy_path)
    if cfg.lora_r:
        model = with_lora(model, cfg.lora_r)
    value_head = critic_body = None
    if cfg.algorithm == "ppo":  # the critic as the resume point left it, else the policy's
        value_head = value_head_for(model, point or policy_path)
        critic_body = critic_body_for(point if point and (point / CRITIC_DIR).is_dir()
                                      else policy_path, cfg.ppo)
    # the compact layout's markers (the rollouts' book says where every turn starts anyway)
    compact = turn_format(tokenizer, policy_cfg.turn_format) == "compact"
    user_id = tokenizer.convert_tokens_to_ids(USER) if compact else -1
    assistant_id = tokenizer.convert_tokens_to_ids(ASSISTANT) if compact else -1
    device = training_device()
    bf16 = native_bf16(device) if cfg.bf16 is None else cfg.bf16
    rollout = EpisodeRollout(tasks, pool, cfg, policy_cfg, out, curriculum=curriculum,
                             stage=stage, on_batch=on_batch, on_episodes=on_episodes,
                             view=view)
    # The dataset is the task ids, enough of them for every step (TRL shuffles and repeats).
    ids = [str(t.task_id) for t in tasks]
    rows = [{"prompt": ids[i % len(ids)]}
            for i in range(max(len(ids), cfg.max_steps * cfg.tasks_per_step))]
    accumulation = cfg.episodes_per_step // cfg.micro_batch
    args = trl.GRPOConfig(
        **vllm_args(cfg),
        output_dir=str(out / "trainer"), per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=accumulation, num_generations=cfg.num_generations,
        max_steps=cfg.max_steps * cfg.num_iterations, num_iterations=cfg.num_iterations,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant",
        beta=cfg.beta, epsilon=cfg.epsilon, temperature=cfg.temperature,
        loss_type=cfg.loss_type,
        use_cpu=device == "cpu", bf16=False, logging_steps=1, report_to=[],
        # a resume point every `every` batches; the last two kept (the newer may be half made)
        save_strategy="steps" if every else "no", save_steps=max(1, every * cfg.num_iterations),
        save_total_limit=2,
        gradient_checkpointing=(device != "cpu" if cfg.gradient_checkpointing is None
                                else cfg.gradient_checkpointing),
        seed=cfg.seed, data_seed=cfg.seed, max_completion_length=4096,
        mask_truncated_completions=True, disable_tqdm=True, dataloader_num_workers=0,
    )
    metrics_file = Path(metrics_file) if metrics_file else out / METRICS_FILE
    rule = ValidationRule(out / "validation", validate, cfg.validate_patience) \
        if cfg.validate_every and validate is not None else None
    validate_steps = cfg.validate_every * cfg.num_iterations

    def validated(step: int, model: Any = None) -> bool:
        """Validate ``model`` (saved, merged, as the policy after ``step`` steps; None: the
        starting policy); whether the stage should stop."""
        assert rule is not None
        path = Path(policy_path)
        if model is not None:
            path = rule.folder / f"step-{step}"
            save_trained(model, tokenizer, path, policy_cfg, lora=bool(cfg.lora_r),
                         merge_copy=True, value_head=value_head, critic_body=critic_body)
        stop = rule.check(path, step, keep=model is not None)
        line = {"stage": stage, "event": "validation", **rule.history[-1],
                "best_step": rule.best["step"] if rule.best else None}
        with open(metrics_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        logger.info("%s: validation after %d step(s): %.3f (best: step %s)", stage, step,
                    line["success"], line["best_step"])
        if stop:
            logger.warning("%s: %d validations in a row below the best (step %d): stopping",
                           stage, rule.below, rule.best["step"] if rule.best else 0)
        return stop

    keep_at = {int(b) for b in cfg.keep_at}
    kept: list[dict[str, Any]] = []

    def keep(batch: int, model: Any) -> None:
        """A copy of the policy after ``batch`` batches, and where the stage stood then."""
        target = out / "kept" / f"batch-{batch}"
        if target.exists():
            shutil.rmtree(target)
        save_trained(model, tokenizer, target, policy_cfg, lora=bool(cfg.lora_r),
                     merge_copy=True, value_head=value_head, critic_body=critic_body)
        c = rollout.counters
        line = {"batch": batch, "path": str(target), "episodes": c.episodes,
                "synthetic_transitions": c.synthetic_transitions,
                "real_transitions": c.real_transitions,
                "seconds": round(time.perf_counter() - start, 1)}
        kept.append(line)
        with open(out / "kept" / "kept.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    class _Control(transformers.TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs:
                line = {"stage": stage, "step": state.global_step,
                        **{f"grpo/{k}": v for k, v in logs.items()}}
                with open(metrics_file, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line) + "\n")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % cfg.num_iterations == 0 and \
                    state.global_step // cfg.num_iterations in keep_at:
                keep(state.global_step // cfg.num_iterations, kw["model"])
            if rollout.budget is not None and rollout.budget.spent:
                control.should_training_stop = True
            if cfg.time_budget_s and time.perf_counter() - start > cfg.time_budget_s:
                logger.warning("%s: time budget of %.0f s reached at step %d", stage,
                               cfg.time_budget_s, state.global_step)
                control.should_training_stop = True
            if rule is not None and state.global_step % validate_steps == 0:
                if validated(state.global_step, kw["model"]):
                    control.should_training_stop = True

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            save_resume_point(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    followed = [out / ROLLOUTS_FILE, metrics_file, out / "kept" / "kept.jsonl"]

    def save_resume_point(point: Path) -> None:
        """What the trainer's checkpoint in ``point`` lacks to go on from it: the critic, the
        rollouts' counters and budget, the curriculum, the stop rule (its best policy copied
        in), the kept points, the records' lengths; :data:`RESUME_STATE` written last."""
        if value_head is not None:
            save_value_head(value_head, point)
        if critic_body is not None:
            save_critic_body(critic_body, point)
        best = None
        if rule is not None and rule.best is not None:
            best = {k: v for k, v in rule.best.items() if k != "path"}
            if rule.best["owned"]:
                shutil.copytree(rule.best["path"], point / "best", dirs_exist_ok=True)
            else:
                best["path"] = str(rule.best["path"])
        if curriculum is not None:
            with open(point / "curriculum.pkl", "wb") as fh:
                pickle.dump(curriculum.state(), fh)
        state = {"batches": rollout.counters.batches, "counters": asdict(rollout.counters),
                 "budget_used": rollout.budget.used if rollout.budget is not None else None,
                 "rule": {"history": rule.history, "below": rule.below, "best": best}
                 if rule is not None else None,
                 "kept": kept, "seconds": time.perf_counter() - start,
                 "sizes": {str(f): f.stat().st_size if f.is_file() else 0 for f in followed}}
        tmp = point / (RESUME_STATE + ".tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        tmp.replace(point / RESUME_STATE)

    if resumed is not None:  # go on from the resume point: the stage's state as it was then
        assert point is not None
        for name, size in resumed["sizes"].items():  # what the lost batches wrote goes
            f = Path(name)
            if f.is_file() and f.stat().st_size > size:
                os.truncate(f, size)
        rollout.counters = RolloutCounters(**resumed["counters"])
        if rollout.budget is not None and resumed["budget_used"] is not None:
            rollout.budget.used = int(resumed["budget_used"])
        if curriculum is not None and (point / "curriculum.pkl").is_file():
            with open(point / "curriculum.pkl", "rb") as fh:
                curriculum.restore(pickle.load(fh))
        if rule is not None and resumed["rule"] is not None:
            r = resumed["rule"]
            rule.history, rule.below = r["history"], r["below"]
            if r["best"] is not None:
                if "path" in r["best"]:
                    rule.best = {**r["best"], "path": Path(r["best"]["path"])}
                else:  # its copy, back in the rule's folder
                    target = rule.folder / f"step-{r['best']['step']}"
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(point / "best", target)
                    rule.best = {**r["best"], "path": target}
        kept[:] = resumed["kept"]
        start = time.perf_counter() - float(resumed["seconds"])
        logger.warning("%s: resuming after batch %d of %d (the resume point in %s)", stage,
                       resumed["batches"], cfg.max_steps, point)

    def batch_metrics(figures: dict[str, Any]) -> None:
        with open(metrics_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(figures) + "\n")
        if on_batch:
            on_batch(figures)

    rollout.on_batch = batch_metrics
    trainer_class = _trainer_class(trl, user_id=user_id, assistant_id=assistant_id,
                                   pad_id=int(tokenizer.pad_token_id), bf16=bf16,
                                   constraints=rollout.constraints)
    if value_head is not None:
        trainer_class = ppo_trainer_class(trainer_class, value_head=value_head,
                                          settings=cfg.ppo, outcomes=lambda: rollout.outcomes,
                                          num_iterations=cfg.num_iterations, score=turn_logps,
                                          critic_body=critic_body,
                                          cut_segments=lambda: rollout.cut_segments,
                                          pad_id=int(tokenizer.pad_token_id))
    trainer = trainer_class(
        model=model, reward_funcs=[outcome_reward], args=args,
        train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
        rollout_func=rollout, callbacks=[_Control(), *tracking.trainer_callbacks(stage)])
    # Each step's logs go to metrics.jsonl (above); the stage's bar shows progress.
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    if rule is not None and resumed is None:  # the starting policy is a candidate too
        validated(0)
    with PeakMemory() as memory:
        result = trainer.train(resume_from_checkpoint=str(point) if point else None)
    if every:  # the stage is whole: its resume points are not needed any more
        shutil.rmtree(out / "trainer", ignore_errors=True)
    save = out / "policy"
    if save.exists():
        shutil.rmtree(save)
    if rule is not None and not any(h["step"] == result.global_step for h in rule.history):
        validated(int(result.global_step), trainer.model)
    if rule is not None and rule.best is not None:
        if rule.best["owned"]:
            shutil.move(rule.best["path"], save)
        else:
            shutil.copytree(rule.best["path"], save)
        if rule.best["step"] == 0:  # the start's settings are its own: the stage's view
            save_policy_settings(save, policy_cfg,
                                 turn_format(tokenizer, policy_cfg.turn_format))
    else:
        save_trained(trainer.model, tokenizer, save, policy_cfg, lora=bool(cfg.lora_r),
                     value_head=value_head, critic_body=critic_body)
    c = rollout.counters
    validation = {"validation": rule.summary()} if rule is not None else {}
    return {"stage": stage, "path": str(save), "steps": int(result.global_step),
            "batches": c.batches, "episodes": c.episodes,
            "rollout_success": round(c.successes / c.episodes, 4) if c.episodes else 0.0,
            "real_transitions": c.real_transitions,
            "synthetic_transitions": c.synthetic_transitions,
            "masked_episodes": c.masked_episodes, "em_failures": c.em_failures,
            "seconds": round(time.perf_counter() - start, 1), "lora_r": cfg.lora_r,
            "algorithm": cfg.algorithm, "peak_rss_mb": memory.peak_mb,
            "curriculum": vars(curriculum.stats) if curriculum else None, **validation,
            **({"kept": kept} if kept else {})}


class PeakMemory:
    """The most resident memory this process held while the block ran (``peak_mb``), sampled
    twice a second from ``/proc/self/statm`` (where there is none: the process's lifetime peak,
    ``ru_maxrss``). The game workers and other child processes are not in it."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s, self.peak_mb = every_s, 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def now_mb() -> float:
        try:
            with open("/proc/self/statm") as fh:
                pages = int(fh.read().split()[1])
            return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError, IndexError):
            import resource
            import sys

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return peak / 2**20 if sys.platform == "darwin" else peak / 1024

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak_mb = max(self.peak_mb, self.now_mb())

    def __enter__(self) -> PeakMemory:
        self.peak_mb = self.now_mb()
        self._thread = threading.Thread(target=self._sample, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak_mb = round(max(self.peak_mb, self.now_mb()), 1)


def resume_point(stage_dir: str | Path) -> Path | None:
    """The last whole resume point of a stage's folder (:attr:`GRPOStageConfig.resume_every`),
    or None: a trainer checkpoint whose :data:`RESUME_STATE` was written."""
    found = []
    for path in (Path(stage_dir) / "trainer").glob("checkpoint-*"):
        step = path.name.rpartition("-")[2]
        if step.isdigit() and (path / RESUME_STATE).is_file():
            found.append((int(step), path))
    return max(found)[1] if found else None


def resumed_batches(stage_dir: str | Path) -> int:
    """The batches a stage's last resume point had played (0: none)."""
    point = resume_point(stage_dir)
    return int(json.loads((point / RESUME_STATE).read_text())["batches"]) if point else 0


def vllm_args(cfg: GRPOStageConfig) -> dict[str, Any]:
    """The stage's vLLM settings as TRL's ``GRPOConfig`` fields (none when it does not use it)."""
    if not cfg.use_vllm:
        return {}
    out: dict[str, Any] = {"use_vllm": True, "vllm_mode": cfg.vllm_mode,
                           # the rollout's log-probabilities are the trainer's own (TRL's
                           # correction needs vLLM's, per token, which multi-turn rows lack)
                           "vllm_importance_sampling_correction": False}
    if cfg.vllm_mode == "server" and cfg.vllm_server_base_url:
        out["vllm_server_base_url"] = cfg.vllm_server_base_url
    if cfg.vllm_mode == "colocate":
        out["vllm_gpu_memory_utilization"] = cfg.vllm_gpu_memory_utilization
    return out


def check_vllm(cfg: GRPOStageConfig, policy_cfg: PolicyConfig, stage: str) -> None:
    """Refuse a vLLM stage that cannot run, saying how to fix it."""
    import importlib.util

    if policy_cfg.constrained_decoding:
        raise ConfigError(f"{stage}: use_vllm samples whole actions without the family's "
                          "grammar: set policy.constrained_decoding=false")
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtraError("vllm", "vllm")  # a CUDA machine's


def outcome_reward(prompts: list[Any], completions: list[Any], episode_reward: list[float],
                   **unused: Any) -> list[float]:
    """GRPO reward function: the episode's outcome, computed by the rollout."""
    return [float(r) if not math.isnan(float(r)) else 0.0 for r in episode_reward]
