"""``dg-agents bench``: the paper's Table 1 in shape, on the task's real test split.

Per seed, one DreamGym run (:class:`~dreamgym_agents.pipeline.run.Pipeline`) gives three rows: the
SFT warm start, DreamGym (GRPO in the dream, 0 real RL transitions) and DreamGym-S2R (then GRPO
on the real site with at most N/10 real transitions). Further runs, which start from that run's
warm start, give GRPO-real(N) (GRPO on the real site for N real transitions) and the ablations:
the dream's experience model without replay retrieval or without reasoning, and the dream
without task generation. Each row reports the real test success as mean ± std over seeds
with the real RL transitions it used. Every run is resumable; so is the bench.
"""

from __future__ import annotations

import copy
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import BenchError, ConfigError
from dreamgym_agents.gateway.local import torch_threads
from dreamgym_agents.pipeline.paired import (
    BOOTSTRAP_DRAWS,
    episode_outcomes,
    paired_difference,
)
from dreamgym_agents.pipeline.run import (
    CONFIG_FILE,
    STATE_FILE,
    FileReporter,
    Pipeline,
    PipelineConfig,
    Reporter,
    added_at_defaults,
)
from dreamgym_agents.rl.ppo import ALGORITHMS

logger = logging.getLogger(__name__)

TABLE_JSON = "table.json"
TABLE_MD = "table.md"
ABLATIONS = {
    "no_retrieval": {"use_retrieval": False},
    "no_reasoning": {"use_reasoning": False},
    "no_task_generation": {"curriculum.enabled": False},
}
"""The ablation runs by name (``--ablation NAME`` picks some; each is one table row), with what
each changes in the DreamGym run (sim-to-real off)."""
VARIANTS = {
    "state_reward": {"dream_reward": "state"},
}
"""Declared variants of the method, run only when asked (``--variant NAME``), one row each, with
what each changes in the DreamGym run (sim-to-real off). ``state_reward``: the dream's rewards
come from the family's check of the predicted state, not the experience model (what the
predicted dynamics alone give)."""


@dataclass
class BenchConfig:
    """Settings of a bench.

    Attributes:
        seeds: Seeds per row (K).
        real_budget: N, the real transitions of GRPO-real (None: the preset's
            ``dream.max_steps`` batches' worth, counted at 5 steps per episode).
        ablations: The ablation runs (names from :data:`ABLATIONS`; empty: none).
        variants: The declared variants' runs (names from :data:`VARIANTS`; default none).
        shared_warm_start: Every seed starts from seed 0's warm start (the seeds vary the RL:
            task order, sampling, curriculum; the SFT row then has no spread). False: each
            seed trains its own warm start (one more SFT per seed).
        algorithms: The RL algorithms of the RL rows, ``grpo``, ``ppo`` or both, on the same
            seeds and tasks. ``grpo`` gives GRPO-real(N), DreamGym and DreamGym-S2R; ``ppo``
            gives PPO-real(N), DreamGym (PPO) and DreamGym-S2R (PPO), the same runs with every
            RL stage's ``algorithm: ppo``.
        jobs: Runs at a time, each in its own process (1: one after another, in this one).
        records: The folder of the runs' records (None: ``<out>/records``): each finished
            run's settings, stage results and per-task test outcomes, a few kilobytes a run,
            small enough to commit. A later bench (another machine, the run folders gone)
            takes a recorded run with the same settings as finished.
    """

    seeds: int = 5
    real_budget: int | None = None
    ablations: tuple[str, ...] = tuple(ABLATIONS)
    variants: tuple[str, ...] = ()
    shared_warm_start: bool = True
    algorithms: tuple[str, ...] = ("grpo",)
    jobs: int = 1
    records: str | None = None

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ConfigError(f"--jobs must be at least 1, got {self.jobs}")
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {self.seeds}")
        if self.real_budget is not None and self.real_budget < 10:
            raise ConfigError(f"--real-budget must be at least 10 (S2R gets N/10), got "
                              f"{self.real_budget}")
        if not self.algorithms or any(a not in ALGORITHMS for a in self.algorithms):
            raise ConfigError(f"--algorithm takes grpo or ppo (or both), got "
                              f"{', '.join(self.algorithms) or 'none'}")
        unknown = [name for name in self.ablations if name not in ABLATIONS]
        if unknown:
            raise ConfigError(f"unknown ablation {unknown[0]!r}: choose from "
                              f"{', '.join(ABLATIONS)}")
        unknown = [name for name in self.variants if name not in VARIANTS]
        if unknown:
            raise ConfigError(f"unknown variant {unknown[0]!r}: choose from "
                              f"{', '.join(VARIANTS)}")


