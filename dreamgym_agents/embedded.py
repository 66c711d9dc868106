"""The embedded default experience model: built on first use, offline, on two CPU cores.

Recipe (:class:`EmbeddedRecipe`): collect offline data on the bundled shopping site's *train*
split (oracle, noisy-oracle, quitter and random episodes — the paper's "oracle + random" sets, plus
wrong and premature answers so the model learns what failure looks like), annotate it
with deterministic rationales, seed a replay buffer with it, and train a small causal LM from
scratch (tokenizer trained on the site's text, small Qwen2) with TRL's SFTTrainer on the compact
experience prompt, with counterfactual final answers labelled by each task's own evaluator.
Everything lands in ``$DG_CACHE_DIR`` or ``~/.cache/dreamgym-agents``: the model under a name
that changes with the recipe (a new recipe never reuses an old model), the collected episodes
under a name that changes only with what is collected (so the ablation models, which differ only
in training, share one collection). Every phase is resumable: collection episodes already
recorded are kept, and a finished build is marked ``READY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError

logger = logging.getLogger(__name__)

EMBEDDED = "embedded"
"""The name users give (``--experience-model embedded``, the default)."""

RECIPE_VERSION = 30
"""Bumped whenever the recipe's code changes what is trained (prompt, data, labels)."""

COLLECT_VERSION = 5
"""Bumped whenever what the collection records changes (agents, environment, episode format)."""


@dataclass(frozen=True)
class EmbeddedRecipe:
    """How the embedded default is made (changing a field makes a new cache folder).

    Attributes:
        seed: Seed of the site data, exploration and training.
        oracle_tasks: Train tasks solved by the oracle.
        noisy_tasks: Train tasks played by the noisy oracle.
        quitter_tasks: Train tasks where the agent answers wrongly or too early.
        random_tasks: Train tasks played by the random agent.
        explorer_tasks: Episodes of the explorer (one per site section and listing page; 8
            sections × 3 pages cover every item of the bundled shop).
        explorer_pages: Listing pages per section the explorer covers.
        explorer_steps: Episode length limit of the explorer (it opens and leaves each item).
        order_explorer_tasks: Episodes of the order explorer (one per page of the signed-in
            customer's My Orders; it opens every order and goes back): the order pages that
            the catalogue explorer never reaches.
        counterfactual_answers: Variants of each recorded right answer, labelled by the task's
            own evaluator (see :mod:`dreamgym_agents.training.counterfactual`).
        final_answer_repeat: Times each final-answer example is trained on.
        counterfactual_stops: Stops at earlier recorded states per episode, labelled by the
            task's evaluator (answer-only and URL-only tasks; see
            :func:`~dreamgym_agents.training.counterfactual.stop_trajectories`).
        judge_repeat: Short verdict-only copies of each final-answer example (see
            :class:`~dreamgym_agents.training.experience_data.ExampleConfig`).
        decision_weight: Loss weight of the decision tokens (verdict, outcome, next page's
            first line; see :mod:`dreamgym_agents.training.experience_sft`).
        noise: Exploration rate of the noisy oracle.
        max_steps: Episode length limit while collecting.
        concurrency: Browser episodes at once while collecting.
        max_examples: Cap on SFT examples.
        hidden_size: Model width.
        num_layers: Transformer layers.
        vocab_size: Tokenizer size.
        max_length: Longest SFT example, tokens.
        sft_steps: SFT optimisation steps: a fixed count, so how far a build trains does not
            depend on the machine's speed while it keeps pace (recipe v28 trained by the clock:
            two builds on the same episodes ran 1,083 and 1,221 steps, state F1 0.917 and
            0.844). Builds still differ: the from-scratch tokenizer's BPE training breaks count
            ties in hash-map order (docs/RESULTS.md, "Recipes v29–v30").
        batch_size: SFT batch size.
        learning_rate: SFT peak learning rate.
        sft_budget_s: Wall-time cap of SFT: a machine too slow for ``sft_steps`` in it ends
            the learning-rate schedule there instead (and the build says so).
        build_budget_s: Wall-time cap of the whole build from nothing: on a machine where
            collecting takes longer, SFT gets what is left (at most ``sft_budget_s``) and the
            build says so. Like the machine's speed, it decides how far training gets, not what
            is trained, so it is not part of the cache key.
        use_history: Train with history in the prompt (False: the no-history ablation).
        use_retrieval: Train with retrieved demonstrations (False: the no-retrieval ablation).
        use_reasoning: Train rationales before predictions (False: the no-reasoning ablation).
    """

    seed: int = 0
    oracle_tasks: int = 100
    noisy_tasks: int = 60
    quitter_tasks: int = 90
    random_tasks: int = 30
    explorer_tasks: int = 24
    explorer_pages: int = 3
    explorer_steps: int = 27
    order_explorer_tasks: int = 3
    counterfactual_answers: int = 2
    final_answer_repeat: int = 2
    counterfactual_stops: int = 1
    judge_repeat: int = 6
    decision_weight: float = 5.0
    noise: float = 0.3
    max_steps: int = 10
    concurrency: int = 2
    max_examples: int = 3000
    hidden_size: int = 192
    num_layers: int = 4
    vocab_size: int = 6000
    max_length: int = 1536
    sft_steps: int = 1000
    batch_size: int = 8
    learning_rate: float = 2e-3
    sft_budget_s: float = 900.0
    build_budget_s: float = 1170.0
    use_history: bool = True
    use_retrieval: bool = True
    use_reasoning: bool = True

    @property
    def key(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if k not in RUNTIME_FIELDS}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return f"experience-v{RECIPE_VERSION}-seed{self.seed}-{digest[:8]}"

    @property
    def collect_key(self) -> str:
        """Name of the collected episodes: recipes that differ only in training (the ablations)
        share one collection."""
        fields = {k: v for k, v in asdict(self).items() if k in COLLECT_FIELDS}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return f"collect-v{COLLECT_VERSION}-seed{self.seed}-{digest[:8]}"


