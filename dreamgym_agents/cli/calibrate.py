"""``dg-agents calibrate``: one agent on the same tasks in the dream and for real, compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dreamgym_agents.cli.common import (
    AgentOpt,
    BufferPathOpt,
    ConcurrencyOpt,
    ConfigOpt,
    ExperienceModelOpt,
    LimitOpt,
    OutOpt,
    Sections,
    SeedOpt,
    SetOpt,
    Split,
    SplitOpt,
    TaskOpt,
    VerboseOpt,
    build_agent,
)
from dreamgym_agents.cli.output import make_console, setup_logging

CALIBRATE_SECTIONS = ("llm", "agent", "experience", "buffer", "dream", "env")


def calibrate_command(
    out: OutOpt,
    task: TaskOpt = "webarena",
    agent: AgentOpt = "oracle",
    split: SplitOpt = Split.validation,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = 4,
    max_steps: Annotated[int | None, typer.Option(
        "--max-steps", min=1, help="Steps per episode [the family's, else 15].")] = None,
    seed: SeedOpt = 0,
    experience_model: ExperienceModelOpt = None,
    buffer_path: BufferPathOpt = None,
    real: Annotated[Path | None, typer.Option(
        "--real", help="A dg-agents eval folder of this agent on these tasks: its episodes "
                       "are the real side (none played).")] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Play one agent on the same tasks in the dream and in the real environment (greedy, or
    with the same sampling seeds) and compare: success in both per evaluator kind, their
    per-task agreement, the dream's false rewards (real failures it rewarded) and missed
    rewards. Writes OUT/calibration.json and OUT/calibration.md; rerun to resume.
    --set agent.temperature=1 samples a policy (each turn seeded by --seed, episode and turn).
    """
    from dreamgym_agents.cli.experience import build_experience, resolve_for_cli
    from dreamgym_agents.episodes.env import EnvConfig, env_options, make_family, spread_tasks
    from dreamgym_agents.experience.calibration import (
        CALIBRATION_FILE,
        calibrate_policy,
        render,
        summary_line,
    )
    from dreamgym_agents.experience.dream import DreamConfig

    setup_logging(verbose)
    console = make_console()
    experience_model, model_buffer = resolve_for_cli(experience_model, task, False, False,
                                                     False, console)
    sections = Sections(config, overrides, CALIBRATE_SECTIONS)
    family = make_family(task)
    default_steps = getattr(family, "default_max_steps", None)
    env_cfg = sections.configure(EnvConfig(**({"max_steps": default_steps}
                                              if default_steps else {})), "env",
                                 {k: v for k, v in (("max_steps", max_steps), ("seed", seed))
                                  if v is not None})
    env_options(family, env_cfg)
    dream_cfg = sections.configure(DreamConfig(), "dream")
    tasks = spread_tasks(family.load_tasks(split.value), limit)
    runner = build_agent(agent, seed=seed, family=family, sections=sections, section="agent",
                         concurrency=concurrency)
    if hasattr(runner, "seed") and getattr(runner, "temperature", 0) > 0:
        runner.seed = seed  # a sampled policy: the same draws, turn by turn, on both sides
    model, gateway, buffer = build_experience(sections, family, experience_model, buffer_path,
                                              None, False, False, False, model_buffer,
                                              concurrency)
    meta = {"command": "calibrate", "task": task, "agent": agent, "split": split.value,
            "limit": limit, "max_steps": env_cfg.max_steps, "seed": seed,
            "experience_model": experience_model}
    try:
        console.print(f"[bold]{task}[/]: {family.prepare(env_cfg, tasks)}")
        console.print(f"calibrate: {runner.name} on {len(tasks)} {split.value} task(s), in the "
                      f"dream ({experience_model}) and "
                      + (f"as played in {real}" if real else "for real") + f" → {out}")
        result = calibrate_policy(tasks, runner, family, model, buffer, Path(out),
                                  concurrency=concurrency, max_steps=env_cfg.max_steps,
                                  meta=meta, real_folder=real, dream_cfg=dream_cfg,
                                  env_cfg=env_cfg,
                                  trained=family.dream_eval_types or family.eval_types)
    finally:
        buffer.close()
        gateway.close()
        if hasattr(runner, "gateway"):
            runner.gateway.close()
        family.close()
    lines = render(result, f"{runner.name}: dream against reality, {split.value} split")
    (Path(out) / "calibration.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for line in lines:
        console.print(line, markup=False, highlight=False)
    console.print(f"all tasks: {summary_line(result)}")
    console.print(f"the kinds the dream trains on ({', '.join(result['trained']['kinds'])}): "
                  f"{summary_line(result, 'trained')}")
    console.print(f"wrote {Path(out) / CALIBRATION_FILE} and {Path(out) / 'calibration.md'}")
    print(json.dumps({"all": result["all"], "trained": result["trained"],
                      "by_kind": result["by_kind"]}))


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to ``dg-agents``."""
    app.command("calibrate")(calibrate_command)
