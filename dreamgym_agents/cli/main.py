"""The ``dg-agents`` command line: parse flags, load config, call one library function.

Every failure the user can fix ends as one line on stderr and a non-zero exit, never a traceback
(set ``DG_DEBUG=1`` to see one for an internal error).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

try:  # typer >= 0.20 vendors click as typer._click; older ones use click itself
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover - depends on the typer version
    from click import ClickException as _ClickException
import click

from dreamgym_agents import launch
from dreamgym_agents.cli.common import (
    AgentOpt,
    ConcurrencyOpt,
    ConfigOpt,
    LimitOpt,
    MaxStepsOpt,
    OutOpt,
    ProgramOpt,
    Sections,
    SeedOpt,
    SetOpt,
    Split,
    SplitOpt,
    TaskOpt,
    TasksFileOpt,
    VerboseOpt,
    build_agent,
)
from dreamgym_agents.cli.output import (
    make_console,
    print_summary,
    raise_if_failed,
    run_with_progress,
    setup_logging,
)
from dreamgym_agents.errors import ConfigError, DreamGymError

app = typer.Typer(
    name="dg-agents",
    help="Train LLM agents with synthetic experience (DreamGym).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


BUILTIN_AGENTS = ("oracle", "random")


@app.command("eval")
def eval_command(
    out: OutOpt,
    task: TaskOpt = "webarena",
    agent: AgentOpt = "oracle",
    program: ProgramOpt = None,
    split: SplitOpt = Split.test,
    tasks_file: TasksFileOpt = None,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = 2,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1,
                                 help="Steps per episode [15; real WebArena sites: 30; "
                                 "ALFWorld's official games: 50].")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed (site data, random agent) [0].")
    ] = None,
    judge: Annotated[
        str | None, typer.Option("--judge", help="Model for fuzzy_match evaluators.")
    ] = None,
    skip_unscorable: Annotated[
        bool, typer.Option("--skip-unscorable", help="Play only the tasks this setup can score "
                           "(default: refuse the run, naming the others).")
    ] = False,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run an agent on real environments and record its trajectories."""
    from dreamgym_agents.episodes.env import (
        EnvConfig,
        env_config_for_agent,
        env_options,
        make_family,
    )

    setup_logging(verbose)
    sections = Sections(config, overrides, ("env", "llm"))
    family = make_family(task)
    tasks = family.load_task_file(str(tasks_file)) if tasks_file else family.load_tasks(split.value)
    # Precedence: --set, then explicit flags, then the config file, then the family's
    # default, then the defaults. The family's default is the step limit its benchmark
    # evaluates these tasks with: 50 for ALFWorld's official games, 30 for real WebArena.
    flags = {k: v for k, v in (("max_steps", max_steps), ("judge_model", judge), ("seed", seed))
             if v is not None}
    standard = getattr(family, "standard_max_steps", None)
    default_steps = (standard(tasks) if standard else None) or \
        getattr(family, "default_max_steps", None)
    env_cfg = sections.configure(EnvConfig(**({"max_steps": default_steps}
                                              if default_steps else {})), "env", flags)
    env_options(family, env_cfg)  # the family's own env.* keys: one line before any episode
    seed = env_cfg.seed

    if limit is not None:
        tasks = tasks[:limit]
    tasks = scorable(family, tasks, env_cfg, skip=skip_unscorable)
    runner = build_agent(agent, seed=seed, family=family, sections=sections,
                         concurrency=concurrency, program=program)
    env_cfg = env_config_for_agent(family, env_cfg, runner)
    meta = {
        "command": "eval", "task": task, "agent": agent,
        **({"program": program} if program else {}),
        "split": split.value if not tasks_file else "", "tasks_file": str(tasks_file or ""),
        "limit": limit, "max_steps": env_cfg.max_steps, "seed": seed,
    }
    console = make_console()
    try:
        console.print(f"[bold]{task}[/]: {family.prepare(env_cfg, tasks)}")
        result = _run(console, family, env_cfg, tasks, runner, out, concurrency, meta)
    finally:
        family.close()
    print_summary(console, result.summary, out)
    raise_if_failed(result, out, console)


def scorable(family: Any, tasks: list, env_cfg: Any, *, skip: bool) -> list:
    """``tasks``, checked before a step is spent: the family names those it cannot score
    (``TaskFamily.unscorable``, optional); they refuse the run in one line, or, with ``skip``,
    are left out with a warning.

    Raises:
        ConfigError: Some tasks cannot be scored and ``skip`` is off.
    """
    check = getattr(family, "unscorable", None)
    refused = check(tasks, env_cfg) if check is not None else {}
    if not refused:
        return tasks
    by_reason: dict[str, list[str]] = {}
    for task_id, reason in refused.items():
        by_reason.setdefault(reason, []).append(str(task_id))
    text = "; ".join(f"{len(ids)} {reason}: {_ids(ids)}" for reason, ids in by_reason.items())
    head = f"{len(refused)} of {len(tasks)} task(s) cannot be scored here: {text}"
    if not skip:
        raise ConfigError(f"{head} (--skip-unscorable plays the other {len(tasks) - len(refused)})")
    logging.getLogger(__name__).warning("%s: left out", head)
    kept = [t for t in tasks if t.task_id not in refused]
    if not kept:
        raise ConfigError(f"{head}: none left to play")
    return kept


