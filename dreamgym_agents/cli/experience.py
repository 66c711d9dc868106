"""``dg-agents buffer …``, ``dg-agents dream`` and ``dg-agents fidelity``: the experience side.

Like the rest of the CLI: parse flags, load config, call one library function. Heavy imports
(chromadb, LiteLLM, LangGraph) stay inside the commands so ``dg-agents --help`` stays fast. The
helpers shared with ``eval`` live in :mod:`dreamgym_agents.cli.main`, imported inside the commands
(``cli`` imports this module at its end, to register the commands).

``--set section.key=value`` (and ``--config FILE`` sections) of ``dream`` and ``fidelity``:

- ``llm.*`` — the experience model's gateway (``--experience-model`` is its ``llm.model``);
- ``agent.*`` — the agent's gateway when ``--agent`` is a model string (dream);
- ``judge.*`` — the judge's gateway (fidelity, with ``--judge``);
- ``experience.*``, ``buffer.*``, ``dream.*`` — ExperienceConfig, BufferConfig, DreamConfig;
- ``fidelity.*`` — FidelityConfig (fidelity).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from dreamgym_agents import launch
from dreamgym_agents.cli.common import (
    BUFFER_URL_ENV,
    DEFAULT_BUFFER_PATH,
    AgentOpt,
    BufferPathOpt,
    BufferUrlOpt,
    ConcurrencyOpt,
    ConfigOpt,
    ExperienceModelOpt,
    LimitOpt,
    NoHistoryOpt,
    NoReasoningOpt,
    NoRetrievalOpt,
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
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.embedded import EmbeddedRecipe

DREAM_SECTIONS = ("llm", "agent", "experience", "buffer", "dream")
FIDELITY_SECTIONS = ("llm", "judge", "experience", "buffer", "dream", "fidelity")


class Provenance(StrEnum):
    real = "real"
    offline = "offline"
    synthetic = "synthetic"


class Keep(StrEnum):
    newest = "newest"
    oldest = "oldest"


def resolve_experience_model(
    name: str | None, family: str, *, ablations: dict[str, bool] | None = None,
    say: Any = None,
) -> tuple[str, str | None]:
    """The experience model to use and the buffer that goes with it.

    ``name`` (a model string) is used as given, with no buffer of its own. No name, or
    ``embedded``, means the embedded default: built on first use (minutes, offline), then cached;
    its buffer holds the data it was trained on. Ablation flags select the matching embedded
    ablation model (trained without history, retrieval or reasoning), as in the paper.
    """
    from dreamgym_agents.pipeline.embedded import (
        EMBEDDED,
        ensure_embedded_experience_model,
        family_recipe,
    )

    if name and name != EMBEDDED:
        return name, None
    prefix = family.split(".", 1)[0]
    recipe = family_recipe(prefix, **(ablations or {}))
    paths = ensure_embedded_experience_model(prefix, recipe, progress=say)
    return paths["model"], paths["buffer"]


# --------------------------------------------------------------------------------------------
# dg-agents buffer …
# --------------------------------------------------------------------------------------------

PathOpt = Annotated[
    Path, typer.Option("--path", help="Directory of the embedded Chroma buffer.")
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar=BUFFER_URL_ENV,
                 help=f"Chroma server URL (http://host:port); also read from {BUFFER_URL_ENV}."),
]
EmbeddingOpt = Annotated[
    str, typer.Option("--embedding", help="hash, st:<model or path> or litellm:<model>.")
]


@contextmanager
def _open_buffer(path: Path, url: str | None, embedding: str,
                 family: str = "") -> Iterator[Any]:
    """The buffer; a new one embeds with ``family``'s features (an existing one keeps its own),
    and the episodes added key their starts by it (a family not installed here: none)."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.episodes.env import make_family

    made = None
    if family:
        try:
            made = make_family(family)
        except ConfigError as exc:
            logging.getLogger(__name__).warning("%s: its episodes are stored without a start "
                                                "key", exc)
    try:
        with ReplayBuffer(BufferConfig(path=str(path), url=url or None, embedding=embedding,
                                       family=family), made) as buffer:
            yield buffer
    finally:
        if made is not None:
            made.close()


