"""The embedded default experience model's recipe: collect on a family's train split, then train.

A family's shipped bundle (:mod:`dreamgym_agents.pipeline.bundle`, made by
``dg-agents build-embedded``) holds the model this recipe trains; a recipe the bundle was not
built with (an ablation, a changed field) is built here on first use, offline, on two CPU
cores, and cached.

Recipe (:class:`EmbeddedRecipe`, a family's defaults from ``TaskFamily.embedded_recipe_defaults``):
collect offline data on the family's *train* split with its offline agents
(``TaskFamily.collection_plan``), annotate it with derived rationales (the family's experience
codec), seed a replay buffer with it, and train a small causal LM from scratch (tokenizer trained
on the family's text, small Qwen2) with TRL's SFTTrainer on the compact experience prompt, with
counterfactual endings labelled by each task's own evaluator where the family can
(``TaskFamily.relabel``). The web family's agents are the oracle, noisy oracle, quitter, random
agent and explorers: the paper's "oracle + random" sets, plus wrong and premature answers so the
model learns what failure looks like.

Everything lands in ``$DG_CACHE_DIR`` or ``~/.cache/dreamgym-agents``, one folder per family: the
model under a name that changes with the recipe (a new recipe never reuses an old model), the
collected episodes under a name that changes only with what is collected (so the ablation
models, which differ only in training, share one collection). Every phase is resumable:
collection episodes already recorded are kept, SFT resumes from its last checkpoint, and a
finished build is marked ``READY``. A recipe trains its fixed steps on any machine; only a
user's time budget stops it early, and then the model is marked ``PARTIAL``, never ``READY``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
import typing
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dreamgym_agents.cache import build_lock, cache_root
from dreamgym_agents.errors import ConfigError

logger = logging.getLogger(__name__)

EMBEDDED = "embedded"
"""The name users give (``--experience-model embedded``, the default)."""

RECIPE_VERSION = 31
"""Bumped whenever the recipe's code changes what is trained (prompt, data, labels)."""

COLLECT_VERSION = 5
"""Bumped whenever what the collection records changes (agents, environment, episode format)."""


@dataclass(frozen=True)
class NoRecipeOptions:
    """The recipe options of a family that has none of its own.

    A family's options class (``TaskFamily.recipe_options``) is a frozen dataclass of its
    collectors' counts and settings, every field deciding what is collected. Two class
    attributes keep the keys of recipes made before the options were split off the shared
    recipe: ``left_out_at_zero`` (fields added later, left out of the keys at 0, as
    ``state_version``) and ``legacy_key_fields`` (fields the shared recipe had when the
    family's keys were fixed and the family does not have, with the values it gave them: in
    the keys only)."""

    left_out_at_zero: ClassVar[tuple[str, ...]] = ()
    legacy_key_fields: ClassVar[dict[str, Any]] = {}