RUNTIME_FIELDS = ("build_budget_s",)
"""Recipe fields that bound how long a build runs, not what it trains (not in the key)."""

COLLECT_FIELDS = ("seed", "oracle_tasks", "noisy_tasks", "quitter_tasks", "random_tasks",
                  "explorer_tasks", "explorer_pages", "explorer_steps", "order_explorer_tasks",
                  "noise", "max_steps")
"""The recipe fields that decide which episodes are collected."""


def cache_root() -> Path:
    """Where built models live: ``$DG_CACHE_DIR`` or ``~/.cache/dreamgym-agents``."""
    return Path(os.environ.get("DG_CACHE_DIR") or Path.home() / ".cache" / "dreamgym-agents")


def embedded_dir(recipe: EmbeddedRecipe | None = None) -> Path:
    return cache_root() / (recipe or EmbeddedRecipe()).key


def collect_dir(recipe: EmbeddedRecipe | None = None) -> Path:
    return cache_root() / (recipe or EmbeddedRecipe()).collect_key


def is_ready(recipe: EmbeddedRecipe | None = None) -> bool:
    return (embedded_dir(recipe) / "READY").exists()


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a second process waits for the first build
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


Progress = Callable[[str], None]


def ensure_embedded_experience_model(
    recipe: EmbeddedRecipe | None = None, *, progress: Progress | None = None,
    on_episode: Callable[[Any], None] | None = None,
) -> dict[str, str]:
    """Build the embedded default if it is not cached; return its ``model`` and ``buffer`` paths.

    Returns:
        ``{"model": "hf/<checkpoint>", "checkpoint": ..., "buffer": <buffer dir>}``.
    """
    recipe = recipe or EmbeddedRecipe()
    folder = embedded_dir(recipe)
    paths = {"checkpoint": str(folder / "model"), "model": f"hf/{folder / 'model'}",
             "buffer": str(folder / "buffer")}
    if is_ready(recipe):
        return paths
    say = progress or (lambda msg: logger.info("%s", msg))
    with build_lock(folder):
        if is_ready(recipe):
            return paths
        timings = _build(recipe, folder, say, on_episode)
        (folder / "READY").write_text(json.dumps(
            {"recipe": asdict(recipe), "timings": timings}, indent=2, sort_keys=True))
    return paths


