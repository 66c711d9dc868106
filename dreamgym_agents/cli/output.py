"""What the commands share for their output: logging set-up, the console (stderr), progress
bars for episodes and for pipeline stages, the one-line summary, the failed-episodes error.
Kept apart from ``cli`` so that the command modules and ``cli`` import it, not each other."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import DreamGymError


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("LiteLLM", "litellm", "httpx", "httpcore", "aiosqlite", "urllib3",
                  "browsergym", "dspy"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)
    if not verbose:
        # Deprecation notices of the training stack that a user cannot act on: our GRPO uses
        # TRL's rollout_func deliberately (pinned TRL), and TRL passes transformers' renamed
        # gradient-checkpointing arguments. -v shows them.
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*",
                                category=FutureWarning)


def make_console(*, quiet: bool = False) -> Any:
    """The commands' console (stderr); ``quiet``: it prints nothing (a launcher's processes
    but the main one)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, quiet=quiet)


def raise_if_failed(result: Any, out: Path, console: Any = None) -> None:
    """End the command with one line when episodes failed that a rerun may play; episodes
    whose task can never be played (``UnplayableTaskError``: a broken game file) are only
    said, on ``console``, and the command ends as its summary says."""
    unplayable = [f for f in result.failed if f.get("unplayable")]
    retry = len(result.failed) - len(unplayable)
    if unplayable and console is not None:
        console.print(f"{len(unplayable)} task(s) could not be played and were left out, each "
                      f"with its reason in {out / 'errors.jsonl'}", markup=False)
    if retry:
        raise DreamGymError(
            f"{retry} episode(s) failed (see {out / 'errors.jsonl'}); "
            "rerun the same command to retry them"
        )


def run_with_progress(console: Any, total: int, start: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    counts = {"ok": 0, "done": 0}
    with Progress(
        TextColumn("[bold]episodes"), BarColumn(), MofNCompleteColumn(),
        TextColumn("success {task.fields[ok]}"), TimeElapsedColumn(),
        console=console, transient=False, disable=not console.is_terminal,
    ) as progress:
        bar = progress.add_task("episodes", total=total, ok=0)

        def on_episode(traj: Any) -> None:
            counts["done"] += 1
            if traj is not None and traj.success:
                counts["ok"] += 1
            progress.update(bar, advance=1, ok=counts["ok"])

        return asyncio.run(start(on_episode))


def print_summary(console: Any, summary: dict[str, Any], out: Path) -> None:
    keys = ("episodes", "success_rate", "real_transitions", "synthetic_transitions",
            "invalid_actions", "mean_env_step_seconds", "wall_seconds")
    line = "  ".join(f"{k}={summary.get(k)}" for k in keys)
    console.print(line)
    console.print(f"wrote {out / 'trajectories.jsonl'} and {out / 'summary.json'}")
    print(json.dumps({k: summary.get(k) for k in keys}))


class RichReporter:
    """Progress as rich bars (one per stage's work, under a stage header) with the time left
    and the clock time each bar will finish at. Where the console is no terminal (a log file),
    a line every 10 % of a bar says the same."""

    def __init__(self, console: Any, progress: Any) -> None:
        self.console = console
        self.progress = progress

    def stage(self, name: str, index: int, total: int) -> None:
        self.console.print(f"[bold cyan]stage {index}/{total}: {name}[/]")

    def bar(self, label: str, total: int) -> Callable[..., None]:
        bar = self.progress.add_task(label, total=total or None, info="")
        pace = _Pace(label, total, self.console)

        def tick(advance: int = 1, item: Any = None) -> None:
            info = ""
            if isinstance(item, dict) and "rollout/success" in item:
                info = (f"rollout success {item['rollout/success']:.2f}, real "
                        f"{item['rollout/real_transitions']}, synthetic "
                        f"{item['rollout/synthetic_transitions']}")
            elif item is not None and hasattr(item, "success"):
                info = "ok" if item.success else "fail"
            self.progress.update(bar, advance=advance, info=info or pace.finish_at())
            pace.advance(advance)

        return tick

    def say(self, message: str) -> None:
        self.console.print(message)


class _Pace:
    """A bar's pace: the time left and when it will finish; where the console is no terminal,
    a line at every 10 % (a slow machine says when it will be done, even in a log file)."""

    def __init__(self, label: str, total: int, console: Any) -> None:
        self.label, self.total, self.console = label, total, console
        self.done = 0
        self.start = time.monotonic()
        self.first: int | None = None  # units already done when the bar started (a resume)
        self.reported = 0

    def advance(self, n: int) -> None:
        if self.first is None and n > 1:
            self.first = n  # a resumed SFT's bar starts at its checkpoint's step
        self.done += n
        if self.console.is_terminal or not self.total:
            return
        tenth = self.done * 10 // self.total
        if tenth > self.reported:
            self.reported = tenth
            self.console.print(f"  {self.label}: {self.done}/{self.total} "
                               f"({100 * self.done // self.total}%){self.eta_text()}")

    def seconds_left(self) -> float | None:
        fresh = self.done - (self.first or 0)
        if not self.total or fresh <= 0 or self.done >= self.total:
            return None
        return (time.monotonic() - self.start) / fresh * (self.total - self.done)

    def finish_at(self) -> str:
        left = self.seconds_left()
        if left is None:
            return ""
        return "done ~" + (datetime.now() + timedelta(seconds=left)).strftime("%H:%M")

    def eta_text(self) -> str:
        left = self.seconds_left()
        if left is None:
            return ""
        return f", {_duration(left)} left, {self.finish_at()}"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return f"{seconds:.0f} s"
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


@contextmanager
def progress_reporter() -> Iterator[RichReporter]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = make_console()
    with Progress(TextColumn("  {task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                  TextColumn("{task.fields[info]}"), console=console,
                  disable=not console.is_terminal) as progress:
        yield RichReporter(console, progress)