@dataclass(frozen=True)
class EmbeddedRecipe:
    """How the embedded default is made (changing a field makes a new cache folder).

    The fields here are every family's; a family's own (its collectors' counts and settings)
    are ``options``, an instance of its ``recipe_options`` class. Users set either kind by
    name (``--set experience_recipe.<field>=…``: :func:`family_recipe` sorts them).

    Attributes:
        seed: Seed of the data collection, exploration and training.
        oracle_tasks: Train tasks solved by the oracle.
        noisy_tasks: Train tasks played by the noisy oracle.
        random_tasks: Train tasks played by the random agent.
        counterfactual_answers: Variants of each recorded right answer, labelled by the task's
            own evaluator, where the family can (``TaskFamily.relabel``: the web's).
        final_answer_repeat: Times each final-answer example is trained on.
        counterfactual_stops: Stops at earlier recorded states per episode, labelled by the
            task's evaluator, where the family can (``TaskFamily.relabel``).
        judge_repeat: Short verdict-only copies of each final-answer example (see
            :class:`~dreamgym_agents.experience.data.ExampleConfig`).
        decision_weight: Loss weight of the decision tokens (verdict, outcome, next page's
            first line; see :mod:`dreamgym_agents.experience.sft`).
        noise: Exploration rate of the noisy oracle.
        max_steps: Episode length limit while collecting.
        concurrency: Episodes at once while collecting.
        max_examples: Cap on SFT examples.
        hidden_size: Model width.
        num_layers: Transformer layers.
        vocab_size: Tokenizer size.
        max_length: Longest SFT example, tokens.
        sft_steps: SFT optimisation steps: a fixed count on any machine (a slow one takes
            longer and says when it will finish), so how far a build trains never depends on
            the machine; a clock cap would build a weaker model under the recipe's name on a
            slow one. Builds still differ a little: the from-scratch tokenizer's BPE training
            breaks count ties in hash-map order (evidence:
            docs/history/results-2026-11-to-12.md).
        batch_size: SFT batch size.
        learning_rate: SFT peak learning rate.
        use_history: Train with history in the prompt (False: the no-history ablation).
        use_retrieval: Train with retrieved demonstrations (False: the no-retrieval ablation).
        use_reasoning: Train rationales before predictions (False: the no-reasoning ablation).
        state_version: Version of the family's state text. A family that changes what its
            states say sets a new one in ``embedded_recipe_defaults``, so no collection or model
            of the old states is reused. Left out of the keys at 0, so keys made without the
            field (the web family's) stay the same.
        codec_version: Version of the family's experience codec, how its model's answers are
            written. A family that changes it sets a new one, so no model of the old answers is
            reused; the collection is. Left out of the keys at 0, as ``state_version``.
        entity_swaps: Copies of each collected episode with its entities renamed, added to the
            experience model's examples (not to its buffer), made by the family's optional
            ``renamed(trajectories, copies, seed)``: a small model learns to copy the action's
            names instead of a demonstration's. Left out of the keys at 0, as
            ``state_version``.
        contrast_repeat: Times an example whose reward differs from most of its retrieved
            demonstrations' is included (:class:`~dreamgym_agents.experience.data.ExampleConfig`;
            0 or 1: once); left out of the keys at 0, as ``state_version``.
        options: The family's own options (its ``recipe_options`` class; by default none).
    """

    seed: int = 0
    oracle_tasks: int = 100
    noisy_tasks: int = 60
    random_tasks: int = 30
    counterfactual_answers: int = 0
    final_answer_repeat: int = 1
    counterfactual_stops: int = 0
    judge_repeat: int = 0
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
    use_history: bool = True
    use_retrieval: bool = True
    use_reasoning: bool = True
    state_version: int = 0
    codec_version: int = 0
    entity_swaps: int = 0
    contrast_repeat: int = 0
    options: Any = field(default_factory=NoRecipeOptions)

    def fields(self) -> dict[str, Any]:
        """Every field by name, the family's options among them (as manifests record it)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "options"}
        return {**flat, **asdict(self.options)}

    def _digest(self, names: Iterable[str] | None = None) -> str:
        later = (*_LATER_FIELDS, *type(self.options).left_out_at_zero)
        known = {**type(self.options).legacy_key_fields, **self.fields()}
        fields = {k: v for k, v in known.items() if names is None or k in names}
        for name in later:  # fields added after the keys were fixed
            if not fields.get(name):
                fields.pop(name, None)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]

    @property
    def key(self) -> str:
        return f"experience-v{RECIPE_VERSION}-seed{self.seed}-{self._digest()}"

    @property
    def collect_key(self) -> str:
        """Name of the collected episodes: recipes that differ only in training (the ablations)
        share one collection. The family's options all decide what is collected."""
        names = {*COLLECT_FIELDS, *type(self.options).legacy_key_fields,
                 *(f.name for f in dataclasses.fields(self.options))}
        return f"collect-v{COLLECT_VERSION}-seed{self.seed}-{self._digest(names)}"


_LATER_FIELDS = ("state_version", "codec_version", "entity_swaps", "contrast_repeat")

COLLECT_FIELDS = ("seed", "oracle_tasks", "noisy_tasks", "random_tasks", "noise", "max_steps",
                  "state_version")
"""The shared recipe fields that decide which episodes are collected (and every option of the
family's)."""

_SHARED = tuple(f.name for f in dataclasses.fields(EmbeddedRecipe) if f.name != "options")


def recipe_options_of(family: Any) -> type:
    """The recipe options class of ``family`` (a :class:`TaskFamily`)."""
    return getattr(family, "recipe_options", None) or NoRecipeOptions


def check_recipe_keys(keys: Iterable[str], options: type | None = None) -> None:
    """Raise :class:`ConfigError` naming the keys that are neither shared recipe fields nor
    fields of the family's ``options`` class, with the valid ones. ``options`` None: the
    family is not known yet (:func:`family_recipe` checks the keys then)."""
    if options is None:
        return
    known = {*_SHARED, *(f.name for f in dataclasses.fields(options))}
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ConfigError(f"unknown experience_recipe key(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(sorted(known))}")


