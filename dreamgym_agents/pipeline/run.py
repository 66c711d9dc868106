"""``dg-agents run``: the whole DreamGym pipeline, stage by stage, resumable.

Each stage's result is recorded in ``DIR/state.json`` when it finishes. A rerun of the same
command skips finished stages and starts the interrupted one again: an evaluation resumes episode
by episode, a training stage restarts and keeps the interrupted attempt's records in
``stages/<stage>.interrupted-<n>/``. The stages:

1. ``experience``: the offline data and the experience model (the embedded default is built on
   first use and cached; a LiteLLM model string is used as given).
2. ``sft``: the policy's warm start on the offline data's successful episodes.
3. ``eval_sft``: the warm-started policy on the real test split.
4. ``dream_rl``: multi-turn GRPO in the dream, with the curriculum (0 real transitions).
5. ``eval_dream``: the dream-trained policy on the real test split.
6. ``s2r``: sim-to-real, GRPO on the real site for a budget of real transitions (optional).
7. ``eval_s2r``: the sim-to-real policy on the real test split.
8. ``report``: ``summary.json``, ``report.md`` and ``success_vs_real.png``.

``DIR`` also holds ``config.json`` (a rerun with other settings is refused), ``checkpoints/``,
``metrics.jsonl`` and each stage's records under ``stages/`` and ``eval/``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dreamgym_agents import tracking
from dreamgym_agents.errors import ConfigError, PartialBuildError
from dreamgym_agents.experience.dream import REWARD_SOURCES
from dreamgym_agents.experience.refresh import ExperienceRefreshConfig
from dreamgym_agents.optimize.agent import OptimizeConfig
from dreamgym_agents.policy.model import PolicyConfig, PolicyModel, view_record
from dreamgym_agents.policy.sft import PolicySFTConfig
from dreamgym_agents.rl.curriculum import CurriculumConfig
from dreamgym_agents.rl.grpo import GRPOStageConfig

logger = logging.getLogger(__name__)

STAGES = ("experience", "sft", "eval_sft", "dream_rl", "eval_dream", "s2r", "eval_s2r", "report")
STATE_FILE = "state.json"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
PRESETS = ("quick", "full")
WARM_START_VERSION = 4
"""Bumped whenever the policy's layout or SFT changes what a cached warm start is."""


@dataclass
class PipelineConfig:
    """Everything ``dg-agents run`` does (``--set section.key=value`` reaches every field).

    Attributes:
        task: Task family (``webarena``, ``alfworld``, ``tau2.retail``, a registered one's
            name); no default: the CLI's ``--task`` says it.
        preset: ``quick`` (minutes, a subset of the test split) or ``full``.
        seed: Seed of the policy's initialisation, task order and sampling.
        policy: ``embedded`` (a small policy trained here) or ``hf/<checkpoint>``
            (a local transformers checkpoint to fine-tune).
        policy_init: Where the embedded policy starts: ``experience``, the embedded experience
            model's weights, or ``scratch``, a fresh model. The experience model is the one
            language model here that has read the environment's states and actions, so it fits
            the demonstrations faster than a fresh one.
        experience_model: ``embedded``, or the model that plays the dream instead: a checkpoint
            trained here (``hf/<dir>``, prompted as its manifest says) or any LiteLLM model
            string. The offline data and the warm start stay the embedded recipe's.
        experience_buffer: The replay buffer folder that model retrieves from (None: the
            embedded one).
        experience_recipe: Fields of the embedded experience model's recipe to change
            (:class:`~dreamgym_agents.pipeline.embedded.EmbeddedRecipe`), e.g.
            ``{oracle_tasks: 3, sft_steps: 10}`` for a tiny one. A changed recipe builds and
            caches another model.
        demo_tasks: Train tasks whose oracle demonstrations join the offline data the warm
            start imitates, spread over the templates. None: every train task; 0: none, the
            warm start learns from the experience model's collection alone. Cached.
        train_split: The split the run trains on: its demonstrations, its RL stages' tasks
            and the curriculum's seeds, and the real steps its buffer learns from. ALFWorld
            also has ``valid_train`` and ``official_train``, its official training games (with
            ``ALFWORLD_DATA``). Never a held-out split. The experience model's collection
            stays the embedded recipe's.
        use_retrieval: Ablation: the experience model retrieves no real transitions.
        use_reasoning: Ablation: the experience model writes no reasoning.
        tracking: Where the run's figures and its trainers' logs also go as they come:
            ``none`` (``metrics.jsonl`` only), ``tensorboard`` (event files in
            ``DIR/tracking``), ``wandb`` (an offline W&B run there) or ``trackio`` (a local
            trackio run): :mod:`~dreamgym_agents.tracking`. What a run shows, not what it
            computes: a run resumes under another tracking.
        eval_split: The split the evaluations read: ``test`` for reported figures,
            ``validation`` while tuning (settings, recipes, design choices), so that the test
            split is not tuned on. Training never sees either (:mod:`dreamgym_agents.heldout`).
        eval_limit: Tasks evaluated, spread over the templates (None: the whole split).
        eval_concurrency: Real episodes at once in evaluations.
        eval_max_steps: Episode length limit of evaluations.
        dream_eval_types: The dream trains on the train tasks whose evaluators are all of these
            kinds of the family's (``TaskFamily.eval_types``; None: every task; tasks without
            evaluators always qualify). ``"family"`` (the default): the family's own choice,
            ``TaskFamily.dream_eval_types``. For webarena that is answers and URLs, not
            ``program_html``, whose outcome is the site's hidden state; for alfworld every task.
            Sim-to-real and GRPO-real train on every task.
        reuse_bundle_eval: The warm start's evaluation (``eval_sft``) reuses the episodes the
            embedded bundle's build played with the same policy on the same test tasks (greedy,
            same step limit and view: the same episodes, identical when played again), when the
            run's warm start is the bundle's and every evaluated task is among them; False
            plays them again.
        reuse_same_policy_eval: An RL stage whose stop rule handed on its starting policy
            (validation kept step 0: the same weights) is evaluated by the episodes of its
            start's evaluation (``eval_dream`` by ``eval_sft``'s, ``eval_s2r`` by
            ``eval_dream``'s), not played again; False plays them again.
        dream_reward: Who rewards the dream's steps (``DreamConfig.reward``): ``model``, the
            experience model (the method), or ``state``, the family's check of the predicted state
            (a declared variant; the bench's ``state_reward`` row).
        dream_verdicts: Where the family judges a dream step by the task's own reference
            (``DreamConfig.verdicts``: a web answer by its evaluator, a stop's URL against the
            reference URL), that verdict replaces the experience model's; False: the model's
            verdicts alone.
        sim_to_real: Run the sim-to-real stages.
        real_rl: Train on the real site instead of the dream: the GRPO-real baseline. The
            ``dream_rl`` stage then plays real episodes, within ``dream.real_transition_budget``.
        sft: The warm start.
        dream: GRPO in the dream.
        s2r: GRPO on the real site (``real_transition_budget`` is the sim-to-real budget).
        curriculum: Task variants in the dream (λ, seeds per round …).
        policy_view: How the policy sees a turn.
        buffer_real: Every real transition an RL stage plays on a train task enters the run's
            own buffer (``DIR/buffer``, copied from the experience model's on first use), with
            the stage that played it; the dream retrieves it from the next step on
            (:mod:`~dreamgym_agents.pipeline.coevolve`). Validation and test tasks never enter.
        buffer_dream: The dream's rollouts enter the run's buffer too, as ``synthetic``
            records (retrieved only with ``dream_retrieves_synthetic``).
        dream_retrieves_synthetic: The experience model's retrieval shows synthetic records
            (the dream's own transitions) beside the recorded ones.
        experience_refresh: The experience model's Dyna schedule: fine-tuned on the run's fresh
            real transitions during and after the stages that play real episodes
            (:class:`~dreamgym_agents.experience.refresh.ExperienceRefreshConfig`).
        calibrate_limit: Validation tasks on which each RL stage's starting and final policies
            are played in the dream and compared with their real episodes
            (:mod:`~dreamgym_agents.experience.calibration`). The real episodes are the stop
            rule's where it played them, else played and counted apart. 0 or None: no
            calibration.
        policy_llm: A hosted policy's gateway settings, fields of
            :class:`~dreamgym_agents.gateway.llm.LLMConfig` (``api_base``, ``api_key_env``,
            ``temperature`` …).
        prompt: A hosted policy's prompt learning (:mod:`dreamgym_agents.pipeline.prompt_run`):
            GEPA's dream episodes (``budget``), worked examples, train and validation tasks,
            episode length; its sim-to-real search plays real episodes within
            ``s2r.real_transition_budget``.
    """

    task: str = ""
    preset: str = "quick"
    seed: int = 0
    policy: str = "embedded"
    policy_init: str = "experience"
    experience_model: str = "embedded"
    experience_buffer: str | None = None
    experience_recipe: dict[str, Any] = field(default_factory=dict)
    demo_tasks: int | None = None
    train_split: str = "train"
    use_retrieval: bool = True
    use_reasoning: bool = True
    eval_split: str = "test"
    eval_limit: int | None = None
    tracking: str = "none"
    eval_concurrency: int = 4
    eval_max_steps: int = 15
    dream_eval_types: list[str] | str | None = "family"
    reuse_bundle_eval: bool = True
    reuse_same_policy_eval: bool = True
    dream_reward: str = "model"
    dream_verdicts: bool = True
    sim_to_real: bool = True
    real_rl: bool = False
    sft: PolicySFTConfig = field(default_factory=PolicySFTConfig)
    dream: GRPOStageConfig = field(default_factory=GRPOStageConfig)
    s2r: GRPOStageConfig = field(default_factory=lambda: GRPOStageConfig(
        concurrency=4, real_transition_budget=200))
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    policy_view: PolicyConfig = field(default_factory=PolicyConfig)
    buffer_real: bool = True
    buffer_dream: bool = False
    dream_retrieves_synthetic: bool = False
    experience_refresh: ExperienceRefreshConfig = field(default_factory=ExperienceRefreshConfig)
    calibrate_limit: int | None = 31
    policy_llm: dict[str, Any] = field(default_factory=dict)
    prompt: OptimizeConfig = field(default_factory=OptimizeConfig)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}: use quick or full")
        tracking.check_kind(self.tracking)
        if self.eval_split not in ("validation", "test"):
            raise ConfigError(f"eval_split must be validation (while tuning) or test (reported "
                              f"figures), got {self.eval_split!r}")
        if self.dream_reward not in REWARD_SOURCES:
            raise ConfigError(f"dream_reward must be one of {', '.join(REWARD_SOURCES)}, got "
                              f"{self.dream_reward!r}")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise ConfigError(f"eval_limit must be at least 1, got {self.eval_limit}")
        if self.calibrate_limit is not None and self.calibrate_limit < 0:
            raise ConfigError(f"calibrate_limit must be >= 0 (0: no calibration), got "
                              f"{self.calibrate_limit}")
        if self.policy_init not in ("experience", "scratch"):
            raise ConfigError(f"policy_init must be experience or scratch, got "
                              f"{self.policy_init!r}")
        if self.demo_tasks is not None and self.demo_tasks < 0:
            raise ConfigError(f"demo_tasks must be >= 0 (None: every train task), got "
                              f"{self.demo_tasks}")
        if self.train_split in ("validation", "test"):
            raise ConfigError(f"train_split {self.train_split!r} is held out: a run never "
                              "trains on its validation or test tasks")
        if self.eval_concurrency < 1 or self.eval_max_steps < 1:
            raise ConfigError("eval_concurrency and eval_max_steps must be at least 1")
        if self.experience_model != "embedded":
            from dreamgym_agents.gateway.llm import check_model_string

            check_model_string(self.experience_model)
        elif self.experience_buffer is not None:
            raise ConfigError("experience_buffer is the buffer of another experience_model; the "
                              "embedded one has its own")
        if self.experience_buffer is not None and not Path(self.experience_buffer).is_dir():
            raise ConfigError(f"experience_buffer {self.experience_buffer} is not a folder (a "
                              "buffer that dg-agents train-experience or buffer seed made)")

        from dreamgym_agents.pipeline.embedded import recipe_options_of, typed_recipe_fields
        from dreamgym_agents.policy.model import typed_view_options

        known_types: tuple[str, ...] = ()
        options = None
        checks_types = self.dream_eval_types not in (None, "family")
        if self.task and (self.experience_recipe or checks_types or self.policy_view.options):
            from dreamgym_agents.episodes.env import make_family

            made = make_family(self.task)
            try:
                options, known_types = recipe_options_of(made), tuple(made.eval_types)
                self.policy_view.options = typed_view_options(
                    getattr(made, "view_options", None), self.policy_view, "policy_view.")
            finally:
                made.close()
        # the run sets these two itself
        if "use_retrieval" in self.experience_recipe or "use_reasoning" in self.experience_recipe:
            raise ConfigError("experience_recipe.use_retrieval and use_reasoning are the run's "
                              "own flags (ablations): set those instead")
        self.experience_recipe = typed_recipe_fields(self.experience_recipe, options)
        if self.task and checks_types:
            chosen = self.dream_eval_types
            unknown = sorted(set(chosen) - set(known_types)) if isinstance(chosen, list) \
                else [chosen]
            if unknown or not chosen:
                raise ConfigError(f"dream_eval_types must list some of {', '.join(known_types)} "
                                  f"(or be null for every task, or family for the {self.task} "
                                  f"family's choice), got {chosen}")
        if self.sft.lora_r and self.sft.base_model is None and not (
                self.policy.startswith("hf/") or self.policy_init == "experience"):
            # --policy fills sft.base_model only when the warm start runs: checked here, not
            # where sft.* is parsed
            from dreamgym_agents.policy.sft import LORA_NEEDS_A_BASE

            raise ConfigError(LORA_NEEDS_A_BASE)
        if self.sim_to_real and self.s2r.real_transition_budget is None:
            raise ConfigError("s2r.real_transition_budget must be set: sim-to-real uses a "
                              "bounded number of real transitions")


