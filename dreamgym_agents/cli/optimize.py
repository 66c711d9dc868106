"""``dg-agents optimize``: DSPy prompt optimisation (the hosted-API mode)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from dreamgym_agents.cli.common import (
    BufferPathOpt,
    ConfigOpt,
    ExperienceModelOpt,
    OutOpt,
    Sections,
    SetOpt,
    TaskOpt,
    VerboseOpt,
)
from dreamgym_agents.cli.experience import build_experience, resolve_experience_model
from dreamgym_agents.cli.output import make_console, setup_logging
from dreamgym_agents.errors import ConfigError

OPTIMIZE_SECTIONS = ("llm", "agent", "reflection", "experience", "buffer", "dream", "optimize")


class Target(StrEnum):
    agent = "agent"
    experience = "experience"
    task_generator = "task-generator"


def optimize_command(
    out: OutOpt,
    model: Annotated[str, typer.Option(
        "--model", help="The model whose prompt is optimised (a LiteLLM model string).")],
    target: Annotated[Target, typer.Option("--target", help="Which prompt program.")] = (
        Target.agent),
    task: TaskOpt = "webarena",
    name: Annotated[str | None, typer.Option(
        "--name", help="Also save the program as prompts/programs/NAME.json (load it by NAME)."
    )] = None,
    reflection_model: Annotated[str | None, typer.Option(
        "--reflection-model", help="The model GEPA asks for new instructions [--model].")] = None,
    experience_model: ExperienceModelOpt = None,
    buffer_path: BufferPathOpt = None,
    demos_file: Annotated[Path | None, typer.Option(
        "--demos", exists=True, dir_okay=False,
        help="Real demonstrations (trajectories.jsonl) for the worked examples [the embedded "
             "bundle's oracle episodes].")] = None,
    real: Annotated[list[Path] | None, typer.Option(
        "--real", exists=True, help="--target experience: a dg-agents eval folder of real "
        "episodes on validation tasks (repeatable) [played here by the family's oracle and "
        "random agents].")] = None,
    budget: Annotated[int | None, typer.Option(
        "--budget", min=1, help="What the optimiser may spend: dream episodes (agent), step "
        "predictions (experience) [24].")] = None,
    confirm: Annotated[int | None, typer.Option(
        "--confirm", min=0, help="Real test tasks played before and after (0: none) [5].")] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Optimise a prompt program with DSPy (GEPA) against the dream, then confirm on real tasks.

    --target agent: the agent's instruction (GEPA, scored by success in the dream: 0 real
    transitions) and worked examples (dspy.LabeledFewShot from real demonstrations), then the
    prompt before and after on --confirm real test tasks. Writes OUT/program.json,
    OUT/summary.json, every dream episode (OUT/dream/trajectories.jsonl) and real episode, and
    GEPA's log. --set agent.* configures the model's gateway, reflection.* the reflection
    model's, llm.* the experience model's, optimize.* the budget and task counts.
    """
    from dreamgym_agents.episodes.env import EnvConfig, make_family
    from dreamgym_agents.experience.dream import DreamConfig, DreamEnv
    from dreamgym_agents.optimize.agent import OptimizeConfig, optimize_agent

    setup_logging(verbose)
    console = make_console()
    sections = Sections(config, overrides, OPTIMIZE_SECTIONS)
    flags = {k: v for k, v in (("budget", budget), ("confirm_tasks", confirm)) if v is not None}
    cfg = sections.configure(OptimizeConfig(), "optimize", flags)
    family = make_family(task)
    if target is Target.experience:
        _optimize_experience(cfg, sections, family, model, reflection_model, buffer_path,
                             real or [], out, name, console)
        return
    if target is Target.task_generator:
        _optimize_task_generator(cfg, sections, family, model, reflection_model, out, name,
                                 console)
        return
    demos = _demonstrations(task, demos_file) if cfg.demos else []
    em_name, model_buffer = resolve_experience_model(experience_model, task, say=console.print)
    gateway = sections.gateway(model, "agent")
    reflection = sections.gateway(reflection_model or model, "reflection")
    try:
        em, em_gateway, buffer = build_experience(sections, family, em_name, buffer_path, None,
                                                  False, False, False, model_buffer)
    except BaseException:
        for closeable in (gateway, reflection, family):
            closeable.close()
        raise
    dream_cfg = sections.configure(DreamConfig(), "dream")
    env_cfg = EnvConfig(max_steps=cfg.max_steps, seed=cfg.seed)
    try:
        if cfg.confirm_tasks:
            from dreamgym_agents.episodes.env import spread_tasks

            console.print(family.prepare(env_cfg, spread_tasks(family.load_tasks("test"),
                                                               cfg.confirm_tasks)))
        console.print(f"[bold]optimize[/] the {target.value} prompt of {model} on {task}: "
                      f"experience model {em_name} → {out}")
        result = optimize_agent(
            cfg, family=family, gateway=gateway, reflection=reflection,
            make_dream_env=lambda: DreamEnv(dream_cfg, em, buffer, family),
            make_real_env=(lambda: family.make_env(env_cfg)) if cfg.confirm_tasks else None,
            demos=demos, out=out, say=console.print)
    finally:
        for closeable in (buffer, em_gateway, gateway, reflection, family):
            closeable.close()
    _finish(out, result.program, name, console, f"--program {name}", {
        "target": target.value, "task": task, "model": model, "experience_model": em_name,
        "dream_episodes": result.dream_episodes,
        "synthetic_transitions": result.synthetic_transitions,
        "real_transitions": result.real_transitions, "scores": result.scores,
        "usage": {"agent": _usage(gateway), "reflection": _usage(reflection),
                  "experience_model": _usage(em_gateway)}})


