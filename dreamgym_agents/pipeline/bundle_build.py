"""``dg-agents build-embedded``: the embedded bundle, made from nothing with the recipe.

This is how the shipped bundle (:mod:`dreamgym_agents.pipeline.bundle`) was made and how anyone
re-makes it. Its phases are each resumable in ``OUT``: rerun the same command, and finished
phases are kept, recorded episodes stay and SFT resumes from its last checkpoint. The phases:

1. ``collect``: the experience recipe's collectors on the bundled site's *train* split, then
   their episodes in compact form (``OUT/episodes/collect.jsonl.gz``).
2. ``experience``: the experience model trained on those compact episodes for the recipe's
   fixed steps (:func:`~dreamgym_agents.pipeline.embedded.train_embedded`).
3. ``demos``: the oracle on every train task (the warm start's demonstrations), compacted.
4. ``warm_start``: the embedded policy's SFT from the experience model's weights, exactly as
   ``dg-agents run`` would train it (:func:`~dreamgym_agents.pipeline.run.warm_start_key`).
5. ``package``: the models' weights (``weights_dtype``, bfloat16 by default) and tokenizers,
   and the episodes, into ``OUT/bundle``.
6. ``measure``: on the packaged bundle, as users get it: the oracle and a random agent on the
   real test split, the experience model's fidelity against them, and the warm start's greedy
   success on the test split. Then ``OUT/bundle/manifest.json`` is written: a bundle exists
   only once it is complete.

A recipe trains its fixed steps on any machine (a slow one takes longer; the progress bars say
when each phase will finish). A build may start from another bundle's episodes
(:func:`reuse_episodes`, ``--reuse-episodes``): those its collectors would play again under the
same episode settings are resumed, not replayed (a recipe that changes only training, or adds a
collector, then skips most of the collection). ``time_budget_s`` may stop a build early: what
was trained is then kept, marked partial, never packaged, and the build raises
:class:`~dreamgym_agents.errors.PartialBuildError` (one line, exit code 3).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError, PartialBuildError
from dreamgym_agents.pipeline.bundle import (
    BUNDLE_FORMAT,
    COLLECT_FILE,
    DEMOS_FILE,
    EXPERIENCE_DIR,
    POLICY_DIR,
    WARM_START_TEST_FILE,
    Bundle,
    content_id,
    file_table,
    package_model,
    read_episodes,
    write_episodes,
    write_manifest,
)
from dreamgym_agents.pipeline.embedded import (
    COLLECT_VERSION,
    DEMOS_VERSION,
    RECIPE_VERSION,
    EmbeddedRecipe,
    collect,
    demos_name,
    ensure_demos,
    family_recipe,
    read_collected,
    train_embedded,
    typed_recipe_fields,
    warm_start_excluded,
)
from dreamgym_agents.pipeline.run import (
    WARM_START_VERSION,
    Reporter,
    SilentReporter,
    evaluate_policy,
    preset_config,
    read_offline,
    warm_start_key,
)
from dreamgym_agents.policy.model import PolicyConfig, view_record
from dreamgym_agents.policy.sft import PolicySFTConfig

PHASES = ("collect", "experience", "demos", "warm_start", "package", "measure")
BUILD_FILE = "build.json"
EPISODE_FIELDS = ("seed", "noise", "max_steps", "state_version")
"""The recipe fields that shape an episode once its collector and train task are chosen: a
bundle's episodes are reused (:func:`reuse_episodes`) only under the same ones."""
QUICK_EVAL_TASKS = 31
"""Test tasks of ``dg-agents run --preset quick``'s evaluations (one per template): the warm
start's success on them is in the manifest too."""


