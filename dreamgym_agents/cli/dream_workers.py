"""``dg-agents dream --workers N``: the dream's episodes played by N processes.

One Python process plays a dream against a hosted experience model at a CPU cost per step; at
high concurrency and low latency that cost, not the model, bounds its steps per second
(evidence: docs/history/results-2026-11-to-12.md). With ``--workers N`` the pending tasks are
dealt round-robin to N spawned processes; each plays its share with its share of
``--concurrency`` into ``OUT/workers/wI`` (a resumable run folder of its own, with the run's
settings), while this process shows their progress. Then their episodes are merged into
``OUT/trajectories.jsonl``, each once, and one summary is written over the folder, as a
one-process run writes it.

Rerunning the command resumes: the episodes every worker folder finished are merged first and
never played again, whatever N is now; an episode a worker was cut off in is played again.
A failed worker does not stop the others: what they finished is merged, and the command ends
with one line naming it (its traceback in its folder's ``worker-error.txt``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError, DreamGymError

WORKERS_DIR = "workers"
SHARE_FILE = "share.json"  # a worker's failed episodes and when its episodes began and ended
ERROR_FILE = "worker-error.txt"
_POLL_S = 0.5


@dataclass
class DreamJob:
    """What a worker needs to rebuild the dream run (plain data: it crosses a process spawn).

    Attributes:
        experience_model: The resolved experience model string.
        model_buffer: The buffer that comes with it (the embedded default's), if any.
        task: The task family.
        agent: The agent spec (``--agent``).
        program: A saved prompt program for a model agent.
        seed: The agent's seed.
        buffer_path: ``--buffer-path``.
        buffer_url: ``--buffer-url``.
        ablations: ``(no_history, no_retrieval, no_reasoning)``.
        config: ``--config`` file.
        overrides: ``--set`` items.
        max_steps: Steps per episode.
        meta: The run's settings (every worker folder's ``run.json``).
        verbose: Debug logging.
    """

    experience_model: str
    model_buffer: str | None
    task: str
    agent: str
    program: str | None
    seed: int
    buffer_path: str | None
    buffer_url: str | None
    ablations: tuple[bool, bool, bool]
    config: str | None
    overrides: list[str]
    max_steps: int
    meta: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False


def shares(total: int, workers: int) -> list[int]:
    """``total`` split over ``workers`` as evenly as it goes (each at least 1)."""
    return [max(1, total // workers + (i < total % workers)) for i in range(workers)]


PlayDream = Callable[[DreamJob, list[Any], Path, int], tuple[Any, float]]
"""Plays a share of a dream run: ``(job, tasks, folder, concurrency) → (RunResult, when its
episodes began)``; a module-level function (it crosses a process spawn by reference)."""


def play_share(play: PlayDream, job: DreamJob, tasks: list[dict[str, Any]], folder: str,
               concurrency: int, threads: int) -> None:
    """A worker: play ``tasks`` in the dream into ``folder`` (a spawned process's target)."""
    os.environ.setdefault("DG_TORCH_THREADS", str(threads))
    out = Path(folder)
    try:
        from dreamgym_agents.types import Task

        result, began = play(job, [Task.from_dict(t) for t in tasks], out, concurrency)
        (out / SHARE_FILE).write_text(json.dumps({"failed": result.failed, "began": began,
                                                  "ended": time.time()}))
    except BaseException:
        (out / ERROR_FILE).write_text(traceback.format_exc())
        raise SystemExit(1) from None


class _Tally:
    """Episodes a worker folder has finished, read as its file grows."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.done, self.ok, self._rest = path, 0, 0, 0, b""

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        self.offset += len(chunk)
        *lines, self._rest = (self._rest + chunk).split(b"\n")
        for line in lines:
            try:
                data = json.loads(line)
            except ValueError:
                continue
            self.done += 1
            self.ok += bool(data.get("success"))


def merge_workers(out: Path, finished: set[str]) -> int:
    """Append the episodes of every worker folder not yet in ``OUT/trajectories.jsonl``;
    returns how many. ``finished`` (the file's episode ids) is updated."""
    from dreamgym_agents.episodes.graph import TRAJECTORIES_FILE
    from dreamgym_agents.types import append_trajectory, iter_trajectories

    added = 0
    for folder in sorted((out / WORKERS_DIR).glob("w*")):
        path = folder / TRAJECTORIES_FILE
        if not path.exists():
            continue
        for traj in iter_trajectories(path, repair=True):
            if traj.episode_id not in finished:
                append_trajectory(out / TRAJECTORIES_FILE, traj)
                finished.add(traj.episode_id)
                added += 1
    return added


def run_dream_workers(job: DreamJob, tasks: list[Any], agent_name: str, out: Path, *,
                      workers: int, concurrency: int, family: Any, console: Any,
                      play: PlayDream) -> Any:
    """Play ``tasks`` in the dream with ``workers`` processes (see the module docstring), each
    running ``play`` on its share.

    Returns:
        The run's :class:`~dreamgym_agents.episodes.graph.RunResult` over the whole folder.

    Raises:
        DreamGymError: A worker failed (after the others finished and their episodes merged).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dreamgym_agents.episodes.graph import (
        ERRORS_FILE,
        SUMMARY_FILE,
        TRAJECTORIES_FILE,
        RunConfig,
        RunResult,
        episode_id_for,
        prepare_out_dir,
        summarize,
    )
    from dreamgym_agents.experience.fidelity_run import add_dream_figures
    from dreamgym_agents.gateway.local import torch_threads
    from dreamgym_agents.types import read_trajectories

    check_workers(workers)
    wall_start = time.perf_counter()
    finished = prepare_out_dir(RunConfig(out_dir=out, concurrency=concurrency,
                                         max_steps=job.max_steps, meta=job.meta))
    merge_workers(out, finished)
    pending = [t for t in tasks if episode_id_for(t, agent_name) not in finished]
    skipped = len(tasks) - len(pending)
    # no more workers than episodes in flight, none when every episode is in the folder
    n = min(workers, concurrency, len(pending))
    deals = [pending[i::n] for i in range(n)]
    share_of = shares(concurrency, n) if n else []
    threads = max(1, torch_threads() // max(1, n))
    ctx = multiprocessing.get_context("spawn")
    concs = [min(s, len(d)) for s, d in zip(share_of, deals, strict=True)]
    procs: list[tuple[Any, Path]] = []
    for i, deal in enumerate(deals):
        folder = out / WORKERS_DIR / f"w{i}"
        folder.mkdir(parents=True, exist_ok=True)
        for stale in (SHARE_FILE, ERROR_FILE):
            (folder / stale).unlink(missing_ok=True)
        proc = ctx.Process(target=play_share, name=f"dream-worker-{i}",
                           args=(play, job, [t.to_dict() for t in deal], str(folder),
                                 concs[i], threads))
        procs.append((proc, folder))
    if n:
        console.print(f"{len(pending)} episode(s) over {n} worker process(es) (concurrency "
                      f"{', '.join(map(str, concs))}); "
                      f"their run folders: {out / WORKERS_DIR}")
    tallies = [_Tally(folder / TRAJECTORIES_FILE) for _, folder in procs]
    for tally in tallies:
        tally.read()
    start_counts = [(t.done, t.ok) for t in tallies]
    try:
        with Progress(TextColumn("[bold]episodes"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("success {task.fields[ok]}"), TimeElapsedColumn(),
                      console=console, transient=False,
                      disable=not console.is_terminal) as progress:
            bar = progress.add_task("episodes", total=len(tasks), completed=skipped, ok=0)
            for proc, _ in procs:
                proc.start()
            while any(proc.is_alive() for proc, _ in procs):
                time.sleep(_POLL_S)
                for tally in tallies:
                    tally.read()
                done = sum(t.done - s[0] for t, s in zip(tallies, start_counts, strict=True))
                ok = sum(t.ok - s[1] for t, s in zip(tallies, start_counts, strict=True))
                progress.update(bar, completed=skipped + done, ok=ok)
    except BaseException:
        for proc, _ in procs:  # Ctrl-C & co: stop the workers (each resumes on a rerun)
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc, _ in procs:
            proc.join()
    merge_workers(out, finished)
    failed: list[dict[str, Any]] = []
    broken: list[str] = []
    spans: list[tuple[float, float]] = []
    for proc, folder in procs:
        if (folder / SHARE_FILE).exists():
            share = json.loads((folder / SHARE_FILE).read_text())
            failed += share["failed"]
            spans.append((share["began"], share["ended"]))
        if proc.exitcode != 0:
            lines = (folder / ERROR_FILE).read_text().strip().splitlines() \
                if (folder / ERROR_FILE).exists() else []
            reason = lines[-1] if lines else f"exit code {proc.exitcode}"
            broken.append(f"{folder.name} ({reason})")
    if failed:
        with open(out / ERRORS_FILE, "a", encoding="utf-8") as fh:
            for item in failed:
                fh.write(json.dumps(item) + "\n")
    trajectories = read_trajectories(out / TRAJECTORIES_FILE) \
        if (out / TRAJECTORIES_FILE).exists() else []
    summary = summarize(trajectories, job.meta)
    add_dream_figures(summary, trajectories, family)
    # as one process counts it: the episodes' time, from the first share's start to the last
    # share's end (each worker's own start-up, its imports, is in setup_seconds)
    total = time.perf_counter() - wall_start
    played = max(e for _, e in spans) - min(b for b, _ in spans) if spans else total
    summary["wall_seconds"] = round(played, 3)
    summary["setup_seconds"] = round(max(0.0, total - played), 3)
    summary["failed_episodes"] = len(failed)
    summary["resumed_episodes"] = skipped
    summary["workers"] = workers
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True))
    if broken:
        raise DreamGymError(f"dream worker(s) failed: {'; '.join(broken)} (tracebacks in "
                            f"{ERROR_FILE} there); the episodes they finished are in "
                            f"{out / TRAJECTORIES_FILE}: rerun the same command to resume")
    return RunResult(summary=summary, failed=failed, skipped=skipped)


def check_workers(workers: int) -> None:
    """Refuse a worker count that cannot run."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if workers > 4 * (os.cpu_count() or 1):
        raise ConfigError(f"--workers {workers} is more than 4 per core here "
                          f"({os.cpu_count()} cores): use at most one per free core")