def _first_family(file: Path) -> str:
    """The task family of the first record of a trajectories or buffer-export file ("" when
    it names none): what a new buffer seeded from it embeds by."""
    with open(file, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                return ""  # the reader says where and why
            task = data.get("task") if isinstance(data, dict) else None
            found = task.get("family") if isinstance(task, dict) else (
                data.get("family") if isinstance(data, dict) else None)
            return str(found or "")
    return ""


def _stdout() -> Any:
    from rich.console import Console

    return Console(soft_wrap=True)


def _where(buffer: Any) -> str:
    return buffer.cfg.url or buffer.cfg.path


buffer_app = typer.Typer(
    name="buffer", help="Inspect and maintain the replay buffer (Chroma).",
    invoke_without_command=True,
)


@buffer_app.callback()
def _buffer_group(ctx: typer.Context) -> None:
    # Help and exit 0 without a subcommand (no_args_is_help would end as an empty error line).
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def _check_files(files: list[Path], hint: str) -> None:
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"no such file: {', '.join(missing)} ({hint})")


@buffer_app.command("seed")
def buffer_seed(
    files: Annotated[
        list[Path],
        typer.Argument(metavar="FILE...",
                       help="trajectories.jsonl files (from dg-agents eval or collect)."),
    ],
    provenance: Annotated[
        Provenance, typer.Option("--provenance", help="Provenance the transitions are stored with.")
    ] = Provenance.offline,
    path: PathOpt = Path(DEFAULT_BUFFER_PATH),
    url: UrlOpt = None,
    embedding: EmbeddingOpt = "hash",
) -> None:
    """Add every transition of recorded episodes to the buffer."""
    _check_files(files, "pass the trajectories.jsonl of a `dg-agents eval --out DIR` run")
    with _open_buffer(path, url, embedding, _first_family(files[0])) as buffer:
        total = 0
        for file in files:
            added = buffer.seed_from_jsonl(file, provenance=provenance.value)
            total += added
            typer.echo(f"{file}: {added} transitions")
        typer.echo(f"added {total} transitions as {provenance.value} to {_where(buffer)} "
                   f"({buffer.count()} in total)")


@buffer_app.command("stats")
def buffer_stats(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    path: PathOpt = Path(DEFAULT_BUFFER_PATH),
    url: UrlOpt = None,
    embedding: EmbeddingOpt = "hash",
) -> None:
    """Totals of the buffer: transitions by provenance and family, episodes, tasks."""
    with _open_buffer(path, url, embedding) as buffer:
        stats = buffer.stats()
        where = _where(buffer)
    if as_json:
        typer.echo(json.dumps({"buffer": where, **stats}, sort_keys=True))
        return
    from rich.table import Table

    table = Table(title=f"replay buffer {where}")
    table.add_column("")
    table.add_column("transitions", justify="right")
    table.add_row("[bold]total", str(stats["total"]))
    for name, count in sorted(stats["by_provenance"].items()):
        table.add_row(f"provenance {name}", str(count))
    for name, count in sorted(stats["by_family"].items()):
        table.add_row(f"family {name or '(none)'}", str(count))
    table.add_row("episodes", str(stats["episodes"]))
    table.add_row("tasks", str(stats["tasks"]))
    _stdout().print(table)