def _ids(ids: list[str], shown: int = 8) -> str:
    return ", ".join(ids[:shown]) + (f" … (+{len(ids) - shown})" if len(ids) > shown else "")


def _run(console: Any, family: Any, env_cfg: Any, tasks: list, agent: Any, out: Path,
         concurrency: int, meta: dict) -> Any:
    """Play one episode per task with ``agent`` into ``out`` (resumable), with a progress bar."""
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes

    console.print(f"{len(tasks)} task(s), agent {agent.name}, concurrency {concurrency} → {out}")
    run_cfg = RunConfig(out_dir=out, concurrency=concurrency, max_steps=env_cfg.max_steps,
                        meta=meta)
    return run_with_progress(
        console, len(tasks),
        lambda cb: run_episodes(tasks, lambda: family.make_env(env_cfg), agent, run_cfg,
                                on_episode=cb),
    )


@app.command("collect")
def collect_command(
    out: OutOpt,
    task: TaskOpt = "webarena",
    split: SplitOpt = Split.train,
    agents: Annotated[
        str | None, typer.Option("--agents", help=(
            "Comma list of the family's offline agents (webarena: oracle, noisy, quitter, "
            "random, explorer: every listing page and item, orders: every order of My Orders; "
            "alfworld: oracle, noisy, random). Default: all of them but the explorers. An "
            "agent that needs longer episodes (the explorers: 27 steps) gets them."))
    ] = None,
    noise: Annotated[
        float, typer.Option("--noise", min=0.0, max=1.0, help="Exploration rate of noisy.")
    ] = 0.3,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = 2,
    max_steps: MaxStepsOpt = 12,
    seed: SeedOpt = 0,
    verbose: VerboseOpt = False,
) -> None:
    """Gather offline data on real environments with the family's offline agents (oracle,
    noisy oracle, random, …).

    Each agent's run goes to OUT/<agent>/ (resumable like eval); all their transitions are then
    written, relabelled ``offline``, to OUT/offline.jsonl (what seeds the buffer and trains the
    experience model).
    """
    from dreamgym_agents.episodes.env import EnvConfig, make_family
    from dreamgym_agents.types import read_trajectories, write_trajectories

    setup_logging(verbose)
    env_cfg = EnvConfig(max_steps=max_steps, seed=seed)
    family = make_family(task)
    offline = family.offline_agents(seed=seed, noise=noise)
    if agents is None:
        names = [n for n, agent in offline.items() if not hasattr(agent, "assign")]
    else:
        names = [a.strip() for a in agents.split(",") if a.strip()]
    unknown = sorted(set(names) - set(offline))
    if unknown or not names:
        family.close()
        raise ConfigError(f"--agents takes a comma list of {', '.join(offline)} "
                          f"(the {family.name} family's offline agents), got {agents!r}")
    tasks = family.load_tasks(split.value)[:limit]
    console = make_console()
    results = {}
    try:
        console.print(f"[bold]{task}[/]: {family.prepare(env_cfg, tasks)}")
        for name in names:
            meta = {"command": "collect", "task": task, "agent": name, "split": split.value,
                    "limit": limit, "max_steps": max_steps, "seed": seed,
                    **({"noise": noise} if name == "noisy" else {})}
            agent, agent_env = offline[name], env_cfg
            if hasattr(agent, "assign"):  # an explorer: each task is one slot of its walk
                agent.assign(tasks)
            if getattr(agent, "min_steps", 0) > max_steps:
                agent_env = replace(env_cfg, max_steps=agent.min_steps)
                meta["max_steps"] = agent_env.max_steps
            results[name] = _run(console, family, agent_env, tasks, agent, out / name,
                                 concurrency, meta)
            print_summary(console, results[name].summary, out / name)
    finally:
        family.close()
    merged = []
    for name in names:
        for traj in read_trajectories(out / name / "trajectories.jsonl"):
            traj.provenance = "offline"
            for t in traj.transitions:
                t.provenance = "offline"
            merged.append(traj)
    count = write_trajectories(out / "offline.jsonl", merged)
    steps = sum(len(t.transitions) for t in merged)
    console.print(f"wrote {out / 'offline.jsonl'}: {count} episodes, {steps} transitions")
    for name in names:
        raise_if_failed(results[name], out / name, console)