def typed_recipe_fields(fields: dict[str, Any], options: type | None = None) -> dict[str, Any]:
    """Recipe ``fields`` typed as the fields they set, shared or of the family's ``options``
    class (a ``--set`` value is read as YAML without knowing its field: ``1e-3`` stays text
    there); ``options`` None: the keys that are no shared field stay as given.

    Raises:
        ConfigError: A key the recipe does not have, or a value its field cannot take.
    """
    from dreamgym_agents.config import coerce_value

    check_recipe_keys(fields, options=options)
    hints = typing.get_type_hints(EmbeddedRecipe)
    if options is not None:
        hints.update(typing.get_type_hints(options))
    return {k: coerce_value(v, hints[k], f"experience_recipe.{k}") if k in hints else v
            for k, v in fields.items()}


def recipe_for(made: Any, **fields: Any) -> EmbeddedRecipe:
    """The embedded recipe of the task family ``made`` (a :class:`TaskFamily`): its
    ``embedded_recipe_defaults`` over the dataclasses' defaults, with ``fields`` changed
    (shared fields and the family's options alike, by name).

    Raises:
        ConfigError: A field the recipe does not have (the message lists them).
    """
    options = recipe_options_of(made)
    chosen = typed_recipe_fields({**made.embedded_recipe_defaults(), **fields}, options)
    own = {f.name for f in dataclasses.fields(options)}
    return EmbeddedRecipe(**{k: v for k, v in chosen.items() if k not in own},
                          options=options(**{k: v for k, v in chosen.items() if k in own}))


def family_recipe(family: str, **fields: Any) -> EmbeddedRecipe:
    """The task ``family``'s embedded recipe (:func:`recipe_for` of the family named so).

    Raises:
        ConfigError: A field the recipe does not have (the message lists them).
    """
    from dreamgym_agents.episodes.env import make_family

    made = make_family(family)
    try:
        return recipe_for(made, **fields)
    finally:
        made.close()


def embedded_dream(family: Any, *, recipe: EmbeddedRecipe | None = None,
                   progress: Progress | None = None, **options: Any) -> Any:
    """The embedded experience model of ``family`` (a :class:`TaskFamily`) and its buffer,
    opened as a :class:`~dreamgym_agents.experience.dream.Dream` (the shipped bundle's, else
    built on first use: :func:`ensure_embedded_experience_model`); ``options`` go to
    ``Dream``."""
    from dreamgym_agents.experience.dream import Dream

    paths = ensure_embedded_experience_model(family.name.split(".", 1)[0],
                                             recipe or recipe_for(family), progress=progress)
    return Dream(family, paths["model"], paths["buffer"], **options)


def embedded_dir(recipe: EmbeddedRecipe, family: str) -> Path:
    """Where ``family``'s embedded experience model of ``recipe`` is built and cached."""
    return cache_root() / family / recipe.key


def collect_dir(recipe: EmbeddedRecipe, family: str) -> Path:
    """Where ``family``'s collection of ``recipe`` is cached (shared by the ablations)."""
    return cache_root() / family / recipe.collect_key


def is_ready(recipe: EmbeddedRecipe, family: str) -> bool:
    return (embedded_dir(recipe, family) / "READY").exists()


Progress = Callable[[str], None]
Tick = Callable[..., None]
"""A progress bar's tick: ``tick(advance=1, item=None)``."""