@buffer_app.command("query")
def buffer_query(
    state_file: Annotated[
        Path, typer.Option("--state-file",
                           help="A file holding the abstract state (URL, Title, lines).")
    ],
    action: Annotated[str, typer.Option("--action", help="The action, e.g. \"click('12')\".")],
    k: Annotated[int, typer.Option("--k", min=1, help="How many transitions.")] = 3,
    provenance: Annotated[
        Provenance | None, typer.Option("--provenance", help="Only this provenance.")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", min=1, help="Next-state lines shown.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    path: PathOpt = Path(DEFAULT_BUFFER_PATH),
    url: UrlOpt = None,
    embedding: EmbeddingOpt = "hash",
) -> None:
    """Show the k stored transitions most similar to a (state, action)."""
    from dreamgym_agents.experience.model import transition_id

    _check_files([state_file], "write the state, as the models see it, to a file")
    state = state_file.read_text(encoding="utf-8")
    where = {"provenance": provenance.value} if provenance else None
    with _open_buffer(path, url, embedding) as buffer:
        found = buffer.retrieve(state, action, k=k, where=where)
    rows = [{"id": transition_id(t), "similarity": round(t.info["similarity"], 4),
             "action": t.action, "reward": t.reward, "done": t.done,
             "provenance": t.provenance,
             "next_state": "\n".join(t.next_state.strip().splitlines()[:lines])} for t in found]
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table(title=f"top {k} for {action}", show_lines=True)
    for name in ("id", "similarity", "action", "reward", "done", "next state"):
        table.add_column(name, justify="right" if name in ("similarity", "reward") else "left",
                         overflow="fold")
    for row in rows:
        table.add_row(row["id"], f"{row['similarity']:.3f}", row["action"], f"{row['reward']:g}",
                      str(row["done"]).lower(), row["next_state"])
    _stdout().print(table if rows else "no transitions found")


@buffer_app.command("prune")
def buffer_prune(
    provenance: Annotated[
        Provenance | None,
        typer.Option("--provenance", help="Only this provenance (all of it without --max-size)."),
    ] = None,
    max_size: Annotated[
        int | None, typer.Option("--max-size", min=0, help="Keep at most N transitions.")
    ] = None,
    keep: Annotated[
        Keep, typer.Option("--keep", help="Which ones --max-size keeps.")
    ] = Keep.newest,
    path: PathOpt = Path(DEFAULT_BUFFER_PATH),
    url: UrlOpt = None,
    embedding: EmbeddingOpt = "hash",
) -> None:
    """Remove transitions: all of one provenance, or the oldest (newest) beyond --max-size."""
    if provenance is None and max_size is None:
        raise ConfigError("buffer prune needs --provenance and/or --max-size")
    with _open_buffer(path, url, embedding) as buffer:
        removed = buffer.prune(provenance=provenance.value if provenance else None,
                               max_size=max_size, keep=keep.value)
        typer.echo(f"removed {removed} transitions ({buffer.count()} left in {_where(buffer)})")


@buffer_app.command("export")
def buffer_export(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The JSONL file to write.")],
    path: PathOpt = Path(DEFAULT_BUFFER_PATH),
    url: UrlOpt = None,
    embedding: EmbeddingOpt = "hash",
) -> None:
    """Write every transition, in insertion order, as one JSON line."""
    with _open_buffer(path, url, embedding) as buffer:
        count = buffer.export(file)
    typer.echo(f"exported {count} transitions to {file}")


@buffer_app.command("import")
def buffer_import(
    file: Annotated[
        Path, typer.Argument(metavar="FILE", help="A file from `buffer export`.")
    ],
    path: PathOpt = Path(DEFAULT_BUFFER_PATH),
    url: UrlOpt = None,
    embedding: EmbeddingOpt = "hash",
) -> None:
    """Add the transitions of a `buffer export` file (same ids replace the stored ones)."""
    _check_files([file], "write one with `dg-agents buffer export FILE`")
    with _open_buffer(path, url, embedding, _first_family(file)) as buffer:
        count = buffer.import_(file)
        typer.echo(f"imported {count} transitions from {file} ({buffer.count()} in total)")


# --------------------------------------------------------------------------------------------
# Shared by dream and fidelity
# --------------------------------------------------------------------------------------------



def build_experience(
    sections: Sections, family: Any, experience_model: str, buffer_path: Path | None,
    buffer_url: str | None, no_history: bool, no_retrieval: bool, no_reasoning: bool,
    model_buffer: str | None = None, concurrency: int | None = None,
) -> tuple[Any, Any, Any]:
    """(experience model, its gateway, the replay buffer) of the task ``family``, configured
    from flags and sections; the gateway's requests in flight follow ``concurrency`` (the
    run's episodes at once) unless ``llm.max_concurrency`` is set.

    ``model_buffer`` is the buffer that comes with the model (the embedded default's), used when
    no buffer is named.
    """
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym_agents.experience.training import trained_settings

    flags = _ablation_flags(no_history, no_retrieval, no_reasoning)
    # A checkpoint trained by our pipeline says how it must be prompted.
    exp_cfg = sections.configure(ExperienceConfig(**trained_settings(experience_model)),
                                 "experience", flags)
    buf_flags = {k: v for k, v in (("path", str(buffer_path) if buffer_path else model_buffer),
                                   ("url", buffer_url)) if v}
    buf_cfg = sections.configure(BufferConfig(family=family.name), "buffer", buf_flags)
    gateway = sections.gateway(experience_model, "llm", concurrency)
    try:
        buffer = ReplayBuffer(buf_cfg, family)
    except BaseException:
        gateway.close()
        raise
    codec = family.experience_codec(exp_cfg.codec_version)
    return ExperienceModel(exp_cfg, gateway, buffer, codec=codec), gateway, buffer


def _ablation_flags(no_history: bool, no_retrieval: bool, no_reasoning: bool) -> dict[str, bool]:
    return {k: False for k, off in (("use_history", no_history), ("use_retrieval", no_retrieval),
                                    ("use_reasoning", no_reasoning)) if off}


def resolve_for_cli(name: str | None, family: str, no_history: bool, no_retrieval: bool,
                    no_reasoning: bool, console: Any) -> tuple[str, str | None]:
    """The experience model and its buffer a command's --experience-model and ablation flags
    name (the family's default where none is named)."""
    return resolve_experience_model(
        name, family, ablations=_ablation_flags(no_history, no_retrieval, no_reasoning),
        say=console.print)


def _ablation_meta(model: Any) -> dict[str, Any]:
    return {"experience_model": model.gateway.cfg.model, "use_history": model.cfg.use_history,
            "use_retrieval": model.cfg.use_retrieval, "use_reasoning": model.cfg.use_reasoning}


# --------------------------------------------------------------------------------------------
# dg-agents dream
# --------------------------------------------------------------------------------------------


WorkersOpt = Annotated[int, typer.Option(
    "--workers", min=1,
    help="Processes that play the episodes, each with its share of --concurrency (one "
         "process is CPU-bound at high concurrency against a hosted model; see "
         "docs/RESULTS.md). Episodes go to OUT/workers/ first, then into OUT.")]


def dream_command(
    out: OutOpt,
    experience_model: ExperienceModelOpt = None,
    task: TaskOpt = "webarena",
    agent: AgentOpt = "oracle",
    program: ProgramOpt = None,
    split: SplitOpt = Split.train,
    tasks_file: TasksFileOpt = None,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = 2,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="Steps per episode.")] = 15,
    seed: SeedOpt = 0,
    buffer_path: BufferPathOpt = None,
    buffer_url: BufferUrlOpt = None,
    no_history: NoHistoryOpt = False,
    no_retrieval: NoRetrievalOpt = False,
    no_reasoning: NoReasoningOpt = False,
    workers: WorkersOpt = 1,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Play episodes in the dream: the experience model replaces the environment.

    Writes OUT/trajectories.jsonl (provenance synthetic) and OUT/summary.json like eval, plus
    em_failures and the ablation flags. --set llm.* configures the experience model's gateway,
    agent.* the agent's (when --agent is a model).
    """
    from dreamgym_agents.cli.dream_workers import DreamJob, check_workers, run_dream_workers
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.experience.dream import read_openings_ahead

    setup_logging(verbose)
    check_workers(workers)
    experience_model, model_buffer = resolve_for_cli(
        experience_model, task, no_history, no_retrieval, no_reasoning, make_console())
    family = make_family(task)
    tasks = family.load_task_file(str(tasks_file)) if tasks_file else family.load_tasks(split.value)
    tasks = tasks[:limit]
    job = DreamJob(experience_model=experience_model, model_buffer=model_buffer, task=task,
                   agent=agent, program=program, seed=seed,
                   buffer_path=str(buffer_path) if buffer_path else None, buffer_url=buffer_url,
                   ablations=(no_history, no_retrieval, no_reasoning),
                   config=str(config) if config else None, overrides=list(overrides or []),
                   max_steps=max_steps, verbose=verbose)
    console = make_console()
    parts = _dream_parts(job, family, concurrency)
    _, runner, model, _, buffer = parts
    try:
        job.meta = {"command": "dream", "task": task, "agent": agent,
                    **({"program": program} if program else {}),
                    "split": split.value if not tasks_file else "",
                    "tasks_file": str(tasks_file or ""), "limit": limit,
                    "max_steps": max_steps, "seed": seed, "buffer": _where(buffer),
                    **_ablation_meta(model)}
        count = buffer.count()
        console.print(f"[bold]dream[/]: experience model {experience_model}, buffer "
                      f"{_where(buffer)} ({count} transitions)")
        if count == 0:
            console.print(f"[yellow]warning:[/] the buffer at {_where(buffer)} is empty: the "
                          "dream has no real transitions to ground on (seed it with `dg-agents "
                          "buffer seed trajectories.jsonl`)")
        console.print(f"{len(tasks)} task(s), agent {runner.name}, concurrency {concurrency} "
                      f"→ {out}")
        if getattr(runner, "needs_expert", False):
            console.print(f"[yellow]warning:[/] --agent {agent} follows the real environment's "
                          "expert plan, which a dream has not: it only looks around here (its "
                          "plans in the dream: `dg-agents fidelity`, which replays recorded "
                          "expert episodes)")
        read = read_openings_ahead(family, tasks)
        if read:
            console.print(f"read the openings of {read} task(s) ahead")
        if workers == 1:
            result = run_with_progress(
                console, len(tasks),
                lambda cb: _play(job, parts, family, tasks, out, concurrency, cb))
        else:
            _close_parts(parts)  # each worker builds its own
            parts = ()
            result = run_dream_workers(job, tasks, runner.name, out, workers=workers,
                                       concurrency=concurrency, family=family, console=console,
                                       play=play_dream)
    finally:
        if parts:
            _close_parts(parts)
        family.close()
    print_summary(console, result.summary, out)
    em = result.summary["experience_usage"]
    console.print(f"em_failures={result.summary['em_failures']}; experience model: "
                  f"{em['calls']} calls, {em['total_tokens']} tokens, ${em['cost_usd']:.4f}")
    raise_if_failed(result, out, console)


def _dream_parts(job: Any, family: Any, concurrency: int) -> tuple[Any, ...]:
    """The dream's settings, agent, experience model, its gateway and the buffer, from a
    :class:`~dreamgym_agents.cli.dream_workers.DreamJob`."""
    from dreamgym_agents.experience.dream import DreamConfig

    sections = Sections(Path(job.config) if job.config else None, job.overrides,
                        DREAM_SECTIONS)
    dream_cfg = sections.configure(DreamConfig(), "dream")
    runner = build_agent(job.agent, seed=job.seed, family=family, sections=sections,
                         section="agent", concurrency=concurrency, program=job.program)
    try:
        model, gateway, buffer = build_experience(
            sections, family, job.experience_model,
            Path(job.buffer_path) if job.buffer_path else None, job.buffer_url,
            *job.ablations, job.model_buffer, concurrency)
    except BaseException:
        if hasattr(runner, "gateway"):
            runner.gateway.close()
        raise
    return dream_cfg, runner, model, gateway, buffer


def _close_parts(parts: tuple[Any, ...]) -> None:
    _, runner, _, gateway, buffer = parts
    buffer.close()
    gateway.close()
    if hasattr(runner, "gateway"):  # an LLM agent
        runner.gateway.close()


async def _play(job: Any, parts: tuple[Any, ...], family: Any, tasks: list[Any], out: Path,
                concurrency: int, on_episode: Any = None) -> Any:
    from dreamgym_agents.episodes.graph import RunConfig
    from dreamgym_agents.experience.fidelity_run import run_dream

    dream_cfg, runner, model, _, buffer = parts
    run_cfg = RunConfig(out_dir=out, concurrency=concurrency, max_steps=job.max_steps,
                        meta=job.meta)
    return await run_dream(tasks, runner, model, buffer, run_cfg, dream_cfg, family=family,
                           on_episode=on_episode)


def play_dream(job: Any, tasks: list[Any], out: Path, concurrency: int) -> tuple[Any, float]:
    """One worker's share of a dream run (``dg-agents dream --workers``): build its parts
    from ``job``, play ``tasks`` into ``out``, close them.

    Returns:
        The share's run result, and when its episodes began (``time.time()``, after the
        worker's own setup).
    """
    from dreamgym_agents.episodes.env import make_family

    setup_logging(job.verbose)
    family = make_family(job.task)
    parts = _dream_parts(job, family, concurrency)
    try:
        began = time.time()
        return asyncio.run(_play(job, parts, family, tasks, out, concurrency)), began
    finally:
        _close_parts(parts)
        family.close()


# --------------------------------------------------------------------------------------------
# dg-agents fidelity
# --------------------------------------------------------------------------------------------


def fidelity_command(
    out: Annotated[Path, typer.Option("--out", help="Output folder (fidelity.json, …).")],
    real: Annotated[
        list[Path],
        typer.Option("--real", help="A dg-agents eval output folder (test split); repeatable, "
                                    "e.g. an oracle run and a random run."),
    ],
    experience_model: ExperienceModelOpt = None,
    task: TaskOpt = "webarena",
    buffer_path: BufferPathOpt = None,
    buffer_url: BufferUrlOpt = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Use only N tasks, spread over the task templates."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=64, help="Model calls at once.")
    ] = 2,
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", min=1, help="Steps of the random dream episodes "
                                                "[the random real run's].")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed (random agent, judge sample).")] = 0,
    judge: Annotated[
        str | None, typer.Option("--judge", help="Model that scores dream episodes (rubric).")
    ] = None,
    judge_samples: Annotated[
        int, typer.Option("--judge-samples", min=1, help="Dream episodes judged.")
    ] = 10,
    no_history: NoHistoryOpt = False,
    no_retrieval: NoRetrievalOpt = False,
    no_reasoning: NoReasoningOpt = False,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Measure how closely the dream follows held-out real runs.

    Per-transition reward/done/success accuracy and state F1 (teacher forcing), oracle and random
    success real vs dream, and with --judge an LLM judge's rubric; writes OUT/fidelity.json.
    --set llm.* configures the experience model's gateway, judge.* the judge's.
    """
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.experience.dream import DreamConfig
    from dreamgym_agents.experience.fidelity_run import (
        FIDELITY_FILE,
        FidelityConfig,
        load_real_runs,
        run_fidelity,
    )

    setup_logging(verbose)
    experience_model, model_buffer = resolve_for_cli(
        experience_model, task, no_history, no_retrieval, no_reasoning, make_console())
    sections = Sections(config, overrides, FIDELITY_SECTIONS)
    family = make_family(task)  # an unknown family fails here, before any model is built
    fid_cfg = sections.configure(
        FidelityConfig(out_dir=out, family=task, concurrency=concurrency, seed=seed,
                       judge_samples=judge_samples),
        "fidelity",
        {k: v for k, v in (("limit", limit), ("max_steps", max_steps)) if v is not None},
    )
    dream_cfg = sections.configure(DreamConfig(), "dream")
    runs = load_real_runs(real)
    judge_gateway = sections.gateway(judge, "judge") if judge else None
    console = make_console()
    try:
        model, gateway, buffer = build_experience(
            sections, family, experience_model, buffer_path, buffer_url, no_history,
            no_retrieval, no_reasoning, model_buffer, fid_cfg.concurrency)
    except BaseException:
        if judge_gateway is not None:
            judge_gateway.close()
        raise
    try:
        meta = {**_ablation_meta(model), "buffer": _where(buffer),
                "real": [str(p) for p in real], "limit": fid_cfg.limit}
        console.print(f"[bold]fidelity[/]: experience model {experience_model} against "
                      + ", ".join(f"{r.path} ({r.agent}, {len(r.trajectories)} episodes)"
                                  for r in runs))
        with _phase_progress(console) as progress:
            report = asyncio.run(run_fidelity(fid_cfg, runs, model, buffer, dream_cfg,
                                              judge=judge_gateway, meta=meta,
                                              progress=progress, task_family=family))
    finally:
        buffer.close()
        gateway.close()
        if judge_gateway is not None:
            judge_gateway.close()
    keys = ("reward_accuracy", "reward_balanced_accuracy", "reward_f1", "done_accuracy",
            "done_balanced_accuracy", "done_f1", "success_accuracy", "state_f1",
            "em_failure_rate", "final_success_recall", "final_failure_recall",
            "oracle_real_success", "oracle_dream_success", "random_real_success",
            "random_dream_success")
    console.print("  ".join(f"{k}={report.get(k)}" for k in keys))
    base = report.get("baselines") or {}
    if base:
        console.print("baselines: reward always 0 (accuracy "
                      f"{base['reward_always_0']['accuracy']}, balanced 0.5, F1 0); done from "
                      f"the action's type (accuracy {base['done_from_action_type']['accuracy']}, "
                      f"balanced {base['done_from_action_type']['balanced_accuracy']}, F1 "
                      f"{base['done_from_action_type']['f1']}); state F1 of copying the current "
                      f"page {base['state_f1_copy_current_page']}")
    console.print(f"wrote {out / FIDELITY_FILE}")
    print(json.dumps({**{k: report.get(k) for k in keys}, "baselines": base}))