WARM_START_STEPS = 1800
"""SFT steps of both presets' warm start; one cached build serves both. Fewer steps leave the
copying of task strings unlearnt (evidence: docs/history/results-2026-11-to-12.md)."""
WARM_START_LR = 1e-3
"""SFT's peak learning rate for the embedded policy started from the experience model."""
RL_LR = 2e-4
"""GRPO's learning rate for the embedded policy (its SFT peaks at ``WARM_START_LR``)."""


PRETRAINED_SFT_LR = 1e-4
"""SFT's learning rate for a pretrained checkpoint (``--policy hf/…``): the embedded policy's
1e-3, tuned for 2M parameters trained from nearly nothing, would wreck what it knows."""
PRETRAINED_SFT_STEPS = 300
"""SFT steps for a pretrained checkpoint: it knows language, and learns the action format from
a few hundred batches (``benchmarks/pretrained_policy.py`` measures it)."""
PRETRAINED_RL_LR = 5e-6
"""GRPO's learning rate for a pretrained checkpoint (full or LoRA)."""


def pretrained_defaults(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with the settings a pretrained checkpoint trains at (its policy ``hf/…``),
    before a config file and ``--set`` apply: learning rates and SFT steps, no entity swaps
    (a pretrained model copies from its context already), the state's commands listed in
    each turn where the family knows them."""
    cfg.sft.learning_rate = PRETRAINED_SFT_LR
    cfg.sft.max_steps = PRETRAINED_SFT_STEPS
    cfg.sft.entity_swaps = 0
    cfg.policy_view.show_options = True  # copy a command the state accepts, where listed
    for stage in (cfg.dream, cfg.s2r):
        stage.learning_rate = PRETRAINED_RL_LR
    return cfg


QUICK_DREAM_BATCHES = 16
"""Dream GRPO batches of the quick preset (16 episodes each: 256 dream episodes), validated at
the start, half-way and at the end (``QUICK_VALIDATE_EVERY``); what the local engine's speed
buys within a cold ``make run`` (its time: docs/RESULTS.md, "Cold start")."""
QUICK_VALIDATE_EVERY = 8
VALIDATE_LIMIT = 31
"""Validation tasks of the presets' stop rule and calibration (the same tasks: the stop rule's
real episodes are the calibration's real side)."""

RL_EPISODE_STEPS = 10
"""Step limit of an RL episode in the presets, unless the family says (``rl_episode_steps``)."""


def preset_config(preset: str, seed: int = 0, task: str | None = None) -> PipelineConfig:
    """The settings of a preset, for the family of ``task`` when given.

    ``quick``: 31 test tasks per evaluation and :data:`QUICK_DREAM_BATCHES` GRPO batches per
    dream stage, minutes once the experience model, demonstrations and warm start are cached.
    ``full``: the whole test split, 40 batches per stage. ``task`` is the run's task; its
    family's optional ``rl_episode_steps`` replaces :data:`RL_EPISODE_STEPS`."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}: use quick or full")
    quick = preset == "quick"
    steps = QUICK_DREAM_BATCHES if quick else 40
    episode_steps = RL_EPISODE_STEPS
    if task is not None:
        from dreamgym_agents.episodes.env import family_part

        episode_steps = family_part(task, lambda f: getattr(f, "rl_episode_steps", None)) \
            or RL_EPISODE_STEPS

    def rl(concurrency: int, budget: int | None = None, batches: int = steps,
           validate: int = QUICK_VALIDATE_EVERY if quick else 10) -> GRPOStageConfig:
        # validation is every stage's stop rule: it never hands on a policy below its start
        return GRPOStageConfig(max_steps=batches, tasks_per_step=4, num_generations=4,
                               max_episode_steps=episode_steps, learning_rate=RL_LR,
                               concurrency=concurrency, real_transition_budget=budget, seed=seed,
                               validate_every=validate, validate_limit=VALIDATE_LIMIT)

    return PipelineConfig(
        task=task or PipelineConfig.task, preset=preset, seed=seed,
        eval_limit=31 if quick else None,
        sft=PolicySFTConfig(max_steps=WARM_START_STEPS, learning_rate=WARM_START_LR, seed=seed),
        dream=rl(16), s2r=rl(4, 120 if quick else 400, batches=8 if quick else 40,
                             validate=8 if quick else 10),
        curriculum=CurriculumConfig(), calibrate_limit=VALIDATE_LIMIT,
    )


class Reporter(Protocol):
    """How a run shows its progress (the CLI draws rich bars; tests record calls)."""

    def stage(self, name: str, index: int, total: int) -> None: ...

    def bar(self, label: str, total: int) -> Callable[..., None]: ...

    def say(self, message: str) -> None: ...


class SilentReporter:
    """A reporter that logs only (library use, tests)."""

    def stage(self, name: str, index: int, total: int) -> None:
        logger.info("stage %d/%d: %s", index, total, name)

    def bar(self, label: str, total: int) -> Callable[..., None]:
        return lambda *args, **kwargs: None

    def say(self, message: str) -> None:
        logger.info("%s", message)


class FileReporter:
    """A reporter that appends timed plain lines to a file: a stage's start, each tenth of a
    bar (an RL batch's rollout success with it), messages (a bench run in a worker process)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _line(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{time.strftime('%H:%M:%S')} {text}\n")

    def stage(self, name: str, index: int, total: int) -> None:
        self._line(f"stage {index}/{total}: {name}")

    def bar(self, label: str, total: int) -> Callable[..., None]:
        done, shown = [0], [0]

        def tick(advance: int = 1, item: Any = None) -> None:
            done[0] += int(advance)
            tenth = done[0] * 10 // total if total else done[0]
            if tenth > shown[0]:
                shown[0] = tenth
                figures = f", rollout success {item['rollout/success']:.2f}" \
                    if isinstance(item, dict) and "rollout/success" in item else ""
                self._line(f"{label}: {done[0]}/{total or '?'}{figures}")
        return tick

    def say(self, message: str) -> None:
        self._line(message)


def is_hosted(policy: str) -> bool:
    """True for a policy whose weights a run cannot update (a hosted or served model)."""
    return policy not in ("embedded",) and not policy.startswith("hf/")


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


class Pipeline:
    """One run folder and its stages (see the module docstring). A hosted policy learns a
    prompt instead, in a :class:`~dreamgym_agents.pipeline.prompt_run.PromptPipeline`;
    :func:`~dreamgym_agents.pipeline.prompt_run.make_pipeline` picks the class."""

    learns_prompts = False

    def __init__(self, cfg: PipelineConfig, out: str | Path,
                 reporter: Reporter | None = None,
                 adopt: dict[str, dict[str, Any]] | None = None,
                 rerun_from: str | None = None) -> None:
        if is_hosted(cfg.policy) != self.learns_prompts:
            raise ConfigError(f"policy {cfg.policy!r}: {type(self).__name__} is for "
                              f"{'hosted' if self.learns_prompts else 'local'} policies (use "
                              "make_pipeline)")
        if not cfg.task:
            raise ConfigError("a run needs its task family: task is empty (--task NAME, or "
                              "task: NAME in the config file)")
        self.cfg = cfg
        self.out = Path(out)
        self.reporter = reporter or SilentReporter()
        self.state: dict[str, Any] = {"done": {}}
        self.stages = [s for s in STAGES
                       if cfg.sim_to_real or s not in ("s2r", "eval_s2r")]
        self.adopt = adopt or {}
        if rerun_from is not None and rerun_from not in self.stages:
            raise ConfigError(f"--rerun-from {rerun_from}: not a stage of this run; choose from "
                              f"{', '.join(self.stages)}")
        self.rerun_from = rerun_from
        self._family: Any = None
        self._dream: Any = None
        self._held_out: Any = None

    # -- folder ---------------------------------------------------------------------------

    def _open_folder(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        config = json.loads(json.dumps(asdict(self.cfg)))
        path = self.out / CONFIG_FILE
        if path.exists():
            previous = json.loads(path.read_text())
            for key in WATCH_ONLY:  # what the run shows, not what it computes
                previous[key] = config[key]
            if previous != config:
                # a setting added to the code after the run began resumes at its default
                added = added_at_defaults(previous, config)
                if added is None:
                    diff = _diff(previous, config)
                    raise ConfigError(f"{self.out} holds a run with other settings ({diff}): "
                                      "rerun with the same ones to resume, or use another --out "
                                      "folder")
                logger.info("%s: settings added since the run began, at their defaults: %s",
                            self.out, ", ".join(sorted(added)))
                _write_json(path, config)
        else:
            _write_json(path, config)
        state = self.out / STATE_FILE
        if state.exists():
            self.state = json.loads(state.read_text())
        for stage, result in self.adopt.items():  # another run's stages (a bench's warm start)
            self.state["done"].setdefault(stage, {**result, "adopted": True})
        # the code each (re)start of this run ran with; every stage records its own
        from dreamgym_agents.version import code_version

        versions = self.state.setdefault("code", [])
        if not versions or versions[-1] != code_version():
            versions.append(code_version())
        if self.rerun_from is not None:
            self._set_aside_from(self.rerun_from)
        _write_json(self.out / STATE_FILE, self.state)

    def _set_aside_from(self, first: str) -> None:
        """Forget ``first`` and every later stage, their records kept aside
        (``<folder>.before-rerun-<n>``, and ``state.json``'s ``reruns``)."""
        later = self.stages[self.stages.index(first):]
        n = len(self.state.setdefault("reruns", [])) + 1
        previous = {s: self.state["done"].pop(s) for s in later if s in self.state["done"]}
        for sub in ("stages", "eval", "checkpoints"):
            for stage in later:
                folder = self.out / sub / stage
                if folder.exists():
                    folder.rename(folder.with_name(f"{stage}.before-rerun-{n}"))
        self.state["reruns"].append({"from": first, "time": round(time.time(), 1),
                                     "previous": previous})
        self.reporter.say(f"rerunning from {first}: {len(previous)} finished stage(s) set "
                          f"aside (records kept as *.before-rerun-{n})")

    def _finish(self, stage: str, result: dict[str, Any]) -> None:
        from dreamgym_agents.version import code_version

        result.setdefault("code", code_version())
        self.state["done"][stage] = result
        _write_json(self.out / STATE_FILE, self.state)
        self._metric({"stage": stage, "event": "done", **_flat(result)})

    def _metric(self, line: dict[str, Any]) -> None:
        with open(self.out / METRICS_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"time": round(time.time(), 1), **line}) + "\n")
        tracker = tracking.current()
        if tracker is not None and line.get("event") == "done":
            figures = {k: v for k, v in line.items() if k not in ("stage", "event")}
            tracker.log(str(line.get("stage")), figures, len(self.state["done"]))

    def _stage_dir(self, stage: str, resumable: bool = False) -> Path:
        """A fresh folder for a training stage; an interrupted attempt's is kept aside, unless
        the stage is ``resumable`` and the attempt left a resume point
        (:func:`~dreamgym_agents.rl.grpo.resume_point`): then the stage goes on in it."""
        folder = self.out / "stages" / stage
        if resumable and folder.exists():
            from dreamgym_agents.rl.grpo import resume_point

            if resume_point(folder) is not None:
                self.reporter.say(f"{stage}: going on from the interrupted attempt's last "
                                  f"resume point ({folder})")
                return folder
        if folder.exists():
            n = 1
            while (aside := folder.with_name(f"{stage}.interrupted-{n}")).exists():
                n += 1
            folder.rename(aside)
            self.reporter.say(f"{stage}: restarting (the interrupted attempt's records are in "
                              f"{aside})")
        folder.mkdir(parents=True)
        return folder

    # -- stages ---------------------------------------------------------------------------

    def run(self, until: str | None = None) -> dict[str, Any] | None:
        """Run every stage not yet done, or those up to and including ``until`` (a bench runs
        the warm start before its runs fan out); return the summary (None when stopped before
        the report)."""
        if until is not None and until not in self.stages:
            raise ConfigError(f"until={until!r}: not a stage of this run; choose from "
                              f"{', '.join(self.stages)}")
        last = self.stages.index(until) if until is not None else len(self.stages) - 1
        start = time.perf_counter()
        self._open_folder()
        self.state.setdefault("wall_seconds", 0.0)
        try:
            with tracking.active(self.cfg.tracking, self.out / "tracking", self.out.name):
                for i, stage in enumerate(self.stages[:last + 1], 1):
                    if stage in self.state["done"]:
                        continue
                    self.reporter.stage(stage, i, len(self.stages))
                    began = time.perf_counter()
                    result = getattr(self, f"stage_{stage}")()
                    result["seconds"] = round(time.perf_counter() - began, 1)
                    self.state["wall_seconds"] = round(
                        self.state["wall_seconds"] + time.perf_counter() - start, 1)
                    start = time.perf_counter()
                    self._finish(stage, result)
        finally:
            self.close()
        if "report" not in self.state["done"]:
            return None
        return json.loads((self.out / "summary.json").read_text())

    def close(self) -> None:
        if self._dream is not None:
            _, gateway, buffer = self._dream
            buffer.close()
            gateway.close()
            self._dream = None
        if self._family is not None:
            self._family.close()
            self._family = None

    # -- services ---------------------------------------------------------------------------

    def family(self) -> Any:
        """The task family, prepared (the bundled site started) on first use."""
        from dreamgym_agents.episodes.env import make_family

        if self._family is None:
            self._family = make_family(self.cfg.task)
            where = self._family.prepare(self.env_cfg(), None)
            self.reporter.say(f"{self.cfg.task}: {where}")
        return self._family

    def held_out(self) -> Any:
        """The family's validation and test tasks, which no training stage may see
        (:class:`~dreamgym_agents.heldout.HeldOut`; its ``rejected`` counts go to the
        stages' results)."""
        from dreamgym_agents.episodes.env import make_family
        from dreamgym_agents.heldout import HeldOut

        if self._held_out is None:
            tasks_only = make_family(self.cfg.task)  # task files only: no site is started
            try:
                self._held_out = HeldOut.for_family(tasks_only)
            finally:
                tasks_only.close()
        return self._held_out

    def env_cfg(self) -> Any:
        from dreamgym_agents.episodes.env import EnvConfig

        return EnvConfig(max_steps=self.cfg.eval_max_steps)

    def dream(self) -> tuple[Any, Any, Any]:
        """(experience model, its gateway, the run's buffer), opened on first use: the model
        the run dreams with now (a refreshed one once the run has refreshed it), the run's own
        copy of its buffer (:func:`~dreamgym_agents.pipeline.coevolve.run_buffer`)."""
        from dreamgym_agents.episodes.env import make_family
        from dreamgym_agents.experience.dream import Dream
        from dreamgym_agents.pipeline.coevolve import run_buffer

        if self._dream is None:
            done = self.state["done"]["experience"]
            model = self.state.get("experience_now") or done.get("dream_model", done["model"])
            source = done.get("dream_buffer", done["buffer"])
            settings: dict[str, Any] = {
                k: False for k, v in (("use_retrieval", self.cfg.use_retrieval),
                                      ("use_reasoning", self.cfg.use_reasoning)) if not v}
            if self.cfg.dream_retrieves_synthetic:
                settings["retrieval_where"] = {"provenance": {"$in": ["offline", "real",
                                                                      "synthetic"]}}
            dream = Dream(make_family(self.cfg.task), model, str(run_buffer(self.out, source)),
                          concurrency=max(4, self.cfg.dream.concurrency), **settings)
            self._dream = (dream.model, dream.gateway, dream.buffer)
        return self._dream

    def _reopen_dream(self) -> None:
        """Open the dream again (another experience model, the same buffer)."""
        if self._dream is not None:
            _, gateway, buffer = self._dream
            buffer.close()
            gateway.close()
            self._dream = None

    def _buffer_sink(self, stage: str, *, real: bool, fresh: list[Any],
                     start: str) -> Callable[[list[Any]], None] | None:
        """What a stage's batches hand their episodes to; None when nothing is kept.

        The run's buffer takes real ones with ``buffer_real`` and the dream's with
        ``buffer_dream``. Real ones also go to ``fresh``, what the experience model's refresh
        learns from every ``every_batches`` batches, calibrated with the stage's ``start``
        policy."""
        from dreamgym_agents.pipeline.coevolve import for_buffer

        keep = self.cfg.buffer_real if real else self.cfg.buffer_dream
        refresh = self.cfg.experience_refresh
        if not keep:
            return None
        counts = self.state.setdefault("buffer_added", {})
        batches = [0]

        def sink(episodes: list[Any]) -> None:
            kept = for_buffer(episodes, self.held_out(), f"{stage}_buffer",
                              train_split=self.cfg.train_split)
            if not kept:
                return
            _, _, buffer = self.dream()
            added = buffer.add_trajectories(kept, stage=stage)
            counts[stage] = counts.get(stage, 0) + added
            batches[0] += 1
            if not real:
                return
            fresh.extend(kept)
            if refresh.enabled and refresh.every_batches and \
                    batches[0] % refresh.every_batches == 0:
                self._refresh(stage, fresh, start)

        return sink

    def _refresh(self, stage: str, fresh: list[Any], policy: str) -> None:
        """Fine-tune the experience model on ``fresh`` real episodes (emptied after) when there
        are enough of them, and dream with it from now on; calibrated before and after on the
        validation split with ``policy``."""
        from dreamgym_agents.experience.refresh import refresh_experience_model
        from dreamgym_agents.experience.training import read_manifest
        from dreamgym_agents.pipeline.coevolve import fresh_key

        cfg = self.cfg.experience_refresh
        transitions = sum(len(t.transitions) for t in fresh)
        if not cfg.enabled or transitions < cfg.min_transitions:
            return
        model, _, buffer = self.dream()
        current = model.gateway.cfg.model
        records = self.state.setdefault("refreshes", [])
        base = current.removeprefix("hf/")
        if not current.startswith("hf/") or read_manifest(base) is None:
            if not any(r.get("skipped") for r in records):
                self.reporter.say(f"{stage}: the experience model {current} has no weights "
                                  "this run can fine-tune: the buffer grows "
                                  f"({transitions} fresh real transitions), the model does not")
                records.append({"stage": stage, "skipped": "hosted or foreign model",
                                "model": current})
            fresh.clear()
            return
        folder = self.out / "experience" / f"{stage}-refresh-{fresh_key(fresh)}"
        before = self._calibrate(f"{stage}-refresh-before", policy, folder / "before")
        self.reporter.say(f"{stage}: refreshing the experience model on {transitions} fresh "
                          f"real transitions ({len(fresh)} episodes) → {folder}")
        figures = refresh_experience_model(base, list(fresh), self._recorded_episodes(),
                                           buffer, folder, cfg, family=self.family(),
                                           seed=self.cfg.seed)
        self.state["experience_now"] = f"hf/{figures['model']}"
        self._reopen_dream()
        after = self._calibrate(f"{stage}-refresh-after", policy, folder / "after")
        records.append({"stage": stage, **figures, "calibration_before": before,
                        "calibration_after": after})
        _write_json(self.out / STATE_FILE, self.state)
        fresh.clear()

    def _recorded_episodes(self) -> list[Any]:
        """The experience model's recorded data (offline episodes), for a refresh's replay."""
        done = self.state["done"]["experience"]
        return self.held_out().keep(read_offline(done["offline"]), "refresh_replay")

    def _calibrate(self, name: str, policy: str | Path, folder: Path,
                   real_folder: Path | None = None) -> dict[str, Any] | None:
        """The policy in the dream against its real episodes on ``calibrate_limit`` validation
        tasks (its real episodes from ``real_folder``, else played here and counted apart);
        a summary for the stage's record (None: calibration is off)."""
        from dreamgym_agents.experience.calibration import calibrate_policy, summary_line
        from dreamgym_agents.experience.dream import DreamConfig
        from dreamgym_agents.policy.model import PolicyAgent

        if not self.cfg.calibrate_limit:
            return None
        tasks = self.test_tasks("validation", self.cfg.calibrate_limit)
        if not tasks:
            return None
        model, _, buffer = self.dream()
        agent = PolicyAgent(PolicyModel.load(policy, self.cfg.policy_view,
                                             self.family().policy_view()),
                            temperature=0.0, keep_tokens=False, name=f"policy-{name}")
        tick = self.reporter.bar(f"{name} calibration", 2 * len(tasks) if real_folder is None
                                 else len(tasks))
        result = calibrate_policy(
            tasks, agent, self.family(), model, buffer, folder,
            concurrency=max(self.cfg.eval_concurrency, self.cfg.dream.concurrency),
            max_steps=self.cfg.eval_max_steps, real_folder=real_folder,
            dream_cfg=DreamConfig(reward=self.cfg.dream_reward,
                                  verdicts=self.cfg.dream_verdicts),
            meta={"command": "run", "stage": name, "checkpoint": str(policy),
                  "split": "validation", "tasks": len(tasks),
                  "max_steps": self.cfg.eval_max_steps},
            on_episode=lambda t: tick(1, t), trained=self._dream_kinds())
        self.reporter.say(f"{name}: the dream against reality, {len(tasks)} validation "
                          f"tasks: {summary_line(result)}; on the kinds the dream trains on: "
                          f"{summary_line(result, 'trained')}")
        return {"all": result["all"], "trained": result["trained"],
                "by_kind": result["by_kind"], "folder": str(folder),
                "real_transitions": result["real_transitions"]}

    def _dream_kinds(self) -> list[str]:
        """The evaluator kinds the dream trains on (``dream_eval_types`` resolved)."""
        family = self.family()
        kinds = family.dream_eval_types if self.cfg.dream_eval_types == "family" \
            else self.cfg.dream_eval_types
        return list(kinds if kinds is not None else family.eval_types)

    def checkpoint(self, stage: str) -> str:
        return self.state["done"][stage]["path"]

    # -- the stages -----------------------------------------------------------------------

    def stage_experience(self) -> dict[str, Any]:
        from dreamgym_agents.pipeline.embedded import (
            EMBEDDED,
            demos_name,
            ensure_demos,
            ensure_embedded_experience_model,
            family_recipe,
        )

        ablations = {k: False for k, on in (("use_retrieval", self.cfg.use_retrieval),
                                            ("use_reasoning", self.cfg.use_reasoning)) if not on}
        family = self.cfg.task.split(".", 1)[0]
        recipe = family_recipe(family, **{**self.cfg.experience_recipe, **ablations})
        paths = ensure_embedded_experience_model(family, recipe, progress=self.reporter.say)
        done = {"model": paths["model"], "buffer": paths["buffer"], "offline": paths["offline"],
                "recipe": recipe.key, "collect": recipe.collect_key}
        if self.cfg.experience_model != EMBEDDED:  # the dream's own model; the data stays ours
            done["dream_model"] = self.cfg.experience_model
            done["dream_buffer"] = self.cfg.experience_buffer or paths["buffer"]
            self.reporter.say(f"dream: experience model {self.cfg.experience_model}, buffer "
                              f"{done['dream_buffer']}")
        bundle = self._bundle()
        if "bundle" in paths:
            done["bundle"] = paths["bundle"]
            done["held_out_rejected"] = paths["buffer_held_out_rejected"]
            self.reporter.say(f"experience model: the embedded bundle {paths['bundle']} "
                              f"({paths['checkpoint']})")
        if self.cfg.demo_tasks != 0:
            name = demos_name(self.cfg.demo_tasks, recipe.seed, self.cfg.train_split)
            if bundle is not None and bundle.manifest["demos"]["name"] == name:
                done["demos"] = str(bundle.demos_file)  # shipped: no browser needed
            else:
                done["demos"] = str(ensure_demos(family, self.cfg.demo_tasks, seed=recipe.seed,
                                                 split=self.cfg.train_split,
                                                 concurrency=self.cfg.eval_concurrency,
                                                 max_steps=self.cfg.eval_max_steps,
                                                 progress=self.reporter.say,
                                                 bar=self.reporter.bar))
            done["demos_name"] = name
        return done

    def _bundle(self) -> Any:
        """The embedded bundle of the run's task family (None: none shipped or named)."""
        from dreamgym_agents.pipeline.bundle import shipped_bundle

        return shipped_bundle(self.cfg.task.split(".", 1)[0])

    def offline_episodes(self) -> list[Any]:
        """The offline data the warm start learns from: the collection, the collectors in
        alphabetical order, then the demonstrations. The demonstrations replace the collection's
        oracle episodes, as they replay the oracle on more tasks; the family's
        ``experience_only`` collectors are left out."""
        from dreamgym_agents.episodes.env import make_family
        from dreamgym_agents.pipeline.embedded import warm_start_excluded

        done = self.state["done"]["experience"]
        demos = done.get("demos")
        made = make_family(self.cfg.task)  # no site is started
        try:
            excluded = warm_start_excluded(made, demos=bool(demos))
        finally:
            made.close()
        episodes = [*read_offline(done["offline"], exclude=excluded),
                    *(read_offline(demos, collectors=("oracle",)) if demos else [])]
        return self.held_out().keep(episodes, "offline_episodes")

    def stage_sft(self) -> dict[str, Any]:
        from dataclasses import replace

        target = self.out / "checkpoints" / "sft"
        if target.exists():
            shutil.rmtree(target)
        base = self.cfg.policy[3:] if self.cfg.policy.startswith("hf/") else None
        if self.embedded_from_experience:
            base = self.state["done"]["experience"]["model"].removeprefix("hf/")
        sft_cfg = replace(self.cfg.sft, base_model=base or self.cfg.sft.base_model,
                          seed=self.cfg.seed)
        key = self._warm_start_key(sft_cfg)
        bundle = self._bundle()
        if key is not None and bundle is not None and bundle.warm_start_key == key:
            shipped = bundle.manifest["warm_start"]
            self.reporter.say(f"sft: the embedded bundle's warm start ({bundle.policy_dir}; "
                              f"{shipped['result']['steps']} SFT steps)")
            shutil.copytree(bundle.policy_dir, target)
            # its settings beside it, as a warm start trained here has them: `eval --agent
            # hf/<run>/checkpoints/sft` plays it in its own layout, not as a chat model
            PolicyModel.load(target, self.cfg.policy_view).save_settings(target)
            return {**shipped["result"], "path": str(target), "bundle": bundle.id}
        episodes = self.offline_episodes()
        counts = {"offline_episodes": len(episodes),
                  "offline_transitions": sum(len(t.transitions) for t in episodes),
                  "held_out_rejected": self.held_out().rejected.get("offline_episodes", 0)}
        cached = self._cached_warm_start(sft_cfg, key)
        if cached is None:
            return {**self._train_sft(episodes, sft_cfg, target, None), **counts}
        from dreamgym_agents.cache import build_lock

        with build_lock(cached):  # a second run building the same warm start waits
            return {**self._train_sft(episodes, sft_cfg, target, cached), **counts}

    def _train_sft(self, episodes: list[Any], sft_cfg: PolicySFTConfig, target: Path,
                   cached: Path | None) -> dict[str, Any]:
        from dataclasses import replace

        from dreamgym_agents.policy.sft import successful, train_policy_sft

        wins = successful(episodes)
        if cached is not None and (cached / "READY").exists():
            self.reporter.say(f"sft: reusing the warm start cached in {cached}")
            shutil.copytree(cached / "model", target)
            result = json.loads((cached / "READY").read_text())
            return {**result, "path": str(target), "cached": str(cached)}
        self.reporter.say(f"sft: {len(wins)} successful offline episodes of {len(episodes)}"
                          + (f" (cached in {cached} for later runs)" if cached else ""))
        tick = self.reporter.bar("sft steps", sft_cfg.max_steps or 0)
        build = (cached / "model") if cached is not None else target
        if build.exists() and not sft_cfg.checkpoint_every:
            shutil.rmtree(build)  # an interrupted build that cannot resume
        result = train_policy_sft(episodes, replace(sft_cfg, output_dir=str(build)),
                                  self.cfg.policy_view, family=self.family(), on_step=tick)
        if result["partial"]:
            raise PartialBuildError(
                f"sft.time_budget_s stopped the warm start at step {result['steps']} of "
                f"{result['planned_steps']}: it is partial and not used (rerun without the "
                "budget, or with a larger one, to finish it)")
        if cached is not None:
            _write_json(cached / "READY", result)
            shutil.copytree(build, target, ignore=shutil.ignore_patterns("trainer"))
        return {**result, "path": str(target)}

    def _warm_start_key(self, sft_cfg: PolicySFTConfig) -> str | None:
        """The key of the embedded policy's warm start (None for a checkpoint to fine-tune)."""
        if self.cfg.policy != "embedded" or (sft_cfg.base_model and
                                             not self.embedded_from_experience):
            return None
        done = self.state["done"]["experience"]
        return warm_start_key(sft_cfg, self.cfg.policy_view,
                              init=done["recipe"] if self.embedded_from_experience else "scratch",
                              collect=done.get("collect", Path(done["offline"]).name),
                              demos=done.get("demos_name", ""))

    def _cached_warm_start(self, sft_cfg: PolicySFTConfig, key: str | None) -> Path | None:
        """Where the embedded policy's warm start is cached: it depends only on the offline
        data, the SFT settings, the policy's view and the seed (:func:`warm_start_key`), so
        runs and bench rows that share them share one build (like the embedded experience
        model). None for a checkpoint to fine-tune (not cached)."""
        from dreamgym_agents.cache import cache_root

        if key is None:
            return None
        folder = cache_root() / f"policy-v{WARM_START_VERSION}-seed{sft_cfg.seed}-{key}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @property
    def embedded_from_experience(self) -> bool:
        """The embedded policy starts from the embedded experience model's weights."""
        return (self.cfg.policy == "embedded" and self.cfg.policy_init == "experience"
                and self.cfg.sft.base_model is None)

    def test_tasks(self, split: str | None = None, limit: int | None = None) -> list[Any]:
        """The tasks every evaluation plays: ``eval_split`` (test by default), ``eval_limit`` of
        them; or ``limit`` of ``split``'s."""
        from dreamgym_agents.episodes.env import spread_tasks

        if split is None:
            split, limit = self.cfg.eval_split, self.cfg.eval_limit
        return spread_tasks(self.family().load_tasks(split), limit)

    def evaluate(self, stage: str, checkpoint: str | Path, *, split: str | None = None,
                 tasks: list[Any] | None = None, folder: Path | None = None,
                 **meta: Any) -> dict[str, Any]:
        """The policy in ``checkpoint`` on the real test split (resumable, episode by episode,
        in ``eval/<stage>``), or on ``tasks`` of ``split`` in ``folder``; ``meta`` is recorded
        with the episodes."""
        split = split or self.cfg.eval_split
        tasks = self.test_tasks() if tasks is None else tasks
        tick = self.reporter.bar(f"{stage} episodes", len(tasks))
        meta = {"command": "run", "stage": stage, "checkpoint": str(checkpoint),
                "split": split, "tasks": len(tasks), "max_steps": self.cfg.eval_max_steps,
                **meta}
        return evaluate_policy(checkpoint, tasks, self.family(),
                               folder or self.out / "eval" / stage,
                               self.cfg.policy_view, concurrency=self.cfg.eval_concurrency,
                               max_steps=self.cfg.eval_max_steps, meta=meta, name=stage,
                               on_episode=lambda t: tick(1, t))

    def stage_eval_sft(self) -> dict[str, Any]:
        reused = self._bundle_eval() if self.cfg.reuse_bundle_eval else None
        return reused or self.evaluate("eval_sft", self.checkpoint("sft"))

    def _bundle_eval(self) -> dict[str, Any] | None:
        """``eval_sft`` from the episodes the bundle's build played with this warm start on
        these test tasks (None: the run's warm start or its evaluation is not the bundle's)."""
        from dreamgym_agents.episodes.graph import SUMMARY_FILE, TRAJECTORIES_FILE, summarize
        from dreamgym_agents.pipeline.bundle import read_episodes
        from dreamgym_agents.types import append_trajectory

        bundle = self._bundle()
        sft = self.state["done"]["sft"]
        if bundle is None or sft.get("bundle") != bundle.id or self.cfg.eval_split != "test":
            return None
        measured = bundle.manifest.get("figures", {}).get("warm_start", {}).get("episodes")
        if not measured or measured.get("max_steps") != self.cfg.eval_max_steps or \
                view_record(measured.get("view") or {}) != view_record(self.cfg.policy_view) or \
                not (bundle.root / measured["file"]).is_file():
            return None
        played = {str(t.task.task_id): t for t in read_episodes(bundle.root / measured["file"])}
        tasks = self.test_tasks()
        if any(str(t.task_id) not in played for t in tasks):
            return None
        folder = self.out / "eval" / "eval_sft"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        episodes = [played[str(t.task_id)] for t in tasks]
        for traj in episodes:
            traj.provenance = "real"
            for t in traj.transitions:
                t.provenance = "real"
            append_trajectory(folder / TRAJECTORIES_FILE, traj)
        meta = {"command": "run", "stage": "eval_sft", "checkpoint": self.checkpoint("sft"),
                "split": "test", "tasks": len(tasks), "max_steps": self.cfg.eval_max_steps,
                "played_by": f"build-embedded of the bundle {bundle.id}"}
        s = summarize(episodes, meta)
        (folder / SUMMARY_FILE).write_text(json.dumps(s, indent=2, sort_keys=True))
        self.reporter.say(f"eval_sft: the embedded bundle's build played this warm start on "
                          f"these {len(tasks)} test tasks (greedy): {s['successes']}/"
                          f"{len(tasks)}; its episodes are reused ({folder}; "
                          "--set reuse_bundle_eval=false plays them again)")
        # the build took those real transitions, not this run
        return {**eval_result(s, folder), "eval_real_transitions": 0,
                "build_real_transitions": s["real_transitions"], "from_bundle": bundle.id}

    def train_tasks(self, family: Any) -> list[Any]:
        """The tasks of the run's ``train_split``.

        Raises:
            ConfigError: The family holds that split out (an official evaluation split).
        """
        split = self.cfg.train_split
        if split in getattr(family, "held_out_splits", ("validation", "test")):
            raise ConfigError(f"train_split {split!r} is held out by the {family.name} "
                              "family: a run never trains on it")
        return family.load_tasks(split)

    def _grpo(self, stage: str, start: str, cfg: GRPOStageConfig, *, real: bool) -> dict:
        from dreamgym_agents.episodes.graph import EnvPool
        from dreamgym_agents.experience.dream import DreamConfig, DreamEnv, read_openings_ahead
        from dreamgym_agents.rl.curriculum import Curriculum, TemplateTaskGenerator, grounded_in
        from dreamgym_agents.rl.grpo import train_grpo

        # a dream stage goes on from its last resume point: nothing outside it depends on the
        # batches it plays again (a real stage's go to the buffer and the model's refresh)
        resumable = not real and not self.cfg.buffer_dream
        folder = self._stage_dir(stage, resumable)
        family = self.family()
        held_out = self.held_out()
        tasks = held_out.keep(self.train_tasks(family), f"{stage}_tasks")
        curriculum = None
        llm_generator = None
        if real:
            from dreamgym_agents.episodes.env import env_config_for_agent
            from dreamgym_agents.policy.model import PolicyAgent

            # the policy being trained (a PolicyAgent) reads no expert's plan
            env_cfg = env_config_for_agent(family, self.env_cfg(), PolicyAgent)
            pool = EnvPool(lambda: family.make_env(env_cfg), cfg.concurrency)
        else:
            tasks = dream_tasks(tasks, family, self.cfg.dream_eval_types)
            if len(tasks) <= cfg.max_steps * cfg.tasks_per_step:
                # every task will be played: their openings read at once, where the family
                # can; of a larger set (which the batches draw is TRL's shuffle) each is read
                # when the dream first meets it, not hundreds made and read for a few batches
                read_openings_ahead(family, tasks)
            model, _, buffer = self.dream()
            dream_cfg = DreamConfig(reward=self.cfg.dream_reward,
                                    verdicts=self.cfg.dream_verdicts)
            pool = EnvPool(lambda: DreamEnv(dream_cfg, model, buffer, family), cfg.concurrency)
            if self.cfg.curriculum.enabled:
                hook = getattr(family, "task_generator", None)
                generator, feasible = (hook(tasks, self.cfg.seed) if hook is not None else
                                       (TemplateTaskGenerator(tasks, self.cfg.seed),
                                        grounded_in("", tasks)))
                # a model named as the generator proposes instead; feasibility still the family's
                llm_generator = self.cfg.curriculum.llm_generator(
                    family.state_format().start_key)
                generator = llm_generator or generator
                curriculum = Curriculum(self.cfg.curriculum, generator, tasks,
                                        feasible=feasible, seed=self.cfg.seed,
                                        held_out=held_out,
                                        keys=getattr(family, "task_keys", None),
                                        algorithm=cfg.algorithm, family=family.name)
        tick = self.reporter.bar(f"{stage} steps", cfg.max_steps)
        if resumable:  # the bar starts where the interrupted attempt's resume point stands
            from dreamgym_agents.rl.grpo import resumed_batches

            if done_before := resumed_batches(folder):
                tick(done_before)
        fresh: list[Any] = []  # real episodes the experience model has not learnt from yet
        added_before = self.state.get("buffer_added", {}).get(stage, 0)
        try:
            result = train_grpo(start, folder, tasks, pool, cfg, self.cfg.policy_view,
                                curriculum=curriculum, stage=stage,
                                metrics_file=self.out / METRICS_FILE,
                                on_batch=lambda figures: tick(1, figures),
                                validate=self._validation(stage, folder, cfg),
                                view=self.family().policy_view(),
                                on_episodes=self._buffer_sink(stage, real=real, fresh=fresh,
                                                              start=start),
                                resumable=resumable)
        finally:
            pool.close()
            if llm_generator is not None:
                llm_generator.gateway.close()
        if llm_generator is not None:  # what the generator's model calls cost
            result["curriculum_llm_usage"] = asdict(llm_generator.gateway.usage)
        target = self.out / "checkpoints" / stage
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(result["path"], target)
        result["buffer_added"] = self.state.get("buffer_added", {}).get(stage, 0) - added_before
        self._remember_validation(stage, target, folder, result)
        if real and fresh:  # what the stage's last batches played
            self._refresh(stage, fresh, str(target))
        result["calibration"] = self._stage_calibration(stage, start, target, folder, result)
        if not real:
            from dreamgym_agents.experience.fidelity import reward_check
            from dreamgym_agents.rl.grpo import ROLLOUTS_FILE
            from dreamgym_agents.types import read_trajectories

            rollouts = folder / ROLLOUTS_FILE
            checked = reward_check(read_trajectories(rollouts) if rollouts.exists() else [],
                                   getattr(family, "state_success", None))
            if checked is not None:
                # what the dream rewarded that the family's own check of the state would not
                result["reward_check"] = checked
        return {**result, "path": str(target), "train_tasks": len(tasks),
                "held_out_rejected": held_out.rejected.get(f"{stage}_tasks", 0)
                + (curriculum.stats.held_out if curriculum is not None else 0)}

    def _stage_calibration(self, stage: str, start: str, final: Path, folder: Path,
                           result: dict[str, Any]) -> dict[str, Any] | None:
        """The stage's starting and final policies in the dream against their real
        validation episodes (:meth:`_calibrate`): the stop rule's, where it played them on the
        same tasks, else played here (``real_transitions``, counted apart from RL's)."""
        if not self.cfg.calibrate_limit:
            return None
        validation = result.get("validation") or {}
        played = folder / "validation_episodes"
        same = self.cfg.calibrate_limit == getattr(self._stage_cfg(stage), "validate_limit",
                                                   None)
        out: dict[str, Any] = {}
        for side, policy, step in (("start", start, 0),
                                   ("final", str(final), validation.get("selected_step"))):
            real = played / f"step-{step}" if same and step is not None else None
            if real is not None and not (real / "trajectories.jsonl").is_file():
                real = None
            known = self.state.setdefault("calibrations", {}).get(str(policy))
            if known is not None and side == "start":
                out[side] = known  # the previous stage's final policy
                continue
            if side == "final" and step == 0 and out.get("start") is not None:
                out[side] = out["start"]  # the stop rule handed on the start: its weights
                self.state["calibrations"][str(policy)] = out[side]
                continue
            out[side] = self._calibrate(f"{stage}-{side}", policy,
                                        self.out / "calibration" / f"{stage}-{side}", real)
            if out[side] is not None and side == "final":
                self.state["calibrations"][str(policy)] = out[side]
        return out

    def _stage_cfg(self, stage: str) -> GRPOStageConfig:
        return self.cfg.s2r if stage == "s2r" else self.cfg.dream

    def _validation(self, stage: str, folder: Path, cfg: GRPOStageConfig) -> Any:
        """How ``stage`` plays a checkpoint on the validation split (``cfg.validate_every``),
        its episodes under ``folder/validation_episodes``; None when it does not."""
        if not cfg.validate_every:
            return None
        tasks = self.test_tasks("validation", cfg.validate_limit)
        if not tasks:
            raise ConfigError(f"{stage}: validate_every needs validation tasks, and the "
                              f"{self.cfg.task} family has none")
        if self.cfg.eval_split == "validation":
            self.reporter.say(f"{stage}: picks its policy on the validation split that the "
                              "evaluations report (eval_split=validation): those figures are "
                              "optimistic by selection")

        def validate(path: Path, step: int) -> dict[str, Any]:
            known = self.state.get("validated", {}).get(str(path)) if step == 0 else None
            if known and known.get("limit") == cfg.validate_limit and \
                    Path(known["folder"], "trajectories.jsonl").is_file():
                # the previous stage's chosen policy: its validation episodes are played
                self.reporter.say(f"{stage}: its starting policy was validated by the stage "
                                  f"before ({known['folder']}): not played again")
                target = folder / "validation_episodes" / "step-0"
                if not target.exists():
                    shutil.copytree(known["folder"], target)
                return {**known["figures"], "eval_real_transitions": 0}
            return self.evaluate(f"{stage}_validation", path, split="validation", tasks=tasks,
                                 folder=folder / "validation_episodes" / f"step-{step}",
                                 step=step)

        return validate

    def _remember_validation(self, stage: str, target: Path, folder: Path,
                             result: dict[str, Any]) -> None:
        """Keep the validation of the checkpoint a stage hands on (its stop rule's choice), so
        the next stage, which starts from it, does not play it again."""
        validation = result.get("validation") or {}
        step = validation.get("selected_step")
        entry = next((h for h in validation.get("history", []) if h["step"] == step), None)
        if entry is None:
            return
        self.state.setdefault("validated", {})[str(target)] = {
            "figures": {k: entry[k] for k in ("success", "successes", "episodes")
                        if k in entry},
            "folder": str(folder / "validation_episodes" / f"step-{step}"),
            "limit": self._stage_cfg(stage).validate_limit}

    def stage_dream_rl(self) -> dict[str, Any]:
        return self._grpo("dream_rl", self.checkpoint("sft"), self.cfg.dream,
                          real=self.cfg.real_rl)

    def stage_eval_dream(self) -> dict[str, Any]:
        return self._same_policy_eval("eval_dream", "dream_rl", "eval_sft") \
            or self.evaluate("eval_dream", self.checkpoint("dream_rl"))

    def _same_policy_eval(self, stage: str, trained: str, before: str) -> dict[str, Any] | None:
        """``stage``'s evaluation from ``before``'s episodes when the RL stage ``trained``
        handed on its starting policy (its stop rule kept step 0: the weights ``before``
        evaluated) and ``before`` played the same tasks; else None (played)."""
        from dreamgym_agents.episodes.graph import SUMMARY_FILE, TRAJECTORIES_FILE
        from dreamgym_agents.pipeline.paired import episode_outcomes

        done = self.state["done"]
        validation = (done.get(trained) or {}).get("validation") or {}
        source = Path((done.get(before) or {}).get("folder") or "")
        if not self.cfg.reuse_same_policy_eval or validation.get("selected_step") != 0 or \
                not (source / TRAJECTORIES_FILE).is_file() or \
                not (source / SUMMARY_FILE).is_file():
            return None
        played = set(episode_outcomes(source))
        if played != {str(t.task_id) for t in self.test_tasks()}:
            return None
        folder = self.out / "eval" / stage
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(source, folder)
        summary = json.loads((folder / SUMMARY_FILE).read_text())
        summary.update({"stage": stage, "checkpoint": self.checkpoint(trained),
                        "played_by": f"{before} (the same policy: {trained} kept its start)"})
        (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True))
        self.reporter.say(f"{stage}: {trained} handed on its starting policy (validation kept "
                          f"step 0), so its evaluation is {before}'s, not played again: "
                          f"{summary['successes']}/{summary['episodes']} ({folder}; --set "
                          "reuse_same_policy_eval=false plays it)")
        return {**eval_result(summary, folder), "eval_real_transitions": 0,
                "same_policy_as": before}

    def stage_s2r(self) -> dict[str, Any]:
        return self._grpo("s2r", self.checkpoint("dream_rl"), self.cfg.s2r, real=True)

    def stage_eval_s2r(self) -> dict[str, Any]:
        return self._same_policy_eval("eval_s2r", "s2r", "eval_dream") \
            or self.evaluate("eval_s2r", self.checkpoint("s2r"))

    def stage_report(self) -> dict[str, Any]:
        from dreamgym_agents.pipeline.report import write_report

        summary = write_report(self.out, self.cfg, self.state)
        return {"summary": str(self.out / "summary.json"), "report": summary["report"]}


