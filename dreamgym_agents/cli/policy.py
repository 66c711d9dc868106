"""The ``run`` and ``bench`` commands: policy learning end to end (no logic here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dreamgym_agents.cli.common import ConfigOpt, OutOpt, SetOpt, TaskOpt, VerboseOpt
from dreamgym_agents.cli.output import progress_reporter, setup_logging
from dreamgym_agents.errors import ConfigError

PresetOpt = Annotated[str, typer.Option("--preset", help="quick (~15 min) or full.")]
PolicyOpt = Annotated[
    str, typer.Option("--policy", help="embedded (trained here), hf/<checkpoint>, or a hosted "
                      "model string (its prompt is learnt with DSPy instead of weights).")
]


def _pipeline_config(preset: str, seed: int, policy: str, sim_to_real: bool | None,
                     config: Path | None, overrides: list[str] | None, task: str) -> Any:
    from dreamgym_agents.config import load_config
    from dreamgym_agents.gateway.llm import check_model_string
    from dreamgym_agents.pipeline.run import is_hosted, preset_config, pretrained_defaults

    if is_hosted(policy):
        check_model_string(policy)
    cfg = preset_config(preset, seed, task)
    cfg.policy = policy
    if policy.startswith("hf/"):  # per-model defaults, below the config file and --set
        pretrained_defaults(cfg)
    if sim_to_real is not None:
        cfg.sim_to_real = sim_to_real
    return load_config(cfg, config, overrides)


def run_command(
    out: OutOpt,
    task: TaskOpt = "webarena",
    preset: PresetOpt = "quick",
    policy: PolicyOpt = "embedded",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the policy and sampling.")] = 0,
    sim_to_real: Annotated[
        bool | None, typer.Option("--sim-to-real/--no-sim-to-real",
                                  help="Run the sim-to-real stages [preset].")
    ] = None,
    rerun_from: Annotated[
        str | None, typer.Option("--rerun-from", help="Run this stage and every later one "
                                 "again (the finished ones' records are kept aside): e.g. "
                                 "after a fix, s2r or eval_sft.")
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """The whole pipeline: offline data → experience model → policy warm start → dream RL with
    curriculum → real evaluation → sim-to-real → evaluation → report. Rerun the same command to
    resume; --set reaches every setting (sft.max_steps=400, dream.max_steps=40, eval_limit=31 …).
    A hosted --policy (openai/…, any LiteLLM model) learns a prompt instead: worked examples,
    then DSPy's GEPA in the dream, then on a real-transition budget (--set prompt.budget=24,
    policy_llm.api_base=…).
    """
    from dreamgym_agents.pipeline.prompt_run import make_pipeline

    setup_logging(verbose)
    cfg = _pipeline_config(preset, seed, policy, sim_to_real, config, overrides, task)
    cfg.task = task
    with progress_reporter() as reporter:
        summary = make_pipeline(cfg, out, reporter, rerun_from=rerun_from).run()
        keys = ("sft_success", "dream_success", "s2r_success", "real_transitions_used",
                "synthetic_transitions", "wall_seconds")
        reporter.say("  ".join(f"{k}={summary.get(k)}" for k in keys))
        reporter.say(f"report: {out / 'report.md'}")
    print(json.dumps({k: summary.get(k) for k in keys}))


def bench_command(
    out: OutOpt,
    task: TaskOpt = "webarena",
    seeds: Annotated[int, typer.Option("--seeds", min=1, max=20, help="Seeds per row.")] = 5,
    preset: PresetOpt = "full",
    real_budget: Annotated[
        int | None, typer.Option("--real-budget", min=1,
                                 help="N: real transitions of GRPO-real (S2R gets N/10).")
    ] = None,
    ablations: Annotated[
        bool, typer.Option("--ablations/--no-ablations", help="Run the three ablation rows.")
    ] = True,
    ablation: Annotated[
        list[str] | None, typer.Option("--ablation",
                                       help="Run only this ablation row (repeatable): "
                                            "no_retrieval, no_reasoning, no_task_generation.")
    ] = None,
    variant: Annotated[
        list[str] | None, typer.Option("--variant",
                                       help="Also run this declared variant (repeatable): "
                                            "state_reward (the dream's rewards from the "
                                            "family's check of the predicted state).")
    ] = None,
    shared_warm_start: Annotated[
        bool, typer.Option("--shared-warm-start/--own-warm-start",
                           help="Every seed starts from seed 0's warm start (the seeds vary "
                                "the RL), or each seed trains its own.")
    ] = True,
    algorithm: Annotated[
        list[str] | None, typer.Option("--algorithm",
                                       help="The RL rows' algorithm (repeatable): grpo (the "
                                            "default), ppo (PPO-real(N), DreamGym (PPO), "
                                            "DreamGym-S2R (PPO)), or both.")
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", min=1,
                          help="Runs at a time, each in its own process with its share of the "
                               "CPU threads (1: one after another).")
    ] = 1,
    records: Annotated[
        Path | None, typer.Option("--records",
                                  help="Folder of the finished runs' records (default "
                                       "OUT/records): settings, stage results and per-task "
                                       "outcomes, small enough to commit; a bench given it "
                                       "again, anywhere, takes its recorded runs as finished.")
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Table 1's shape on the task's real test split: SFT, GRPO-real(N), DreamGym (0 real),
    DreamGym-S2R (≤ N/10) and the ablations, each as mean ± std over seeds and as its paired
    difference to SFT and to GRPO-real(N) on the same (seed, task) pairs, with a 95 % bootstrap
    interval. Writes table.json and table.md; rerun the same command to resume
    (with --records, on another machine too).
    """
    from dreamgym_agents.pipeline.bench import ABLATIONS, BenchConfig, run_bench

    setup_logging(verbose)
    base = _pipeline_config(preset, 0, "embedded", None, config, overrides, task)
    base.task = task
    if ablation and not ablations:
        raise ConfigError("--no-ablations and --ablation contradict each other: give one")
    chosen = tuple(ablation) if ablation else tuple(ABLATIONS) if ablations else ()
    bench_cfg = BenchConfig(seeds=seeds, real_budget=real_budget, ablations=chosen,
                            variants=tuple(variant or ()), shared_warm_start=shared_warm_start,
                            algorithms=tuple(algorithm or ("grpo",)),
                            jobs=jobs, records=str(records) if records else None)
    with progress_reporter() as reporter:
        table = run_bench(base, bench_cfg, out, reporter)
        reporter.say(f"wrote {out / 'table.md'} and {out / 'table.json'}")
    print(json.dumps({row["row"]: row["success_mean"] for row in table["rows"]}))


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("bench")(bench_command)