def _build(recipe: EmbeddedRecipe, folder: Path, say: Progress,
           on_episode: Callable[[Any], None] | None) -> dict[str, float]:
    from dreamgym_agents.agent import (
        ORDER_ITEMS,
        ORDERS_ROUTE,
        ExplorerAgent,
        NoisyOracleAgent,
        OracleAgent,
        QuitterAgent,
        RandomAgent,
    )
    from dreamgym_agents.buffer import BufferConfig, ReplayBuffer
    from dreamgym_agents.env import EnvConfig, make_family
    from dreamgym_agents.training.experience_data import ExampleConfig
    from dreamgym_agents.training.experience_pipeline import train_from_trajectories
    from dreamgym_agents.training.experience_sft import ExperienceSFTConfig

    timings: dict[str, float] = {}
    start, wall_start = time.perf_counter(), time.time()
    family = make_family("webarena")
    env_cfg = EnvConfig(max_steps=recipe.max_steps, seed=recipe.seed)
    tasks = family.load_tasks("train")
    # The explorers start from the home page, where the section links are (the order explorer
    # signed in: tasks that require a login start so).
    at_root = [t for t in tasks if _starts_at_root(t)]
    # (name, agent, episodes, tasks to spread them over, step limit)
    plan = [("oracle", OracleAgent(), recipe.oracle_tasks, tasks, recipe.max_steps),
            ("noisy", NoisyOracleAgent(seed=recipe.seed, noise=recipe.noise), recipe.noisy_tasks,
             tasks, recipe.max_steps),
            ("quitter", QuitterAgent(seed=recipe.seed), recipe.quitter_tasks, tasks,
             recipe.max_steps),
            ("random", RandomAgent(seed=recipe.seed), recipe.random_tasks, tasks,
             recipe.max_steps),
            ("explorer", ExplorerAgent(pages=recipe.explorer_pages), recipe.explorer_tasks,
             at_root, recipe.explorer_steps),
            ("orders", ExplorerAgent(pages=recipe.explorer_pages, route=ORDERS_ROUTE,
                                     item_pattern=ORDER_ITEMS),
             recipe.order_explorer_tasks,
             [t for t in at_root if t.config.get("require_login")], recipe.explorer_steps)]
    shared = collect_dir(recipe)
    try:
        with build_lock(shared):
            if (shared / "COMPLETE").exists():
                say(f"embedded experience model: reusing the episodes collected in {shared}")
            else:
                _collect(recipe, shared, plan, family, env_cfg, say, on_episode)
    finally:
        family.close()
    trajectories = read_collected(shared, [name for name, *_ in plan])
    for traj in trajectories:
        traj.provenance = "offline"
        for t in traj.transitions:
            t.provenance = "offline"
    timings["collect_s"] = time.perf_counter() - start
    steps = sum(len(t.transitions) for t in trajectories)
    say(f"  collected {len(trajectories)} episodes, {steps} transitions "
        f"in {timings['collect_s']:.0f} s; training {recipe.sft_steps} steps (at most "
        f"{recipe.sft_budget_s:.0f} s, less what the build needs beyond "
        f"{recipe.build_budget_s:.0f} s)")
    buffer = ReplayBuffer(BufferConfig(path=str(folder / "buffer")))
    try:
        buffer.clear()
        manifest = train_from_trajectories(
            trajectories, buffer,
            ExampleConfig(max_examples=recipe.max_examples, seed=recipe.seed,
                          use_history=recipe.use_history, use_retrieval=recipe.use_retrieval,
                          use_reasoning=recipe.use_reasoning,
                          final_answer_repeat=recipe.final_answer_repeat,
                          judge_repeat=recipe.judge_repeat),
            ExperienceSFTConfig(
                output_dir=str(folder / "model"), vocab_size=recipe.vocab_size,
                hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                max_length=recipe.max_length, max_steps=recipe.sft_steps,
                batch_size=recipe.batch_size, learning_rate=recipe.learning_rate,
                decision_weight=recipe.decision_weight,
                time_budget_s=recipe.sft_budget_s, seed=recipe.seed,
                # what is left of the build's budget, less saving the model and the buffer
                deadline=wall_start + recipe.build_budget_s - _SAVE_RESERVE_S),
            counterfactual_answers=recipe.counterfactual_answers,
            counterfactual_stops=recipe.counterfactual_stops,
        )
    finally:
        buffer.close()
    timings.update(manifest["timings"])
    timings["total_s"] = time.perf_counter() - start
    say(f"  trained: loss {manifest['first_loss']:.3f} → {manifest['last_loss']:.3f} in "
        f"{manifest['steps']} steps, {timings.get('sft_s', 0):.0f} s; total "
        f"{timings['total_s']:.0f} s")
    behind = manifest.get("schedule_followed_clock_from_step")
    if behind is not None or manifest["steps"] < recipe.sft_steps:
        where = f"the schedule followed the clock from step {behind}" if behind is not None \
            else f"stopped at step {manifest['steps']}"
        say(f"  this machine was too slow for {recipe.sft_steps} steps in the time budget "
            f"({where}): the model differs from the reference build's (docs/RESULTS.md)")
    return {k: round(v, 1) for k, v in timings.items()}


DEMOS_VERSION = 1
"""Bumped whenever what a cached set of oracle demonstrations holds changes."""


def demos_dir(tasks: int | None, seed: int = 0) -> Path:
    """Where the oracle demonstrations on ``tasks`` train tasks (None: all) are cached."""
    return cache_root() / f"demos-v{DEMOS_VERSION}-seed{seed}-{'all' if tasks is None else tasks}"