def evaluate_policy(checkpoint: str | Path, tasks: list[Any], family: Any, folder: Path,
                    view: PolicyConfig, *, concurrency: int, max_steps: int,
                    meta: dict[str, Any], name: str = "eval",
                    on_episode: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """A policy checkpoint on real ``tasks``, greedy (resumable, episode by episode, in
    ``folder``): its success and counts.

    Raises:
        ConfigError: Episodes failed on infrastructure (rerun to retry them).
    """
    from dreamgym_agents.episodes.env import EnvConfig, env_config_for_agent
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes
    from dreamgym_agents.policy.model import PolicyAgent

    policy = PolicyModel.load(checkpoint, view, family.policy_view())
    agent = PolicyAgent(policy, temperature=0.0, keep_tokens=False, name=f"policy-{name}")
    run_cfg = RunConfig(out_dir=folder, concurrency=concurrency, max_steps=max_steps, meta=meta)
    # a policy reads no expert's plan: ALFWorld's expert does not plan for it
    env_cfg = env_config_for_agent(family, EnvConfig(max_steps=max_steps), agent)
    result = asyncio.run(run_episodes(tasks, lambda: family.make_env(env_cfg), agent, run_cfg,
                                      on_episode=on_episode))
    result.check(f"evaluation ({name})", folder / "errors.jsonl")
    return eval_result(result.summary, folder)


def eval_result(summary: dict[str, Any], folder: Path) -> dict[str, Any]:
    """An evaluation stage's result from its episodes' ``summary.json`` body."""
    s = summary
    return {"success": s["success_rate"], "episodes": s["episodes"],
            "successes": s["successes"], "eval_real_transitions": s["real_transitions"],
            "invalid_actions": s["invalid_actions"], "mean_steps": s["mean_steps"],
            "folder": str(folder)}


def warm_start_key(sft_cfg: PolicySFTConfig, view: PolicyConfig, *, init: str, collect: str,
                   demos: str) -> str:
    """What names an embedded policy's warm start: the SFT settings, the policy's view, the
    model it starts from (``init``: the experience recipe's key, or ``scratch``), the
    collection's key and the demonstrations' name. A run uses the bundle's warm start, or a
    cached one, only under the same key. The SFT settings leave out where the model is written,
    its time budget and its checkpointing, which do not change what a finished run trains, and
    its base model, which ``init`` names."""
    import hashlib

    sft = {k: v for k, v in asdict(sft_cfg).items()
           if k not in ("output_dir", "base_model", "time_budget_s", "checkpoint_every")}
    spec = {"version": WARM_START_VERSION, "sft": sft, "view": view_record(view), "init": init,
            "collect": collect, "demos": demos}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def read_offline(path: str | Path, *, collectors: tuple[str, ...] | None = None,
                 exclude: tuple[str, ...] = ()) -> list[Any]:
    """Offline episodes from a bundle's compact file or a folder of collectors' runs, the
    collectors in alphabetical order (those of ``collectors``, None: all, minus ``exclude``)."""
    from dreamgym_agents.pipeline.bundle import read_episodes
    from dreamgym_agents.pipeline.embedded import read_collected

    path = Path(path)
    if path.is_file():
        episodes = read_episodes(path, collectors=collectors, exclude=exclude)
        return sorted(episodes, key=lambda t: str(t.info.get("collector", "")))  # stable
    names = sorted(p.name for p in path.iterdir() if (p / "trajectories.jsonl").exists())
    names = [n for n in names if (collectors is None or n in collectors) and n not in exclude]
    return read_collected(path, names)


def dream_tasks(tasks: list[Any], family: Any,
                eval_types: list[str] | str | None = "family") -> list[Any]:
    """The tasks the dream trains on: those whose evaluators are all of ``eval_types`` of the
    ``family``'s kinds (``"family"``: the family's choice; None: every task; a task without
    evaluators always qualifies)."""
    if eval_types == "family":
        eval_types = family.dream_eval_types
    if eval_types is None:
        return list(tasks)
    allowed = set(eval_types)
    return [t for t in tasks if set(family.task_eval_types(t)) <= allowed]


WATCH_ONLY = ("tracking",)
"""Settings that change what a run shows, not what it computes: a run resumes, and a bench
takes a record, whatever they were."""


def added_at_defaults(previous: dict[str, Any], config: dict[str, Any]) -> dict[str, Any] | None:
    """The settings of a run's ``config`` that its ``previous`` one lacks, each at its default
    (settings added to the code since it was recorded: the same run); None when the two
    differ otherwise."""
    previous, config = ({k: v for k, v in _view_options_moved(side).items()
                         if k not in WATCH_ONLY} for side in (previous, config))
    if previous == config:
        return {}
    default = _flat(json.loads(json.dumps(asdict(PipelineConfig()))))
    now, before = _flat(config), _flat(previous)
    added = {k: v for k, v in now.items() if k not in before and k in default and v == default[k]}
    return added if {**before, **added} == now else None


def _view_options_moved(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the policy view's family settings in its ``options``, those at their
    recorded values left out (:data:`~dreamgym_agents.policy.model.RECORDED_VIEW_OPTIONS`):
    a config written when they were fields of the view compares as the same run."""
    from dreamgym_agents.policy.model import RECORDED_VIEW_OPTIONS

    view = settings.get("policy_view")
    if not isinstance(view, dict):
        return settings
    view = dict(view)
    options = {**{k: view.pop(k) for k in RECORDED_VIEW_OPTIONS if k in view},
               **(view.pop("options", None) or {})}
    view["options"] = {k: v for k, v in options.items()
                       if RECORDED_VIEW_OPTIONS.get(k, object()) != v}
    return {**settings, "policy_view": view}


def _diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The settings that differ, ``key: before → now`` (a setting one side lacks: ``(none)``;
    an empty mapping, which flattens to nothing, by its own key)."""
    a, b = _flat(old, keep_empty=True), _flat(new, keep_empty=True)
    missing = object()
    keys = sorted(k for k in set(a) | set(b) if a.get(k, missing) != b.get(k, missing))

    def shown(side: dict[str, Any], key: str) -> str:
        return repr(side[key]) if key in side else "(none)"

    return ", ".join(f"{k}: {shown(a, k)} → {shown(b, k)}" for k in keys[:4]) + \
        (", …" if len(keys) > 4 else "")


def _flat(data: dict[str, Any], prefix: str = "", keep_empty: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and (v or not keep_empty):
            out.update(_flat(v, f"{prefix}{k}.", keep_empty))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