def ensure_embedded_experience_model(
    family: str, recipe: EmbeddedRecipe | None = None, *, progress: Progress | None = None,
    on_episode: Callable[[Any], None] | None = None,
) -> dict[str, str]:
    """The embedded experience model of the task ``family`` and ``recipe`` (default: the
    family's recipe, :func:`family_recipe`): the family's shipped bundle's when it was built
    with this recipe (the buffer made from its seed episodes on first use, in seconds), else
    built here on first use and cached.

    Returns:
        ``{"model": "hf/<checkpoint>", "checkpoint": ..., "buffer": <buffer dir>,
        "offline": <the episodes it was trained on: a folder of collectors' runs or a bundle's
        episodes file>}`` plus ``"bundle"`` (the bundle's id) when it comes from a bundle.

    Raises:
        PartialBuildError: never here (no time budget); see :func:`train_embedded`.
    """
    from dreamgym_agents.pipeline.bundle import shipped_bundle

    recipe = recipe or family_recipe(family)
    say = progress or (lambda msg: logger.info("%s", msg))
    bundle = shipped_bundle(family)
    if bundle is not None and bundle.experience_key == recipe.key:
        return bundle.experience_paths(progress=say)
    folder = embedded_dir(recipe, family)
    paths = {"checkpoint": str(folder / "model"), "model": f"hf/{folder / 'model'}",
             "buffer": str(folder / "buffer"), "offline": str(collect_dir(recipe, family))}
    if is_ready(recipe, family):
        return paths
    if bundle is not None and recipe == family_recipe(family, seed=recipe.seed):
        say(f"the shipped bundle {bundle.id} was built with another recipe "
            f"({bundle.experience_key}, this code's is {recipe.key}): building this one "
            "(rebuild the bundle with dg-agents build-embedded)")
    with build_lock(folder):
        if is_ready(recipe, family):
            return paths
        start = time.perf_counter()
        shared = collect_dir(recipe, family)
        with build_lock(shared):
            if (shared / "COMPLETE").exists():
                say(f"embedded experience model: reusing the episodes collected in {shared}")
            else:
                collect(recipe, shared, family, say=say, on_episode=on_episode)
        episodes = collected_episodes(recipe, shared, family)
        collect_s = time.perf_counter() - start
        manifest = train_embedded(recipe, episodes, folder, family, say=say)
        (folder / "READY").write_text(json.dumps(
            {"recipe": recipe.fields(),
             "timings": {"collect_s": round(collect_s, 1), **manifest["timings"],
                         "total_s": round(time.perf_counter() - start, 1)}},
            indent=2, sort_keys=True))
    return paths


def collect(recipe: EmbeddedRecipe, folder: Path, family: str, *, say: Progress,
            on_episode: Callable[[Any], None] | None = None,
            bar: Callable[[str, int], Tick] | None = None) -> None:
    """Play every collector of the recipe (the ``family``'s ``collection_plan``) on the
    family's train split into ``folder/<collector>`` (resumable: recorded episodes stay), then
    mark ``COMPLETE``."""
    from dreamgym_agents.episodes.env import EnvConfig, make_family
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes

    made = make_family(family)
    env_cfg = EnvConfig(max_steps=recipe.max_steps, seed=recipe.seed)
    try:
        plan = made.collection_plan(recipe, made.load_tasks("train"))
        everything = list({t.task_id: t for _, _, pool, _ in plan for t in pool}.values())
        say(f"embedded experience model: collecting {len(everything)} train tasks' episodes "
            f"({made.prepare(env_cfg, everything)})")
        for name, agent, chosen, max_steps in plan:
            say(f"  {name}: {len(chosen)} episodes")
            tick = bar(f"collect {name}", len(chosen)) if bar else None
            run_cfg = RunConfig(out_dir=folder / name, concurrency=recipe.concurrency,
                                max_steps=max_steps,
                                meta={"command": "embedded-collect", "agent": name,
                                      "collect": recipe.collect_key})

            def done(traj: Any, tick: Tick | None = tick) -> None:
                if tick is not None:
                    tick(1, traj)
                if on_episode is not None:
                    on_episode(traj)

            result = asyncio.run(run_episodes(chosen, lambda: made.make_env(env_cfg), agent,
                                              run_cfg, on_episode=done))
            # never a collection with episodes quietly missing (a game that can never be
            # played is left out, and said)
            result.check(name, folder / name / "errors.jsonl")
    finally:
        made.close()
    (folder / "COMPLETE").write_text(json.dumps({"collect": recipe.collect_key}, sort_keys=True))


def collected_episodes(recipe: EmbeddedRecipe, folder: Path, family: str) -> list[Any]:
    """The collection's episodes, every collector's (the ``family``'s) in a fixed order, as
    offline data."""
    from dreamgym_agents.episodes.env import make_family

    del recipe  # a family's recipes have the same collectors; it names whose folder it is
    made = make_family(family)
    try:
        episodes = read_collected(folder, list(made.collectors))
    finally:
        made.close()
    for traj in episodes:
        traj.provenance = "offline"
        for t in traj.transitions:
            t.provenance = "offline"
    return episodes


