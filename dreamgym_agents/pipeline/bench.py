"""``dg-agents bench``: the paper's Table 1 in shape, on the task's real test split.

Per seed, one DreamGym run (:class:`~dreamgym_agents.pipeline.run.Pipeline`) gives three rows — the
SFT warm start, DreamGym (GRPO in the dream, 0 real RL transitions) and DreamGym-S2R (then GRPO
on the real site with at most N/10 real transitions) — and further runs, which start from that
run's warm start, give GRPO-real(N) (GRPO on the real site for N real transitions) and the
ablations (the dream's experience model without replay retrieval, without reasoning, and the
dream without task generation). Each row reports the real test success as mean ± std over seeds
with the real RL transitions it used. Every run is resumable; so is the bench.
"""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.run import Pipeline, PipelineConfig, Reporter

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
            ``dream.max_steps`` batches' worth, measured as 5 steps per episode).
        ablations: The ablation runs (names from :data:`ABLATIONS`; empty: none).
        variants: The declared variants' runs (names from :data:`VARIANTS`; default none).
        shared_warm_start: Every seed starts from seed 0's warm start (the seeds vary the RL:
            task order, sampling, curriculum; the SFT row then has no spread). False: each
            seed trains its own warm start (one more SFT per seed).
    """

    seeds: int = 3
    real_budget: int | None = None
    ablations: tuple[str, ...] = tuple(ABLATIONS)
    variants: tuple[str, ...] = ()
    shared_warm_start: bool = True

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {self.seeds}")
        if self.real_budget is not None and self.real_budget < 10:
            raise ConfigError(f"--real-budget must be at least 10 (S2R gets N/10), got "
                              f"{self.real_budget}")
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
    runs["grpo_real"] = make(**{"sim_to_real": False, "real_rl": True,
                                "dream.real_transition_budget": budget,
                                "dream.max_steps": 10_000,
                                "dream.concurrency": base.s2r.concurrency,
                                "curriculum.enabled": False})
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
    ("DreamGym w/o replay retrieval", "no_retrieval", "eval_dream", ("dream_rl",)),
    ("DreamGym w/o reasoning", "no_reasoning", "eval_dream", ("dream_rl",)),
    ("DreamGym w/o task generation", "no_task_generation", "eval_dream", ("dream_rl",)),
    ("DreamGym, rewards by the state check", "state_reward", "eval_dream", ("dream_rl",)),
)
"""(row, run, evaluation stage, training stages whose real transitions the row used)."""


def run_bench(base: PipelineConfig, cfg: BenchConfig, out: str | Path,
              reporter: Reporter | None = None) -> dict[str, Any]:
    """Run every seed's runs (resumable) and write ``table.json`` and ``table.md`` (after each
    seed, over the seeds finished so far)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    states: dict[tuple[int, str], dict[str, Any]] = {}
    for seed in range(cfg.seeds):
        runs = variants(base, cfg, seed)
        first = states.get((0, "dreamgym"))
        warm = {k: first["done"][k] for k in ("experience", "sft", "eval_sft")} \
            if cfg.shared_warm_start and first else None
        main = Pipeline(runs.pop("dreamgym"), out / f"seed{seed}" / "dreamgym", reporter,
                        adopt=warm)
        if reporter:
            reporter.say(f"[bold]seed {seed}: dreamgym[/]")
        main.run()
        states[(seed, "dreamgym")] = main.state
        shared = {k: main.state["done"][k] for k in ("experience", "sft", "eval_sft")}
        for name, run_cfg in runs.items():
            if reporter:
                reporter.say(f"[bold]seed {seed}: {name}[/]")
            adopt = dict(shared) if run_cfg.use_retrieval and run_cfg.use_reasoning else \
                {k: shared[k] for k in ("sft", "eval_sft")}
            pipe = Pipeline(run_cfg, out / f"seed{seed}" / name, reporter, adopt=adopt)
            pipe.run()
            states[(seed, name)] = pipe.state
        # after every seed: a long bench stopped later still has the seeds it finished
        table = make_table(states, cfg, base)
        (out / TABLE_JSON).write_text(json.dumps(table, indent=2, sort_keys=True))
        (out / TABLE_MD).write_text(render_table(table), encoding="utf-8")
    return table


def make_table(states: dict[tuple[int, str], dict[str, Any]], cfg: BenchConfig,
               base: PipelineConfig) -> dict[str, Any]:
    """Rows of mean ± std real success over seeds, with the real RL transitions used."""
    rows = []
    seeds = sorted({seed for seed, _ in states})
    every_code: set[str] = set()
    for label, run, stage, trained in ROWS:
        values, reals = [], []
        codes: set[str] = set()
        for seed in seeds:
            done = states.get((seed, run), {}).get("done", {})
            if stage not in done:
                continue
            values.append(float(done[stage]["success"]))
            reals.append(sum(int(done[t].get("real_transitions", 0)) for t in trained))
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
            "code": sorted(codes),
        })
    return {"rows": rows, "seeds": len(seeds), "seeds_asked": cfg.seeds,
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
    lines += ["| method | real RL transitions (mean) | real success (mean ± std) | "
              "per seed |" + (" code |" if mixed else ""),
              "|---|---|---|---|" + ("---|" if mixed else "")]
    for row in table["rows"]:
        per_seed = ", ".join(f"{v:.3f}" for v in row["success"])
        lines.append(f"| {row['row']} | {row['real_transitions_mean']:.0f} | "
                     f"{row['success_mean']:.3f} ± {row['success_std']:.3f} | {per_seed} |"
                     + (f" {', '.join(row.get('code', []))} |" if mixed else ""))
    lines.append("")
    return "\n".join(lines)