def default_real_budget(base: PipelineConfig) -> int:
    """N when not given: as many real transitions as the dream run's rollouts, at the 5 steps
    an episode of the bundled site takes on average."""
    return base.dream.max_steps * base.dream.episodes_per_step * 5


def variants(base: PipelineConfig, cfg: BenchConfig, seed: int) -> dict[str, PipelineConfig]:
    """The runs of one seed, by name."""
    budget = cfg.real_budget or default_real_budget(base)

    def make(**changes: Any) -> PipelineConfig:
        run = copy.deepcopy(base)
        run.seed = seed
        for section in (run.sft, run.dream, run.s2r):
            section.seed = seed
        for key, value in changes.items():
            target, _, name = key.rpartition(".")
            setattr(getattr(run, target) if target else run, name, value)
        return run

    runs = {"dreamgym": make(**{"sim_to_real": True,
                                "s2r.real_transition_budget": max(1, budget // 10)})}
    real_rl = {"sim_to_real": False, "real_rl": True, "dream.real_transition_budget": budget,
               "dream.max_steps": 10_000, "dream.concurrency": base.s2r.concurrency,
               "curriculum.enabled": False}
    if "grpo" in cfg.algorithms:
        runs["grpo_real"] = make(**real_rl)
    if "ppo" in cfg.algorithms:
        runs["dreamgym_ppo"] = make(**{"sim_to_real": True, "dream.algorithm": "ppo",
                                       "s2r.algorithm": "ppo",
                                       "s2r.real_transition_budget": max(1, budget // 10)})
        runs["ppo_real"] = make(**real_rl, **{"dream.algorithm": "ppo"})
    for name, changes in ABLATIONS.items():
        if name in cfg.ablations:
            runs[name] = make(sim_to_real=False, **changes)
    for name, changes in VARIANTS.items():
        if name in cfg.variants:
            runs[name] = make(sim_to_real=False, **changes)
    return runs


ROWS = (
    ("SFT", "dreamgym", "eval_sft", ()),
    ("GRPO-real(N)", "grpo_real", "eval_dream", ("dream_rl",)),
    ("DreamGym", "dreamgym", "eval_dream", ("dream_rl",)),
    ("DreamGym-S2R", "dreamgym", "eval_s2r", ("dream_rl", "s2r")),
    ("PPO-real(N)", "ppo_real", "eval_dream", ("dream_rl",)),
    ("DreamGym (PPO)", "dreamgym_ppo", "eval_dream", ("dream_rl",)),
    ("DreamGym-S2R (PPO)", "dreamgym_ppo", "eval_s2r", ("dream_rl", "s2r")),
    ("DreamGym w/o replay retrieval", "no_retrieval", "eval_dream", ("dream_rl",)),
    ("DreamGym w/o reasoning", "no_reasoning", "eval_dream", ("dream_rl",)),
    ("DreamGym w/o task generation", "no_task_generation", "eval_dream", ("dream_rl",)),
    ("DreamGym, rewards by the state check", "state_reward", "eval_dream", ("dream_rl",)),
)
"""(row, run, evaluation stage, training stages whose real transitions the row used)."""


def run_bench(base: PipelineConfig, cfg: BenchConfig, out: str | Path,
              reporter: Reporter | None = None,
              pipeline: Callable[..., Pipeline] | None = None) -> dict[str, Any]:
    """Run every seed's runs (resumable) and write ``table.json`` and ``table.md`` (after each
    seed, or each run when ``cfg.jobs`` > 1, over the runs finished so far).

    ``pipeline`` makes each run's :class:`Pipeline`; None: the class itself. With ``jobs`` > 1
    it must be importable by name, as it is sent to the worker processes.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    make = pipeline or Pipeline
    if cfg.jobs > 1:
        return _run_side_by_side(base, cfg, out, reporter, make)
    records = Records(cfg.records or out / RECORDS)
    states: dict[tuple[int, str], dict[str, Any]] = {}
    warm: dict[int, dict[str, dict[str, Any]]] = {}  # each seed's warm start, as its runs see it

    def warm_start(seed: int) -> dict[str, dict[str, Any]]:
        """The warm start ``seed``'s other runs adopt (seed 0's when shared), from its DreamGym
        run's folder: played to the warm start's end here when only its record is left."""
        owner = 0 if cfg.shared_warm_start else seed
        if owner not in warm:
            folder = out / f"seed{owner}" / "dreamgym"
            main = make(variants(base, cfg, owner)["dreamgym"], folder, reporter)
            main.run(until="eval_sft")
            warm[owner] = _warm_start(main.state)
        return warm[owner]

    for seed in range(cfg.seeds):
        runs = variants(base, cfg, seed)
        for name, run_cfg in runs.items():  # dreamgym first: the others adopt its warm start
            folder = out / f"seed{seed}" / name
            state = _finished_state(folder, run_cfg) or records.read(seed, name, run_cfg)
            if state is None:
                if reporter:
                    reporter.say(f"[bold]seed {seed}: {name}[/]")
                own = name == "dreamgym" and (seed == 0 or not cfg.shared_warm_start)
                if own:  # it trains (or takes the bundle's) warm start itself
                    adopt = None
                elif name == "dreamgym":
                    adopt = warm_start(seed)
                else:
                    adopt = _adopted(warm_start(seed), run_cfg)
                pipe = make(run_cfg, folder, reporter, adopt=adopt)
                pipe.run()
                state = pipe.state
                if name == "dreamgym" and own:
                    warm.setdefault(seed, _warm_start(state))
            elif reporter:
                reporter.say(f"seed {seed}: {name} finished before")
            records.write(seed, name, run_cfg, state)
            states[(seed, name)] = state
        # after every seed: a long bench stopped later still has the seeds it finished
        table = _write_table(states, cfg, base, out)
    return table


WARM_START = ("experience", "sft", "eval_sft")
"""The stages a seed's other runs take from its DreamGym run (all seeds from seed 0's with a
shared warm start)."""


def _warm_start(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: state["done"][k] for k in WARM_START}


def _adopted(warm: dict[str, dict[str, Any]], run_cfg: PipelineConfig) -> dict[str, Any]:
    """What a run takes of its seed's warm start: the experience model only when it dreams
    with it unchanged (an ablation of retrieval or reasoning builds its own)."""
    if run_cfg.use_retrieval and run_cfg.use_reasoning:
        return dict(warm)
    return {k: warm[k] for k in ("sft", "eval_sft")}


def _write_table(states: dict[tuple[int, str], dict[str, Any]], cfg: BenchConfig,
                 base: PipelineConfig, out: Path) -> dict[str, Any]:
    table = make_table(states, cfg, base)
    (out / TABLE_JSON).write_text(json.dumps(table, indent=2, sort_keys=True))
    (out / TABLE_MD).write_text(render_table(table), encoding="utf-8")
    return table


def _run_side_by_side(base: PipelineConfig, cfg: BenchConfig, out: Path,
                      reporter: Reporter | None,
                      make: Callable[..., Pipeline]) -> dict[str, Any]:
    """``cfg.jobs`` runs at a time, each in its own process: the warm starts first, here (seed
    0's, or every seed's with their own), then every seed's runs, the DreamGym runs (the
    longest) first. Each process computes with its share of the CPU's threads
    (``DG_TORCH_THREADS`` when set). A failed run does not stop the others: the table is
    written over the runs that finished, and the error names the failed runs' folders, which
    resume when the command is run again."""
    records = Records(cfg.records or out / RECORDS)
    states: dict[tuple[int, str], dict[str, Any]] = {}
    todo: list[tuple[int, str, PipelineConfig]] = []
    for seed in range(cfg.seeds):  # finished before, as asked: nothing to start
        for name, run_cfg in variants(base, cfg, seed).items():
            state = _finished_state(out / f"seed{seed}" / name, run_cfg) \
                or records.read(seed, name, run_cfg)
            if state is None:
                todo.append((seed, name, run_cfg))
            else:
                records.write(seed, name, run_cfg, state)
                states[(seed, name)] = state
    warm: dict[int, dict[str, dict[str, Any]]] = {}
    owners = {0} if cfg.shared_warm_start else {seed for seed, _, _ in todo}
    for seed in sorted(owners if todo else ()):
        if reporter:
            reporter.say(f"[bold]seed {seed}: warm start[/]")
        main = make(variants(base, cfg, seed)["dreamgym"], out / f"seed{seed}" / "dreamgym",
                    reporter)
        main.run(until="eval_sft")
        warm[seed] = _warm_start(main.state)
    jobs: list[tuple[int, str, PipelineConfig, dict[str, Any] | None]] = []
    for seed, name, run_cfg in todo:
        seed_warm = warm[0] if cfg.shared_warm_start else warm[seed]
        own = name == "dreamgym" and seed in warm  # its warm start is in its folder
        jobs.append((seed, name, run_cfg, None if own else _adopted(seed_warm, run_cfg)))
    jobs.sort(key=lambda job: job[1] != "dreamgym")  # stable: by seed within each group
    total = len(jobs)
    threads = max(1, torch_threads() // cfg.jobs)
    if reporter:
        reporter.say(f"{total} runs to go, {cfg.jobs} at a time ({threads} torch thread(s) each "
                     f"unless DG_TORCH_THREADS is set); each run's progress: "
                     f"{out}/seed<N>/<run>/{PROGRESS_FILE}")
    tick = reporter.bar("bench runs", total) if reporter else None
    context = multiprocessing.get_context("spawn")  # no forked torch or Chroma state
    failed: list[str] = []
    running: dict[Any, tuple[Any, int, str, PipelineConfig]] = {}
    table = _write_table(states, cfg, base, out)
    try:
        while jobs or running:
            while jobs and len(running) < cfg.jobs:
                seed, name, run_cfg, adopt = jobs.pop(0)
                process = context.Process(
                    target=_run_one, name=f"bench seed{seed}/{name}",
                    args=(make, run_cfg, out / f"seed{seed}" / name, adopt, threads))
                process.start()
                running[process.sentinel] = (process, seed, name, run_cfg)
            for sentinel in multiprocessing.connection.wait(list(running)):
                process, seed, name, run_cfg = running.pop(sentinel)
                process.join()
                folder = out / f"seed{seed}" / name
                if process.exitcode == 0:
                    states[(seed, name)] = json.loads((folder / STATE_FILE).read_text())
                    records.write(seed, name, run_cfg, states[(seed, name)])
                    if reporter:
                        reporter.say(f"seed {seed}: {name} finished")
                else:
                    error = folder / ERROR_FILE
                    last = error.read_text().strip().splitlines()[-1] if error.exists() else \
                        f"exit code {process.exitcode}"
                    failed.append(f"seed{seed}/{name} ({last})")
                    logger.error("bench run %s failed: %s (traceback in %s)", folder, last,
                                 error)
                if tick:
                    tick()
                table = _write_table(states, cfg, base, out)
    finally:  # Ctrl-C or an error here: the runs still going stop (each resumes next time)
        for process, *_ in running.values():
            process.terminate()
        for process, *_ in running.values():
            process.join()
    if failed:
        raise BenchError(f"{len(failed)} of {total} bench run(s) failed: "
                         f"{'; '.join(failed)}; the table has the others; run the same "
                         "command again to resume the failed ones")
    return table


def _finished_state(folder: Path, run_cfg: PipelineConfig) -> dict[str, Any] | None:
    """A run folder's state when every stage is done (its report written) with exactly these
    settings, else None (the run's process then resumes it, or refuses other settings)."""
    path, config = folder / STATE_FILE, folder / CONFIG_FILE
    if not path.exists() or not config.exists() or \
            added_at_defaults(json.loads(config.read_text()), _settings(run_cfg)) is None:
        return None
    state = json.loads(path.read_text())
    return state if "report" in state.get("done", {}) else None


def _settings(run_cfg: PipelineConfig) -> dict[str, Any]:
    """A run's settings as its folder's config file and its record hold them (plain JSON),
    those that change only what a run shows (:data:`~.run.WATCH_ONLY`) left out."""
    from dreamgym_agents.pipeline.run import WATCH_ONLY

    settings = json.loads(json.dumps(asdict(run_cfg)))
    for key in WATCH_ONLY:
        settings.pop(key, None)
    return settings


RECORDS = "records"
"""The runs' records in a bench folder unless ``--records`` names another (:class:`Records`)."""


class Records:
    """A folder of finished bench runs, one ``seed<N>-<run>.json`` each: the run's settings,
    its state (every stage's result) and, for each evaluation, the outcome of every task it
    played, so that the table can be made, and the run taken as finished, without its run
    folder (a bench continued on another machine, or in another session)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def path(self, seed: int, name: str) -> Path:
        return self.folder / f"seed{seed}-{name}.json"

    def read(self, seed: int, name: str, run_cfg: PipelineConfig) -> dict[str, Any] | None:
        """The recorded state of this run when its settings are ``run_cfg``'s, else None."""
        path = self.path(seed, name)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BenchError(f"{path}: not a bench record ({exc}); remove it to rerun that "
                             "run") from None
        if added_at_defaults(record.get("config") or {}, _settings(run_cfg)) is None:
            logger.info("%s: recorded with other settings; the run is played", path)
            return None
        return record["state"]

    def write(self, seed: int, name: str, run_cfg: PipelineConfig,
              state: dict[str, Any]) -> None:
        """Record a finished run (its evaluations' per-task outcomes kept in its state)."""
        state = copy.deepcopy(state)
        for stage, result in state.get("done", {}).items():
            if stage.startswith("eval") and isinstance(result, dict) \
                    and "outcomes" not in result and result.get("folder"):
                played = episode_outcomes(result["folder"])
                if played:
                    result["outcomes"] = played
        record = {"seed": seed, "run": name, "config": _settings(run_cfg), "state": state}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(seed, name)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)


ERROR_FILE = "bench-error.txt"
"""A failed bench run's traceback, in its folder (removed when the run later finishes)."""
PROGRESS_FILE = "progress.log"
"""A bench run's progress in a worker process: its stages, batches and messages, timed."""


def _run_one(make: Callable[..., Pipeline], run_cfg: PipelineConfig, folder: Path,
             adopt: dict[str, Any] | None, threads: int) -> None:
    """One bench run, in its own process; a failure's traceback goes to its folder's
    :data:`ERROR_FILE` and the exit code is 1."""
    os.environ.setdefault("DG_TORCH_THREADS", str(threads))
    progress = FileReporter(folder / PROGRESS_FILE)
    try:
        make(run_cfg, folder, progress, adopt=adopt).run()
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C too: recorded, then the process ends
        progress.say(f"failed: {type(exc).__name__}: {exc}")
        (folder / ERROR_FILE).write_text("".join(traceback.format_exception(exc)),
                                         encoding="utf-8")
        sys.exit(1)
    (folder / ERROR_FILE).unlink(missing_ok=True)


PAIRED_BASELINES = ("SFT", "GRPO-real(N)", "PPO-real(N)")
"""The rows every row is compared with, pair by pair (same seed, same test task)."""


def make_table(states: dict[tuple[int, str], dict[str, Any]], cfg: BenchConfig,
               base: PipelineConfig) -> dict[str, Any]:
    """Rows of mean ± std real success over seeds, with the real RL transitions used, and each
    row's paired difference to the :data:`PAIRED_BASELINES`: the mean over the (seed, task)
    pairs both rows played, with a 95 % bootstrap interval
    (:mod:`~dreamgym_agents.pipeline.paired`)."""
    rows = []
    seeds = sorted({seed for seed, _ in states})
    every_code: set[str] = set()
    outcomes: dict[str, dict[tuple[int, str], float]] = {}
    for label, run, stage, trained in ROWS:
        values, reals, checks = [], [], []
        codes: set[str] = set()
        for seed in seeds:
            done = states.get((seed, run), {}).get("done", {})
            if stage not in done:
                continue
            played = done[stage].get("outcomes") or episode_outcomes(
                done[stage].get("folder", ""))
            outcomes.setdefault(label, {}).update({(seed, t): v for t, v in played.items()})
            values.append(float(done[stage]["success"]))
            reals.append(sum(int(done[t].get("real_transitions", 0)) for t in trained))
            # real episodes a stop rule played on the validation split (choosing, not training)
            checks.append(sum(int((done[t].get("validation") or {}).get("real_transitions", 0))
                              + sum(int((c or {}).get("real_transitions", 0)) for c in
                                    (done[t].get("calibration") or {}).values())
                              for t in trained if t in done))
            # the code of every stage the row's figure depends on
            codes |= {_code(done[s]) for s in ("sft", *trained, stage) if s in done}
        if not values:
            continue
        every_code |= codes
        rows.append({
            "row": label, "run": run, "seeds": len(values), "success": values,
            "success_mean": round(statistics.fmean(values), 4),
            "success_std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "real_transitions": reals,
            "real_transitions_mean": round(statistics.fmean(reals), 1),
            "validation_transitions": checks,
            "validation_transitions_mean": round(statistics.fmean(checks), 1),
            "code": sorted(codes),
        })
    for row in rows:
        mine = outcomes.get(row["row"], {})
        row["tasks"] = len({task for _, task in mine})
        for baseline in PAIRED_BASELINES:
            if baseline == row["row"] or baseline not in outcomes:
                continue
            found = paired_difference(mine, outcomes[baseline])
            if found is not None:
                row.setdefault("paired", {})[baseline] = found.as_dict()
    tasks = max((row["tasks"] for row in rows), default=0)
    return {"rows": rows, "seeds": len(seeds), "seeds_asked": cfg.seeds, "tasks": tasks,
            "code": sorted(every_code), "mixed_code": len(every_code) > 1,
            "real_budget": cfg.real_budget or default_real_budget(base),
            "preset": base.preset, "task": base.task, "split": base.eval_split,
            "eval_tasks": base.eval_limit or "all"}


def _code(result: dict[str, Any]) -> str:
    """A stage's code version in a few characters (``unknown`` for records without one)."""
    from dreamgym_agents.version import describe

    code = result.get("code")
    return describe(code) if isinstance(code, dict) else "unknown"


def render_table(table: dict[str, Any]) -> str:
    lines = [f"# Table 1 (shape) — {table['task']}, preset {table['preset']}, "
             f"{table['seeds']} seed(s), N = {table['real_budget']}, "
             f"{table.get('split', 'test')} split", ""]
    mixed = table.get("mixed_code")
    if mixed:
        lines += [f"**Warning: these rows were measured with different code versions "
                  f"({', '.join(table['code'])}); each row says which. Rerun the stale runs "
                  "(`dg-agents run --rerun-from STAGE`, or a new bench folder) before comparing "
                  "them.**", ""]
    elif table.get("code"):
        lines += [f"Every row: code {table['code'][0]}.", ""]
    checked = any(row.get("validation_transitions_mean") for row in table["rows"])
    baselines = [b for b in PAIRED_BASELINES
                 if any(b in row.get("paired", {}) for row in table["rows"])]
    lines += ["| method | real RL transitions (mean) |"
              + (" real validation transitions (mean) |" if checked else "")
              + " real success (mean ± std) | per seed |"
              + "".join(f" − {b}, paired [95 % CI] |" for b in baselines)
              + (" code |" if mixed else ""),
              "|---|---|---|---|" + ("---|" if checked else "") + "---|" * len(baselines)
              + ("---|" if mixed else "")]
    for row in table["rows"]:
        per_seed = ", ".join(f"{v:.3f}" for v in row["success"])
        paired = ""
        for b in baselines:
            d = row.get("paired", {}).get(b)
            paired += (f" {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] |" if d
                       else " — |")
        lines.append(f"| {row['row']} | {row['real_transitions_mean']:.0f} |"
                     + (f" {row.get('validation_transitions_mean', 0):.0f} |" if checked else "")
                     + f" {row['success_mean']:.3f} ± {row['success_std']:.3f} | {per_seed} |"
                     + paired
                     + (f" {', '.join(row.get('code', []))} |" if mixed else ""))
    lines.append("")
    if baselines:
        lines += [f"Paired: the row's success minus the baseline's on the same (seed, test "
                  f"task) pairs ({table.get('tasks', '?')} test tasks × the seeds both rows "
                  "have), with a 95 % percentile bootstrap interval over those pairs "
                  f"({BOOTSTRAP_DRAWS:,} resamples).", ""]
    if checked:
        lines += ["Real validation transitions: the real episodes a stage's stop rule played on "
                  "the validation split to choose the checkpoint it keeps (`validate_every`), "
                  "and those its calibration played where the stop rule had not; no policy "
                  "trained on them.", ""]
    return "\n".join(lines)