def train_embedded(recipe: EmbeddedRecipe, episodes: list[Any], folder: Path, family: str, *,
                   say: Progress, on_step: Tick | None = None,
                   time_budget_s: float | None = None,
                   sft_seed: int | None = None) -> dict[str, Any]:
    """Annotate the episodes, seed ``folder/buffer`` with them and train the experience model
    into ``folder/model`` for the recipe's fixed steps; return the training manifest.

    ``sft_seed`` seeds the model's initialisation and data order only (None: the recipe's
    seed, which also draws the examples): how a recipe's spread across training seeds is
    measured (``benchmarks/experience_seeds.py``).

    Raises:
        PartialBuildError: ``time_budget_s`` stopped training before the recipe's steps (the
            model is saved but marked ``PARTIAL``: it is not the recipe's model).
    """
    from dreamgym_agents.episodes.env import make_family

    made = make_family(family)
    try:
        return _train_embedded(recipe, episodes, folder, family, made, say=say, on_step=on_step,
                               time_budget_s=time_budget_s, sft_seed=sft_seed)
    finally:
        made.close()


def _train_embedded(recipe: EmbeddedRecipe, episodes: list[Any], folder: Path, family: str,
                    made: Any, *,
                    say: Progress, on_step: Callable[..., None] | None,
                    time_budget_s: float | None, sft_seed: int | None) -> dict[str, Any]:
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.errors import PartialBuildError
    from dreamgym_agents.experience.data import ExampleConfig
    from dreamgym_agents.experience.sft import ExperienceSFTConfig
    from dreamgym_agents.experience.training import train_from_trajectories
    from dreamgym_agents.heldout import HeldOut

    held_out = HeldOut.for_family(made)
    episodes = held_out.keep(episodes, "experience_data")  # none, on the train split
    steps = sum(len(t.transitions) for t in episodes)
    renamed = held_out.keep(renamed_copies(family, episodes, recipe.entity_swaps, recipe.seed),
                            "experience_data")
    say(f"  training the experience model on {len(episodes)} episodes ({steps} transitions"
        + (f", and {len(renamed)} renamed copies" if renamed else "")
        + f"): {recipe.sft_steps} SFT steps")
    (folder / "PARTIAL").unlink(missing_ok=True)
    buffer = ReplayBuffer(BufferConfig(path=str(folder / "buffer"), family=family), made)
    try:
        buffer.clear()
        manifest = train_from_trajectories(
            episodes, buffer,
            ExampleConfig(max_examples=recipe.max_examples, seed=recipe.seed,
                          use_history=recipe.use_history, use_retrieval=recipe.use_retrieval,
                          use_reasoning=recipe.use_reasoning,
                          final_answer_repeat=recipe.final_answer_repeat,
                          judge_repeat=recipe.judge_repeat,
                          contrast_repeat=max(1, recipe.contrast_repeat)),
            ExperienceSFTConfig(
                output_dir=str(folder / "model"), vocab_size=recipe.vocab_size,
                hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                max_length=recipe.max_length, max_steps=recipe.sft_steps,
                batch_size=recipe.batch_size, learning_rate=recipe.learning_rate,
                decision_weight=recipe.decision_weight, time_budget_s=time_budget_s,
                checkpoint_every=CHECKPOINT_EVERY,
                seed=recipe.seed if sft_seed is None else sft_seed),
            counterfactual_answers=recipe.counterfactual_answers,
            counterfactual_stops=recipe.counterfactual_stops,
            codec_version=recipe.codec_version or None,
            renamed=renamed,
            on_step=on_step,
            family=made,
        )
    finally:
        buffer.close()
    manifest["held_out_rejected"] = held_out.rejected["experience_data"]
    say(f"  trained: loss {manifest['first_loss']:.3f} → {manifest['last_loss']:.3f} in "
        f"{manifest['steps']} steps, {manifest['timings'].get('sft_s', 0):.0f} s")
    if manifest["steps"] < recipe.sft_steps:
        (folder / "PARTIAL").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        raise PartialBuildError(
            f"the time budget stopped the experience model at step {manifest['steps']} of "
            f"{recipe.sft_steps}: {folder} is marked partial and is not the recipe's model "
            "(rerun without the budget to finish it)")
    return manifest


def renamed_copies(family: str, episodes: list[Any], copies: int, seed: int) -> list[Any]:
    """``copies`` renamed copies of each episode (the ``family``'s ``renamed``; none at 0).

    Raises:
        ConfigError: ``copies`` > 0 and the family cannot rename its episodes.
    """
    from dreamgym_agents.episodes.env import make_family

    if copies < 1:
        return []
    made = make_family(family)
    try:
        rename = getattr(made, "renamed", None)
        if rename is None:
            raise ConfigError(f"the {family} family cannot rename its episodes: set "
                              "experience_recipe.entity_swaps to 0")
        return list(rename(episodes, copies, seed))
    finally:
        made.close()


CHECKPOINT_EVERY = 100
"""SFT steps between resumable checkpoints of an embedded build (a killed build resumes)."""