def ensure_demos(tasks: int | None = None, *, seed: int = 0, concurrency: int = 4,
                 max_steps: int = 15, progress: Progress | None = None,
                 on_episode: Callable[[Any], None] | None = None) -> Path:
    """Play the oracle on ``tasks`` train tasks of the bundled site, spread over the templates
    (None: every train task with an oracle program), unless cached; return the folder.

    These are the policy's demonstrations (what the warm start imitates): the experience
    model's collection plays the oracle on a hundred tasks only, and a policy trained from
    scratch on so few memorises their strings instead of learning to copy them. Resumable:
    recorded episodes stay when a collection is interrupted.
    """
    from dreamgym_agents.agent import OracleAgent
    from dreamgym_agents.env import EnvConfig, make_family, spread_tasks
    from dreamgym_agents.graph import RunConfig, run_episodes

    folder = demos_dir(tasks, seed)
    say = progress or (lambda msg: logger.info("%s", msg))
    with build_lock(folder):
        if (folder / "COMPLETE").exists():
            return folder
        family = make_family("webarena")
        env_cfg = EnvConfig(max_steps=max_steps, seed=seed)
        try:
            pool = [t for t in family.load_tasks("train") if t.oracle]
            chosen = spread_tasks(pool, tasks) if tasks is not None else pool
            say(f"policy demonstrations: the oracle on {len(chosen)} train tasks "
                f"({family.prepare(env_cfg, chosen)}) → {folder}")
            run_cfg = RunConfig(out_dir=folder / "oracle", concurrency=concurrency,
                                max_steps=max_steps,
                                meta={"command": "embedded-demos", "tasks": tasks, "seed": seed})
            result = asyncio.run(run_episodes(chosen, lambda: family.make_env(env_cfg),
                                              OracleAgent(), run_cfg, on_episode=on_episode))
        finally:
            family.close()
        if result.failed:
            raise ConfigError(f"{len(result.failed)} demonstration episode(s) failed (see "
                              f"{folder / 'oracle' / 'errors.jsonl'}); rerun to retry them")
        (folder / "COMPLETE").write_text(json.dumps(result.summary, sort_keys=True))
    return folder


def read_collected(folder: Path, names: list[str]) -> list[Any]:
    """The collected episodes of each collector in ``names``, in a fixed order: concurrent
    episodes are written as they finish, and the order of the training data (hence the trained
    weights) must not depend on which finished first."""
    from dreamgym_agents.graph import TRAJECTORIES_FILE
    from dreamgym_agents.types import read_trajectories

    out: list[Any] = []
    for name in names:
        out.extend(sorted(read_trajectories(folder / name / TRAJECTORIES_FILE),
                          key=lambda t: t.episode_id))
    return out


_SAVE_RESERVE_S = 20.0
"""Seconds a build keeps, after training, to save the model and close the buffer."""


def _starts_at_root(task: Any) -> bool:
    """True for a task that starts on the site's home page (no path after the host)."""
    url = str(task.config.get("start_url", ""))
    rest = url.split("://", 1)[-1]
    return bool(url) and rest.rstrip("/").count("/") == 0


def _collect(recipe: EmbeddedRecipe, shared: Path, plan: list, family: Any,
             env_cfg: Any, say: Progress, on_episode: Callable[[Any], None] | None) -> None:
    """Play every agent of the plan on the bundled site (resumable: recorded episodes stay)."""
    from dreamgym_agents.graph import RunConfig, run_episodes

    everything = list({t.task_id: t for *_, pool, _ in plan for t in pool}.values())
    say(f"embedded experience model: collecting on the bundled site "
        f"({family.prepare(env_cfg, everything)})")
    for name, agent, count, pool, max_steps in plan:
        # Spread each agent over the whole split (every template), deterministically.
        chosen = pool[:: max(1, len(pool) // max(count, 1))][:count]
        if hasattr(agent, "assign"):  # the explorer: one slot per task
            agent.assign(chosen)
        say(f"  {name}: {len(chosen)} episodes")
        run_cfg = RunConfig(out_dir=shared / name, concurrency=recipe.concurrency,
                            max_steps=max_steps,
                            meta={"command": "embedded-collect", "agent": name,
                                  "recipe": asdict(recipe)})
        asyncio.run(run_episodes(chosen, lambda: family.make_env(env_cfg), agent, run_cfg,
                                 on_episode=on_episode))
    (shared / "COMPLETE").write_text(json.dumps({"recipe": asdict(recipe)}, sort_keys=True))