@app.command("doctor")
def doctor_command(task: TaskOpt = "webarena") -> None:
    """Report the installed extras, the embedded bundle, which API keys are set (never their
    values) and what each task family needs; exit 1 when --task's family cannot run."""
    from dreamgym_agents.cli.doctor import run_doctor

    raise typer.Exit(run_doctor(task))


from dreamgym_agents.cli.experience import register as _register_experience_commands  # noqa: E402

_register_experience_commands(app)

from dreamgym_agents.cli.policy import register as _register_policy_commands  # noqa: E402

_register_policy_commands(app)

from dreamgym_agents.cli.build import register as _register_build_commands  # noqa: E402

_register_build_commands(app)

from dreamgym_agents.cli.calibrate import register as _register_calibrate_commands  # noqa: E402
from dreamgym_agents.cli.models import register as _register_model_commands  # noqa: E402
from dreamgym_agents.cli.optimize import register as _register_optimize_commands  # noqa: E402

_register_calibrate_commands(app)
_register_model_commands(app)
_register_optimize_commands(app)


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C: stop local generations at their next token (the process would otherwise wait at
    exit for a long answer to finish), then interrupt as Python does."""
    from dreamgym_agents.gateway.local import interrupt_local_generation

    _STOPPED.append("SIGINT")
    interrupt_local_generation()
    signal.default_int_handler(signum, frame)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's stop): ended as Ctrl-C ends a command, saying so."""


_STOPPED: list[str] = []
"""The signals that stopped the running command (typer turns the interrupt into a plain exit
status 130, so :func:`_main` reads here why the command ended)."""

STOP_LINES = {"SIGINT": ("interrupted: rerun the same command to resume", 130),
              "SIGTERM": ("terminated (SIGTERM): rerun the same command to resume", 143)}


def _on_sigterm(signum: int, frame: Any) -> None:
    from dreamgym_agents.gateway.local import interrupt_local_generation

    _STOPPED.append("SIGTERM")
    interrupt_local_generation()
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app and turn every error into one line and an exit code."""
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)  # signal handlers belong to the main thread
    previous = signal.signal(signal.SIGINT, _on_sigint)
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


LAUNCHABLE = ("train-experience",)
"""The commands that train in several processes under ``torchrun`` / ``accelerate launch``
(:mod:`dreamgym_agents.launch`); the others would run whole, once per process."""


def _main(argv: list[str] | None) -> int:
    _STOPPED.clear()  # a signal of an earlier command in this process is not this one's
    try:
        words = sys.argv[1:] if argv is None else argv
        command = next((w for w in words if not w.startswith("-")), None)
        if launch.world_size() > 1 and command is not None and command not in LAUNCHABLE:
            raise ConfigError(f"dg-agents {command} runs in one process: under torchrun or "
                              f"accelerate launch only {', '.join(LAUNCHABLE)} trains in "
                              "several (docs/GPU.md)")
        result = app(args=argv, standalone_mode=False)
    except (typer.Exit, click.exceptions.Exit) as exc:
        return exc.exit_code
    except (typer.Abort, click.exceptions.Abort):
        if _STOPPED:
            return _stopped()
        print("aborted", file=sys.stderr)
        return 130
    except (_ClickException, click.ClickException) as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # help was printed: not an error
            return 0
        message = exc.format_message().strip().replace("\n", " ")
        param = getattr(exc, "param", None)
        hint = getattr(param, "opts", None)
        if hint and hint[0] not in message:
            message = f"{hint[0]}: {message}"
        print(f"error: {message}", file=sys.stderr)
        return exc.exit_code
    except DreamGymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        if not _STOPPED:
            _STOPPED.append("SIGTERM" if isinstance(exc, Terminated) else "SIGINT")
        return _stopped()
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if os.environ.get("DG_DEBUG"):
            raise
        first = str(exc).strip().splitlines()
        print(f"internal error: {type(exc).__name__}: {first[0] if first else ''} "
              "(set DG_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
    if _STOPPED:  # typer's exit status 130 for an interrupt: say why the command ended
        return _stopped()
    return result if isinstance(result, int) else 0


def _stopped() -> int:
    """The line and exit status of a command a signal stopped (:data:`STOP_LINES`)."""
    line, status = STOP_LINES[_STOPPED[0]]
    _STOPPED.clear()
    print(line, file=sys.stderr)
    return status


def _register_family_commands() -> None:
    """Commands that families add (entry points ``dreamgym_agents.commands``: a function taking
    the typer app), e.g. the web family's ``site``. One that fails to load is skipped with a
    warning: the rest of the CLI stays usable."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="dreamgym_agents.commands"):
        try:
            ep.load()(app)
        except Exception as exc:  # a broken plugin must not take the CLI down
            logging.getLogger(__name__).warning("commands of %s not loaded: %s", ep.name, exc)


_register_family_commands()


if __name__ == "__main__":
    sys.exit(main())