DEMOS_VERSION = 1
"""Bumped whenever what a cached set of oracle demonstrations holds changes."""


def demos_dir(family: str, tasks: int | None, seed: int = 0, split: str = "train") -> Path:
    """Where ``family``'s oracle demonstrations on ``tasks`` tasks of ``split`` (None: all)
    are cached."""
    return cache_root() / family / demos_name(tasks, seed, split)


def demos_name(tasks: int | None, seed: int = 0, split: str = "train") -> str:
    """The name of the demonstrations on ``tasks`` tasks of ``split`` (None: all): it changes
    with what they hold. The ``train`` split adds nothing to it, so cached train
    demonstrations keep their names."""
    where = "" if split == "train" else f"-{split}"
    return f"demos-v{DEMOS_VERSION}-seed{seed}{where}-{'all' if tasks is None else tasks}"


def ensure_demos(family: str, tasks: int | None = None, *, seed: int = 0,
                 concurrency: int = 4, max_steps: int = 15, progress: Progress | None = None,
                 bar: Callable[[str, int], Tick] | None = None,
                 folder: Path | None = None, split: str = "train") -> Path:
    """Play the ``family``'s oracle on ``tasks`` of its ``split`` tasks, spread over the
    templates, unless done; return the folder (default: cached under :func:`demos_dir`).

    ``split`` is the train split or another trainable one, such as ALFWorld's official
    ``valid_train``. ``tasks`` None: every task of the split the oracle can play, that is one
    with an oracle program, or any when the oracle follows the environment's expert.

    These are the policy's demonstrations (what the warm start imitates): the experience
    model's collection plays the oracle on a hundred tasks only, and a policy trained from
    scratch on so few memorises their strings instead of learning to copy them. Resumable:
    recorded episodes stay when a collection is interrupted. ``bar(label, total)`` makes the
    progress bar once the number of tasks is known.
    """
    from dreamgym_agents.episodes.env import EnvConfig, make_family, spread_tasks
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes

    folder = folder or demos_dir(family, tasks, seed, split)
    say = progress or (lambda msg: logger.info("%s", msg))
    with build_lock(folder):
        if (folder / "COMPLETE").exists():
            return folder
        made = make_family(family)
        env_cfg = EnvConfig(max_steps=max_steps, seed=seed)
        try:
            oracle = made.offline_agents(seed=seed)["oracle"]
            expert = bool(getattr(oracle, "needs_expert", False))
            pool = [t for t in made.load_tasks(split) if t.oracle or expert]
            chosen = spread_tasks(pool, tasks) if tasks is not None else pool
            say(f"policy demonstrations: the oracle on {len(chosen)} {split} tasks "
                f"({made.prepare(env_cfg, chosen)}) → {folder}")
            run_cfg = RunConfig(out_dir=folder / "oracle", concurrency=concurrency,
                                max_steps=max_steps,
                                meta={"command": "embedded-demos", "tasks": tasks, "seed": seed,
                                      **({"split": split} if split != "train" else {})})
            tick = bar("demonstrations", len(chosen)) if bar is not None else None
            result = asyncio.run(run_episodes(
                chosen, lambda: made.make_env(env_cfg), oracle, run_cfg,
                on_episode=None if tick is None else (lambda t: tick(1, t))))
        finally:
            made.close()
        result.check("demonstration", folder / "oracle" / "errors.jsonl")
        (folder / "COMPLETE").write_text(json.dumps(result.summary, sort_keys=True))
    return folder


def warm_start_excluded(family: Any, demos: bool = True) -> tuple[str, ...]:
    """The collectors whose episodes a warm start of the ``family`` (a made one) does not learn
    from: the oracle's when demonstrations replace them, and the family's optional
    ``experience_only`` (near misses made for the experience model)."""
    return (("oracle",) if demos else ()) + tuple(getattr(family, "experience_only", ()))


def read_collected(folder: Path, names: list[str]) -> list[Any]:
    """The collected episodes of each collector in ``names`` (those recorded), in a fixed
    order: concurrent episodes are written as they finish, and the order of the training data
    (hence the trained weights) must not depend on which finished first."""
    from dreamgym_agents.episodes.graph import TRAJECTORIES_FILE
    from dreamgym_agents.types import read_trajectories

    out: list[Any] = []
    for name in names:
        path = folder / name / TRAJECTORIES_FILE
        if path.exists():
            out.extend(sorted(read_trajectories(path), key=lambda t: t.episode_id))
    return out