@dataclass
class BuildConfig:
    """What ``dg-agents build-embedded`` makes (``--set key=value`` reaches every field).

    Attributes:
        experience_recipe: Fields of the experience model's recipe to change
            (:class:`~dreamgym_agents.pipeline.embedded.EmbeddedRecipe`; none: the shipped recipe).
        demo_tasks: Train tasks the oracle demonstrates (None: every one), as ``run``'s
            ``demo_tasks``.
        demo_concurrency: Browser episodes at once while demonstrating.
        demo_max_steps: Step limit of a demonstration.
        warm_start: The policy's SFT (default: what ``dg-agents run`` trains, both presets).
        policy_view: How the policy sees a turn (as ``run``'s ``policy_view``).
        weights_dtype: ``bfloat16``, half the size with no figure changed (evidence:
            docs/history/results-2026-11-to-12.md), or ``float32``. Models always compute in
            float32.
        measure: Measure the packaged bundle (False: a bundle without figures, for tests).
        eval_limit: Test tasks of the warm start's evaluation, spread over the templates
            (None: the whole split).
        fidelity_limit: Test tasks of the fidelity measurement (None: the whole split).
        real_concurrency: Browser episodes at once in the oracle's and the random agent's
            real test runs.
        eval_concurrency: Browser episodes at once in the warm start's evaluation.
        eval_max_steps: Step limit of the real runs and the evaluation.
        fidelity_concurrency: Experience-model calls at once in the fidelity measurement.
    """

    experience_recipe: dict[str, Any] = field(default_factory=dict)
    demo_tasks: int | None = None
    demo_concurrency: int = 4
    demo_max_steps: int = 15
    warm_start: PolicySFTConfig = field(default_factory=lambda: preset_config("quick").sft)
    policy_view: PolicyConfig = field(default_factory=PolicyConfig)
    weights_dtype: str = "bfloat16"
    measure: bool = True
    eval_limit: int | None = None
    fidelity_limit: int | None = None
    real_concurrency: int = 2
    eval_concurrency: int = 4
    eval_max_steps: int = 15
    fidelity_concurrency: int = 2

    def __post_init__(self) -> None:
        self.experience_recipe = typed_recipe_fields(self.experience_recipe)
        if self.weights_dtype not in ("bfloat16", "float32"):
            raise ConfigError(f"weights_dtype must be bfloat16 or float32, got "
                              f"{self.weights_dtype!r}")
        for name in ("eval_limit", "fidelity_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 (null: the whole split), got "
                                  f"{value}")
        if self.demo_tasks is not None and self.demo_tasks < 1:
            raise ConfigError(f"demo_tasks must be at least 1 (null: every train task), got "
                              f"{self.demo_tasks}")
        for name in ("demo_concurrency", "demo_max_steps", "real_concurrency",
                     "eval_concurrency", "eval_max_steps", "fidelity_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")