def _finish(out: Path, program: Any, name: str | None, console: Any, use: str,
            summary: dict[str, Any]) -> None:
    """Save the program (in OUT, and as ``name``) and OUT/summary.json; say how to use it."""
    from dreamgym_agents.prompts.programs import save_program

    path = save_program(program, str(out / "program.json"))
    summary = {"command": "optimize", **summary}
    if name:
        summary["saved_as"] = str(save_program(program, name))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    console.print(f"real transitions {summary['real_transitions']}, dream episodes "
                  f"{summary['dream_episodes']}; scores {json.dumps(summary['scores'])}")
    console.print(f"program → {path}" + (f" (use it with {use})" if name else ""))


def _optimize_experience(cfg: Any, sections: Sections, family: Any, model: str,
                         reflection_model: str | None, buffer_path: Path | None,
                         real: list[Path], out: Path, name: str | None, console: Any) -> None:
    from dreamgym_agents.episodes.env import EnvConfig, spread_tasks
    from dreamgym_agents.experience.fidelity_run import load_real_run
    from dreamgym_agents.optimize.experience import optimize_experience

    _, embedded_buffer = (None, None) if buffer_path else resolve_experience_model(
        None, family.name, say=console.print)
    em, em_gateway, buffer = build_experience(sections, family, model, buffer_path, None, False,
                                              False, False, embedded_buffer)
    reflection = sections.gateway(reflection_model or model, "reflection")
    env_cfg = EnvConfig(max_steps=cfg.max_steps, seed=cfg.seed)
    try:
        if em.cfg.prompt_style != "full":
            raise ConfigError(f"{model} is prompted with the compact prompt, which has no "
                              "instruction to optimise: --set experience.prompt_style=full")
        val_tasks = spread_tasks(family.load_tasks("validation"), cfg.val_tasks)
        test_tasks = spread_tasks(family.load_tasks("test"), cfg.confirm_tasks) \
            if cfg.confirm_tasks else []
        console.print(family.prepare(env_cfg, val_tasks + test_tasks))
        used = 0
        if real:
            held_out = [t for path in real for t in load_real_run(path).trajectories]
        else:
            held_out, used = _play_real(family, val_tasks, env_cfg, out / "real-validation")
        confirm, more = (_play_real(family, test_tasks, env_cfg, out / "real-test")
                         if test_tasks else ([], 0))
        console.print(f"[bold]optimize[/] the experience prompt of {model} on {family.name}: "
                      f"{len(held_out)} held-out real episodes → {out}")
        program, scores = optimize_experience(
            em, reflection=reflection, held_out=held_out, confirm=confirm, budget=cfg.budget,
            train_steps=cfg.train_steps, val_steps=cfg.val_steps, minibatch=cfg.minibatch,
            seed=cfg.seed, out=out, family=family.name,
            strip_ids=family.state_format().strip_ids, say=console.print)
    finally:
        for closeable in (buffer, em_gateway, reflection, family):
            closeable.close()
    _finish(out, program, name, console, f"--set experience.program={name}", {
        "target": "experience", "task": family.name, "model": model,
        "real_transitions": used + more, "dream_episodes": 0, "scores": scores,
        "usage": {"experience_model": _usage(em_gateway), "reflection": _usage(reflection)}})