@contextmanager
def _phase_progress(console: Any) -> Iterator[Any]:
    """A rich progress display with one bar per phase of the fidelity run."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("[bold]{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("ok {task.fields[ok]}"), TimeElapsedColumn(),
        console=console, transient=False, disable=not console.is_terminal,
    ) as progress:

        def phase(name: str, total: int) -> Any:
            bar = progress.add_task(name, total=total, ok=0)
            counts = {"ok": 0}

            def tick(ok: bool) -> None:
                counts["ok"] += bool(ok)
                progress.update(bar, advance=1, ok=counts["ok"])

            return tick

        yield phase


# --------------------------------------------------------------------------------------------


def train_experience_command(
    data: Annotated[list[Path], typer.Argument(help="trajectories.jsonl / offline.jsonl files.")],
    out: Annotated[Path, typer.Option("--out", help="Checkpoint folder (use as hf/<out>).")],
    base_model: Annotated[
        Path | None, typer.Option("--base-model", help="Local checkpoint to start from.")
    ] = None,
    teacher: Annotated[
        str | None, typer.Option("--teacher", help="Model that annotates the reasoning.")
    ] = None,
    buffer_path: Annotated[
        Path | None, typer.Option("--buffer-path", help="Buffer to retrieve demos from.")
    ] = None,
    max_examples: Annotated[int | None, typer.Option("--max-examples", min=1)] = None,
    epochs: Annotated[float, typer.Option("--epochs", min=0.01)] = 3.0,
    steps: Annotated[int | None, typer.Option(
        "--steps", min=1, help="Optimisation steps, whatever the data's size (overrides "
        "--epochs): the same data then trains the same model, fast machine or slow.")
    ] = None,
    time_budget_s: Annotated[
        float | None, typer.Option("--time-budget-s", min=1.0,
                                   help="Stop SFT after this: the model is saved but marked "
                                        "partial, and the command exits 3.")
    ] = None,
    counterfactual_answers: Annotated[int | None, typer.Option(
        "--counterfactual-answers", min=0,
        help="Other answers per recorded right answer, labelled by the task's evaluator "
             "(default: the family's embedded recipe's).")
    ] = None,
    counterfactual_stops: Annotated[int | None, typer.Option(
        "--counterfactual-stops", min=0,
        help="Stops at earlier recorded states per episode, labelled by the evaluator "
             "(default: the family's embedded recipe's).")
    ] = None,
    judge_repeat: Annotated[int | None, typer.Option(
        "--judge-repeat", min=0, help="Short verdict-only copies of each final answer "
                                      "(default: the family's embedded recipe's).")
    ] = None,
    decision_weight: Annotated[float, typer.Option(
        "--decision-weight", min=0.01,
        help="Loss weight of the verdict, outcome and next-page tokens.")
    ] = EmbeddedRecipe.decision_weight,
    no_history: NoHistoryOpt = False,
    no_retrieval: NoRetrievalOpt = False,
    no_reasoning: NoReasoningOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train an experience model (SFT, paper Eq. 5) on recorded trajectories."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.experience.data import ExampleConfig
    from dreamgym_agents.experience.sft import ExperienceSFTConfig
    from dreamgym_agents.experience.training import train_from_trajectories
    from dreamgym_agents.gateway.llm import Gateway, LLMConfig, check_model_string
    from dreamgym_agents.types import read_trajectories

    setup_logging(verbose)
    trajectories = []
    for path in data:
        if not path.is_file():
            raise ConfigError(f"trajectory file not found: {path}")
        trajectories.extend(read_trajectories(path))
    if not trajectories:
        raise ConfigError("the trajectory files hold no episodes")
    if teacher:
        check_model_string(teacher)
    flags = _ablation_flags(no_history, no_retrieval, no_reasoning)
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.pipeline.embedded import recipe_for

    made = make_family(trajectories[0].task.family)
    if None in (counterfactual_answers, counterfactual_stops, judge_repeat):
        recipe = recipe_for(made)
        counterfactual_answers = (recipe.counterfactual_answers if counterfactual_answers is None
                                  else counterfactual_answers)
        counterfactual_stops = (recipe.counterfactual_stops if counterfactual_stops is None
                                else counterfactual_stops)
        judge_repeat = recipe.judge_repeat if judge_repeat is None else judge_repeat
    sft_cfg = ExperienceSFTConfig(output_dir=str(out),
                                  base_model=str(base_model) if base_model else None,
                                  epochs=epochs, max_steps=steps,
                                  time_budget_s=time_budget_s,
                                  decision_weight=decision_weight,
                                  **({"learning_rate": 5e-5} if base_model else {}))
    # under a launcher (torchrun, accelerate launch) the main process alone opens the buffer
    # and prints; every process trains (dreamgym_agents.launch)
    main = launch.is_main()
    try:
        buffer = ReplayBuffer(BufferConfig(path=str(buffer_path or out / "buffer"),
                                           family=trajectories[0].task.family),
                              made) if main else None
    except BaseException:
        made.close()
        raise
    console = make_console(quiet=not main)
    try:
        console.print(f"training on {len(trajectories)} episodes from {len(data)} file(s) → {out}"
                      + (f", {launch.world_size()} processes" if launch.world_size() > 1 else ""))
        manifest = train_from_trajectories(
            trajectories, buffer,
            ExampleConfig(max_examples=max_examples, judge_repeat=judge_repeat, **flags),
            sft_cfg, teacher=Gateway(LLMConfig(model=teacher)) if teacher else None,
            counterfactual_answers=counterfactual_answers,
            counterfactual_stops=counterfactual_stops, family=made)
    finally:
        made.close()
        if buffer is not None:
            buffer.close()
    console.print(f"loss {manifest['first_loss']:.3f} → {manifest['last_loss']:.3f} over "
                  f"{manifest['steps']} steps, {manifest['examples']} examples; use "
                  f"--experience-model hf/{out} --buffer-path {buffer_path or out / 'buffer'}")
    if manifest["partial"]:
        from dreamgym_agents.errors import PartialBuildError

        raise PartialBuildError(
            f"--time-budget-s stopped training at step {manifest['steps']} of "
            f"{manifest['planned_steps']}: {out} is saved but marked partial in its "
            "dreamgym_manifest.json (rerun without the budget for the whole run)")


def register(app: typer.Typer) -> None:
    """Add ``buffer …``, ``dream``, ``fidelity`` and ``train-experience`` to ``dg-agents``."""
    app.add_typer(buffer_app, name="buffer")
    app.command("dream")(dream_command)
    app.command("fidelity")(fidelity_command)
    app.command("train-experience")(train_experience_command)