class _Build:
    """One build folder and its phases."""

    def __init__(self, cfg: BuildConfig, out: Path, reporter: Reporter,
                 time_budget_s: float | None, family: str,
                 reuse: Bundle | None = None) -> None:
        self.cfg = cfg
        self.reuse = reuse
        self.out = out
        self.reporter = reporter
        self.family = family
        self.recipe = family_recipe(family, **cfg.experience_recipe)
        self.deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
        self.record: dict[str, Any] = {"phases": {}}

    # -- bookkeeping --------------------------------------------------------------------------

    def open(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        config = json.loads(json.dumps(asdict(self.cfg)))
        path = self.out / BUILD_FILE
        if path.exists():
            self.record = json.loads(path.read_text())
            if self.record.get("config") != config:
                raise ConfigError(f"{self.out} holds a build with other settings: rerun with "
                                  "the same ones to resume, or use another --out folder")
            if self.record.get("family", self.family) != self.family:
                raise ConfigError(f"{self.out} holds a build of the {self.record['family']} "
                                  f"family, not {self.family}: use another --out folder")
        self.record["config"] = config
        self.record["family"] = self.family
        # the code that runs this (resumed) build, taken now: later edits do not run here
        from dreamgym_agents.version import code_version

        versions = self.record.setdefault("code", [])
        if not versions or versions[-1] != code_version():
            versions.append(code_version())
        self._save()

    def _save(self) -> None:
        tmp = self.out / (BUILD_FILE + ".tmp")
        tmp.write_text(json.dumps(self.record, indent=2, sort_keys=True))
        tmp.replace(self.out / BUILD_FILE)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def run(self) -> Bundle:
        self.open()
        if self.reuse is not None and not {"collect", "demos"} <= set(self.record["phases"]):
            reused = reuse_episodes(self.reuse, self.recipe, self.out, self.family,
                                    demos_name(self.cfg.demo_tasks, self.recipe.seed))
            self.reporter.say(f"reused from the bundle {reused['bundle']}: "
                              f"{reused['collected']} collected episodes, {reused['demos']} "
                              "demonstrations (the rest are played)")
            self.record.setdefault("reused", reused)  # what the first run reused
            self._save()
        for i, phase in enumerate(PHASES, 1):
            if phase in self.record["phases"]:
                continue
            left = self.remaining()
            if left is not None and left <= 0:
                raise PartialBuildError(
                    f"the time budget ran out before the {phase} phase: {self.out} holds the "
                    "finished phases (no bundle); rerun without --time-budget-s to finish")
            self.reporter.stage(phase, i, len(PHASES))
            began = time.perf_counter()
            result = getattr(self, f"phase_{phase}")()
            result["seconds"] = round(time.perf_counter() - began, 1)
            self.record["phases"][phase] = result
            self._save()
        return Bundle.open(self.out / "bundle")

    # -- phases -------------------------------------------------------------------------------

    def phase_collect(self) -> dict[str, Any]:
        folder = self.out / "collect"
        if not (folder / "COMPLETE").exists():
            collect(self.recipe, folder, self.family, say=self.reporter.say,
                    bar=self.reporter.bar)
        from dreamgym_agents.episodes.env import make_family

        family = make_family(self.family)
        collectors = family.collectors
        family.close()
        pairs = [(name, traj) for name in collectors for traj in read_collected(folder, [name])]
        count = write_episodes(self.out / COLLECT_FILE, pairs)
        return {"episodes": count, "transitions": sum(len(t.transitions) for _, t in pairs),
                "by_collector": {n: sum(1 for c, _ in pairs if c == n) for n in collectors}}

    def phase_experience(self) -> dict[str, Any]:
        episodes = read_episodes(self.out / COLLECT_FILE)  # in the collectors' order
        tick = self.reporter.bar("experience SFT steps", self.recipe.sft_steps)
        manifest = train_embedded(self.recipe, episodes, self.out / "experience", self.family,
                                  say=self.reporter.say, on_step=tick,
                                  time_budget_s=self.remaining())
        keep = ("episodes", "transitions", "examples", "dropped_too_long", "steps",
                "first_loss", "last_loss", "bf16_autocast", "device", "timings",
                "resumed_from_step", "held_out_rejected", "renamed_episodes")
        return {k: manifest.get(k) for k in keep}

    def phase_demos(self) -> dict[str, Any]:
        folder = self.out / "demos"
        ensure_demos(self.family, self.cfg.demo_tasks, seed=self.recipe.seed,
                     concurrency=self.cfg.demo_concurrency, max_steps=self.cfg.demo_max_steps,
                     progress=self.reporter.say, bar=self.reporter.bar, folder=folder)
        demos = read_collected(folder, ["oracle"])
        count = write_episodes(self.out / DEMOS_FILE, [("oracle", t) for t in demos])
        return {"episodes": count, "successful": sum(t.success for t in demos),
                "transitions": sum(len(t.transitions) for t in demos)}

    def warm_start_config(self) -> PolicySFTConfig:
        return replace(self.cfg.warm_start,
                       base_model=str(self.out / "experience" / "model"),
                       output_dir=str(self.out / "policy" / "model"))

    def phase_warm_start(self) -> dict[str, Any]:
        from dreamgym_agents.episodes.env import make_family
        from dreamgym_agents.heldout import HeldOut
        from dreamgym_agents.policy.sft import train_policy_sft

        family = make_family(self.family)
        try:
            held_out = HeldOut.for_family(family)
            excluded = warm_start_excluded(family)
            episodes = held_out.keep(
                [*read_offline(self.out / COLLECT_FILE, exclude=excluded),
                 *read_offline(self.out / DEMOS_FILE, collectors=("oracle",))],
                "warm_start_data")
            sft_cfg = replace(self.warm_start_config(), time_budget_s=self.remaining(),
                              checkpoint_every=100)
            self.reporter.say(f"warm start: {sft_cfg.max_steps} SFT steps from the experience "
                              f"model's weights on {len(episodes)} offline episodes")
            tick = self.reporter.bar("warm start SFT steps", sft_cfg.max_steps or 0)
            result = train_policy_sft(episodes, sft_cfg, self.cfg.policy_view, family=family,
                                      on_step=tick)
        finally:
            family.close()
        if result["partial"]:
            (self.out / "policy" / "PARTIAL").write_text(json.dumps(result, indent=2))
            raise PartialBuildError(
                f"the time budget stopped the warm start at step {result['steps']} of "
                f"{result['planned_steps']}: {self.out / 'policy'} is marked partial and is not "
                "the recipe's policy (rerun the same command without the budget to finish)")
        (self.out / "policy" / "PARTIAL").unlink(missing_ok=True)
        return {**{k: v for k, v in result.items() if k != "path"},
                "held_out_rejected": held_out.rejected["warm_start_data"],
                "offline_episodes": len(episodes),
                "offline_transitions": sum(len(t.transitions) for t in episodes)}

    def phase_package(self) -> dict[str, Any]:
        bundle = self.out / "bundle"
        if bundle.exists():
            shutil.rmtree(bundle)
        package_model(self.out / "experience" / "model", bundle / EXPERIENCE_DIR,
                      self.cfg.weights_dtype)
        package_model(self.out / "policy" / "model", bundle / POLICY_DIR, self.cfg.weights_dtype)
        for name in (COLLECT_FILE, DEMOS_FILE):
            (bundle / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.out / name, bundle / name)
        files = file_table(bundle)
        ident = content_id(self.family, RECIPE_VERSION, WARM_START_VERSION, files)
        return {"id": ident, "bytes": sum(f["bytes"] for f in files.values())}

    def phase_measure(self) -> dict[str, Any]:
        began = time.perf_counter()
        draft = Bundle(self.out / "bundle", self.manifest(figures={}))
        figures = measure(draft, self.cfg, self.out / "measure", self.reporter, self.family) \
            if self.cfg.measure else {}
        manifest = self.manifest(figures)
        manifest["built"]["phase_seconds"]["measure"] = round(time.perf_counter() - began, 1)
        write_manifest(draft.root, manifest)
        return {"figures": figures}

    # -- the manifest -------------------------------------------------------------------------

    def manifest(self, figures: dict[str, Any]) -> dict[str, Any]:
        phases = self.record["phases"]
        recipe = self.recipe
        files = file_table(self.out / "bundle")
        key = warm_start_key(self.warm_start_config(), self.cfg.policy_view, init=recipe.key,
                             collect=recipe.collect_key,
                             demos=demos_name(self.cfg.demo_tasks, recipe.seed))
        warm = phases.get("warm_start", {})
        return {
            "format": BUNDLE_FORMAT,
            "id": phases["package"]["id"],
            "family": self.family,
            "built": {**self.record["code"][0], "resumed_by": self.record["code"][1:],
                      "date": _dt.datetime.now(_dt.UTC).isoformat(
                timespec="seconds"), "machine": f"{platform.machine()}, "
                f"{_cpu_count()} CPUs", "phase_seconds": {
                    p: phases[p].get("seconds") for p in PHASES if p in phases},
                **({"reused_episodes": self.record["reused"]} if "reused" in self.record
                   else {})},
            "split": {"trained_on": "train", "evaluated_on": "test",
                      "note": "every model and seed episode comes from train-split tasks only"},
            "experience": {"key": recipe.key, "recipe_version": RECIPE_VERSION,
                           "collect_key": recipe.collect_key, "collect_version": COLLECT_VERSION,
                           "recipe": recipe.fields(), "training": phases.get("experience", {}),
                           "collection": phases.get("collect", {})},
            "demos": {"name": demos_name(self.cfg.demo_tasks, recipe.seed),
                      "version": DEMOS_VERSION, **phases.get("demos", {})},
            "warm_start": {"key": key, "version": WARM_START_VERSION,
                           "sft": {k: v for k, v in asdict(self.cfg.warm_start).items()
                                   if k not in ("output_dir", "base_model")},
                           "view": view_record(self.cfg.policy_view), "result": warm,
                           "offline_episodes": warm.get("offline_episodes"),
                           "offline_transitions": warm.get("offline_transitions")},
            "weights_dtype": self.cfg.weights_dtype,
            "figures": figures,
            "files": files,
            "bytes": sum(f["bytes"] for f in files.values()),
        }


def measure(bundle: Bundle, cfg: BuildConfig, folder: Path, reporter: Reporter,
            family_name: str) -> dict[str, Any]:
    """The figures of a packaged bundle, as users get it (weights as stored, the buffer made
    from the shipped seed episodes): the experience model's fidelity on the real test split
    (against the oracle's and a random agent's real runs) and the warm start's greedy test
    success. Resumable: finished runs in ``folder`` are kept."""
    from dreamgym_agents.episodes.env import EnvConfig, make_family, spread_tasks
    from dreamgym_agents.episodes.graph import TRAJECTORIES_FILE, RunConfig, run_episodes
    from dreamgym_agents.types import read_trajectories

    family = make_family(family_name)
    env_cfg = EnvConfig(max_steps=cfg.eval_max_steps)
    figures: dict[str, Any] = {}
    try:
        tests = family.load_tasks("test")
        held_out = spread_tasks(tests, cfg.fidelity_limit)
        reporter.say(f"measuring on the test split ({family.prepare(env_cfg, tests)})")
        runs = []
        agents = family.offline_agents(seed=0)
        for name, agent in (("oracle", agents["oracle"]), ("random", agents["random"])):
            tick = reporter.bar(f"real {name} episodes", len(held_out))
            run_cfg = RunConfig(out_dir=folder / f"test-{name}",
                                concurrency=cfg.real_concurrency, max_steps=cfg.eval_max_steps,
                                meta={"command": "build-embedded", "agent": name,
                                      "split": "test", "max_steps": cfg.eval_max_steps})
            result = asyncio.run(run_episodes(held_out, lambda: family.make_env(env_cfg), agent,
                                              run_cfg, on_episode=lambda t, k=tick: k(1, t)))
            result.check(name, run_cfg.out_dir / "errors.jsonl")
            runs.append(run_cfg.out_dir)
        figures["fidelity"] = measure_fidelity(bundle, cfg, runs, folder, family_name, reporter)
        evaluated = spread_tasks(tests, cfg.eval_limit)
        tick = reporter.bar("warm start episodes", len(evaluated))
        meta = {"command": "build-embedded", "stage": "warm_start", "tasks": len(evaluated),
                "max_steps": cfg.eval_max_steps}
        result = evaluate_policy(bundle.policy_dir, evaluated, family,
                                 folder / "warm-start-test", cfg.policy_view,
                                 concurrency=cfg.eval_concurrency,
                                 max_steps=cfg.eval_max_steps, meta=meta, name="warm_start",
                                 on_episode=lambda t: tick(1, t))
        played = read_trajectories(Path(result["folder"]) / TRAJECTORIES_FILE)
        figures["warm_start"] = _warm_start_figures(result, played, tests)
        write_episodes(bundle.root / WARM_START_TEST_FILE, (("warm_start", t) for t in played))
        figures["warm_start"]["episodes"] = {
            "file": WARM_START_TEST_FILE, "tasks": len(played), "greedy": True,
            "max_steps": cfg.eval_max_steps, "view": view_record(cfg.policy_view)}
        figures["warm_start"]["calibration"] = measure_calibration(
            bundle, cfg, family, folder, reporter)
    finally:
        family.close()
    return figures


def measure_calibration(bundle: Bundle, cfg: BuildConfig, family: Any, folder: Path,
                        reporter: Reporter) -> dict[str, Any] | None:
    """The warm start in the bundle's dream against its real episodes on the validation split
    (``dg-agents calibrate``: success in both per evaluator kind, false and missed rewards);
    None for a family without validation tasks."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.episodes.env import spread_tasks
    from dreamgym_agents.experience.calibration import calibrate_policy
    from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym_agents.experience.training import trained_settings
    from dreamgym_agents.gateway.llm import Gateway, LLMConfig
    from dreamgym_agents.policy.model import PolicyAgent, PolicyModel

    tasks = spread_tasks(family.load_tasks("validation"), cfg.eval_limit)
    if not tasks:
        return None
    paths = bundle.experience_paths(progress=reporter.say, buffer_dir=folder / "buffer" / "db")
    gateway = Gateway(LLMConfig(model=paths["model"],
                                max_concurrency=max(4, cfg.fidelity_concurrency)))
    buffer = ReplayBuffer(BufferConfig(path=paths["buffer"], family=bundle.family), family)
    try:
        exp_cfg = ExperienceConfig(**trained_settings(paths["model"]))
        model = ExperienceModel(exp_cfg, gateway, buffer,
                                codec=family.experience_codec(exp_cfg.codec_version))
        agent = PolicyAgent(PolicyModel.load(bundle.policy_dir, cfg.policy_view,
                                             family.policy_view()),
                            temperature=0.0, keep_tokens=False, name="policy-warm_start")
        tick = reporter.bar("warm start calibration episodes", 2 * len(tasks))
        result = calibrate_policy(
            tasks, agent, family, model, buffer, folder / "calibration",
            concurrency=cfg.eval_concurrency, max_steps=cfg.eval_max_steps,
            meta={"command": "build-embedded", "stage": "calibration", "split": "validation",
                  "tasks": len(tasks), "max_steps": cfg.eval_max_steps},
            on_episode=lambda t: tick(1, t))
    finally:
        buffer.close()
        gateway.close()
    return {"split": "validation", "all": result["all"], "by_kind": result["by_kind"],
            "command": "dg-agents calibrate --agent hf/<bundle>/policy --split validation"}


FIDELITY_KEYS = ("reward_accuracy", "reward_balanced_accuracy", "reward_f1", "done_accuracy",
                 "done_balanced_accuracy", "done_f1", "success_accuracy", "state_f1", "state_exact",
                 "state_exact_determined", "n_determined", "state_exact_revealing",
                 "n_revealing", "em_failure_rate", "final_success_recall", "final_failure_recall",
                 "oracle_real_success", "oracle_dream_success", "random_real_success",
                 "random_dream_success", "baselines")


def measure_fidelity(bundle: Bundle, cfg: BuildConfig, runs: list[Path], folder: Path,
                     family: str, reporter: Reporter) -> dict[str, Any]:
    """The bundle's experience model against the real ``runs`` (an oracle's and a random
    agent's, on the test split), its buffer made in ``folder/buffer`` from the bundle's seed
    episodes: the fidelity figures a manifest records."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.experience.dream import DreamConfig
    from dreamgym_agents.experience.fidelity_run import FidelityConfig, load_real_runs, run_fidelity
    from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym_agents.experience.training import trained_settings
    from dreamgym_agents.gateway.llm import Gateway, LLMConfig

    paths = bundle.experience_paths(progress=reporter.say, buffer_dir=folder / "buffer" / "db")
    gateway = Gateway(LLMConfig(model=paths["model"],
                                max_concurrency=max(4, cfg.fidelity_concurrency)))
    from dreamgym_agents.episodes.env import make_family

    made = make_family(family)
    buffer = ReplayBuffer(BufferConfig(path=paths["buffer"], family=bundle.family), made)
    try:
        exp_cfg = ExperienceConfig(**trained_settings(paths["model"]))
        model = ExperienceModel(exp_cfg, gateway, buffer,
                                codec=made.experience_codec(exp_cfg.codec_version))
        fid_cfg = FidelityConfig(out_dir=folder / "fidelity", family=family,
                                 limit=cfg.fidelity_limit,
                                 concurrency=cfg.fidelity_concurrency)

        def progress(name: str, total: int) -> Callable[[bool], None]:
            tick = reporter.bar(f"fidelity: {name}", total)
            return lambda ok: tick(1)

        report = asyncio.run(run_fidelity(
            fid_cfg, load_real_runs(runs), model, buffer, DreamConfig(), progress=progress,
            meta={"experience_model": "bundle", "limit": cfg.fidelity_limit},
            task_family=made))
    finally:
        made.close()
        buffer.close()
        gateway.close()
    return {**{k: report.get(k) for k in FIDELITY_KEYS}, "tasks": report["counts"]["tasks"],
            "transitions": report["counts"]["transitions"],
            "command": "dg-agents fidelity --real <oracle test run> --real <random test run>"}


def _warm_start_figures(result: dict[str, Any], played: list[Any],
                        tests: list[Any]) -> dict[str, Any]:
    """The warm start's success on the evaluated test tasks (``played``: its episodes), and on
    the quick preset's 31 when they were all evaluated."""
    from dreamgym_agents.episodes.env import spread_tasks

    solved = {t.task.task_id: t.success for t in played}
    out = {"success": result["success"], "successes": result["successes"],
           "tasks": result["episodes"], "greedy": True,
           "solved": sorted(str(k) for k, ok in solved.items() if ok)}
    quick = [t.task_id for t in spread_tasks(tests, QUICK_EVAL_TASKS)]
    if all(task_id in solved for task_id in quick):
        wins = sum(solved[task_id] for task_id in quick)
        out["quick"] = {"tasks": len(quick), "successes": wins,
                        "success": round(wins / len(quick), 4)}
    return out


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def build_embedded(cfg: BuildConfig, out: str | Path, reporter: Reporter | None = None, *,
                   family: str, time_budget_s: float | None = None,
                   reuse: Bundle | None = None) -> Bundle:
    """Make the task ``family``'s embedded bundle in ``out`` (``out/bundle``), resuming what
    ``out`` holds, and the episodes of ``reuse`` this build would play again
    (:func:`reuse_episodes`).

    Raises:
        PartialBuildError: ``time_budget_s`` ran out before the build finished (what was
            trained is kept, marked partial; no bundle is written).
        ConfigError: ``out`` holds a build with other settings; episodes failed; ``reuse``
            is another family's or was collected under other episode settings.
    """
    if time_budget_s is not None and time_budget_s <= 0:
        raise ConfigError(f"--time-budget-s must be positive, got {time_budget_s}")
    return _Build(cfg, Path(out), reporter or SilentReporter(), time_budget_s, family,
                  reuse).run()


def reuse_episodes(source: Bundle, recipe: EmbeddedRecipe, out: Path, family: str,
                   demos: str) -> dict[str, Any]:
    """Write the episodes of ``source`` (a shipped or built bundle) that a build of ``recipe``
    in ``out`` would play again into its run folders, where the build resumes them: each
    collector's episodes on the train tasks the recipe gives it, and the demonstrations when
    they are the same ones (``demos``: their name). Only under the same episode settings
    (:data:`EPISODE_FIELDS`); a folder already complete is left alone, episodes already
    recorded stay. Returns the source's id and how many episodes were written.

    Raises:
        ConfigError: ``source`` is another family's bundle, or was collected under other
            episode settings.
    """
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.episodes.graph import episode_id_for

    if source.family != family:
        raise ConfigError(f"the bundle {source.root} is the {source.family} family's, not "
                          f"{family}'s: its episodes cannot be reused")
    theirs = {**EmbeddedRecipe().fields(), **source.manifest["experience"]["recipe"]}
    differ = [f"{name} {theirs[name]} (this recipe: {getattr(recipe, name)})"
              for name in EPISODE_FIELDS if theirs[name] != getattr(recipe, name)]
    if differ:
        raise ConfigError(f"the bundle {source.id} was collected with other episode settings "
                          f"({', '.join(differ)}): its episodes cannot be reused")
    made = make_family(family)
    try:
        plan = made.collection_plan(recipe, made.load_tasks("train"))
    finally:
        made.close()
    wanted: dict[str, set[str] | None] = {
        name: {episode_id_for(task, agent.name) for task in chosen}
        for name, agent, chosen, _ in plan}
    collected = _resume_from(source.collect_file, out / "collect", wanted)
    shown = source.manifest.get("demos", {}).get("name") == demos
    shown_count = _resume_from(source.demos_file, out / "demos", {"oracle": None}) \
        if shown else 0
    return {"bundle": source.id, "collected": collected, "demos": shown_count}


def _resume_from(path: Path, folder: Path, wanted: dict[str, set[str] | None]) -> int:
    """Append the compact episodes of ``path`` whose collector is in ``wanted`` (and whose
    episode id is in its set; None: any) to ``folder/<collector>``'s trajectories, unless
    recorded there already or ``folder`` is complete; return how many were written."""
    import gzip

    from dreamgym_agents.episodes.graph import TRAJECTORIES_FILE
    from dreamgym_agents.types import read_trajectories

    if (folder / "COMPLETE").exists():
        return 0
    recorded: dict[str, set[str]] = {}
    for name in wanted:
        file = folder / name / TRAJECTORIES_FILE
        recorded[name] = {t.episode_id for t in read_trajectories(file, repair=True)} \
            if file.exists() else set()
    lines: dict[str, list[str]] = {name: [] for name in wanted}
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            data = json.loads(line)
            who, ident = str(data.get("info", {}).get("collector", "")), data["episode_id"]
            ids = wanted.get(who, set())
            if who in wanted and (ids is None or ident in ids) and ident not in recorded[who]:
                lines[who].append(line.rstrip("\n"))
                recorded[who].add(ident)
    for name, chosen in lines.items():
        if chosen:
            (folder / name).mkdir(parents=True, exist_ok=True)
            with open(folder / name / TRAJECTORIES_FILE, "a", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in chosen))
    return sum(len(chosen) for chosen in lines.values())