def _optimize_task_generator(cfg: Any, sections: Sections, family: Any, model: str,
                             reflection_model: str | None, out: Path, name: str | None,
                             console: Any) -> None:
    from dreamgym_agents.episodes.env import spread_tasks
    from dreamgym_agents.heldout import HeldOut
    from dreamgym_agents.optimize.task_generator import optimize_task_generator
    from dreamgym_agents.rl.curriculum import (
        Curriculum,
        CurriculumConfig,
        LLMTaskGenerator,
        TemplateTaskGenerator,
        grounded_in,
    )

    held_out = HeldOut.for_family(family)
    train = held_out.keep(family.load_tasks("train"), "optimize_seeds")
    hook = getattr(family, "task_generator", None)
    _, feasible = (hook(train, cfg.seed) if hook is not None
                   else (TemplateTaskGenerator(train, cfg.seed), grounded_in("", train)))
    curriculum = Curriculum(CurriculumConfig(), None, train, feasible=feasible, seed=cfg.seed,
                            held_out=held_out, keys=getattr(family, "task_keys", None))
    seeds = spread_tasks(train, cfg.train_tasks + cfg.val_tasks)
    gateway = sections.gateway(model, "agent")
    reflection = sections.gateway(reflection_model or model, "reflection")
    generator = LLMTaskGenerator(gateway, start_key=family.state_format().start_key)
    try:
        console.print(f"[bold]optimize[/] the task-generator prompt of {model} on "
                      f"{family.name}: {len(seeds)} seed tasks → {out}")
        out.mkdir(parents=True, exist_ok=True)
        program, scores = optimize_task_generator(
            generator, curriculum, reflection=reflection, seeds=seeds,
            candidates=CurriculumConfig().candidates, budget=cfg.budget,
            train_seeds=cfg.train_tasks, minibatch=cfg.minibatch, seed=cfg.seed, out=out,
            family=family.name, say=console.print)
    finally:
        for closeable in (gateway, reflection, family):
            closeable.close()
    _finish(out, program, name, console, f"--set curriculum.generator_program={name}", {
        "target": "task-generator", "task": family.name, "model": model,
        "real_transitions": 0, "dream_episodes": 0, "scores": scores,
        "usage": {"generator": _usage(gateway), "reflection": _usage(reflection)}})


def _play_real(family: Any, tasks: list, env_cfg: Any, folder: Path) -> tuple[list, int]:
    """The family's oracle and random agents on ``tasks`` in real environments (resumable);
    (their episodes, the real transitions they took)."""
    import asyncio

    from dreamgym_agents.episodes.graph import RunConfig, run_episodes
    from dreamgym_agents.experience.fidelity_run import load_real_run

    episodes, used = [], 0
    agents = family.offline_agents(env_cfg.seed)
    for who in ("oracle", "random"):
        if who not in agents:
            continue
        run_cfg = RunConfig(out_dir=folder / who, concurrency=2, max_steps=env_cfg.max_steps,
                            meta={"command": "optimize-real", "agent": who})
        result = asyncio.run(run_episodes(tasks, lambda: family.make_env(env_cfg), agents[who],
                                          run_cfg))
        result.check("real", run_cfg.out_dir / "errors.jsonl")
        used += result.summary["real_transitions"]
        episodes += load_real_run(run_cfg.out_dir).trajectories
    return episodes, used


def _usage(gateway: object) -> dict[str, float]:
    from dataclasses import asdict

    return asdict(gateway.usage)  # type: ignore[attr-defined]


def _demonstrations(task: str, path: Path | None) -> list:
    """Real demonstrations: the file given, else the shipped bundle's oracle episodes."""
    from dreamgym_agents.pipeline.bundle import read_episodes, shipped_bundle
    from dreamgym_agents.types import read_trajectories

    if path is not None:
        return (read_episodes(path) if path.suffix == ".gz" else read_trajectories(path))
    bundle = shipped_bundle(task.split(".", 1)[0])
    if bundle is None:
        raise ConfigError(f"no embedded bundle for {task!r} to take worked examples from: give "
                          "--demos trajectories.jsonl, or --set optimize.demos=0")
    return read_episodes(bundle.demos_file)


def register(app: typer.Typer) -> None:
    """Add ``optimize`` to ``dg-agents``."""
    app.command("optimize")(optimize_command)
