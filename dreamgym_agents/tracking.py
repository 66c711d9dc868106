"""Runs a user can watch: a run's figures and its trainers' logs in TensorBoard, W&B or trackio.

``tracking=<kind>`` (``dg-agents run --set tracking=tensorboard``) sends, as they come, each
trainer's logs (losses, rewards, learning rate, KL … as TRL logs them) and the pipeline's own
figures to one tracker, offline by construction. The pipeline's figures are every number a
stage records: each stage's real success, the dream's calibration, curriculum counts, real and
synthetic transitions, the experience model's fidelity. The kinds:

==============  =========================================================================
kind            where it goes, and how to look
==============  =========================================================================
``none``        nowhere else (``metrics.jsonl`` holds every figure anyway); the default
``tensorboard`` event files in ``DIR/tracking/``, a folder per trainer and ``pipeline``:
                ``tensorboard --logdir DIR/tracking``
``wandb``       one W&B run in offline mode, ``DIR/tracking/wandb/offline-run-*``: nothing
                leaves the machine; ``wandb sync`` uploads it later, if you want
``trackio``     one trackio run, named after the run's folder, in project ``dreamgym-agents``
                of trackio's local store (``TRACKIO_DIR``, by default
                ``~/.cache/huggingface/trackio``; the log says where): ``trackio show``
==============  =========================================================================

In W&B and trackio every figure is ``<trainer or stage>/<name>``, beside its own step
(``<trainer>/step``: each trainer counts from 0, the pipeline counts stages done).

The tracker is active for the length of a ``with active(...)`` block; outside one, nothing is
written. It is a context variable: the trainers called inside the block find it with
:func:`trainer_callbacks`, and nothing is passed through their signatures.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError, MissingExtraError

logger = logging.getLogger(__name__)

KINDS = ("none", "tensorboard", "wandb", "trackio")
"""The trackers (see the module's table)."""
PIPELINE = "pipeline"
PROJECT = "dreamgym-agents"

_ACTIVE: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar("tracker", default=None)


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ConfigError(f"tracking must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def _numbers(figures: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in figures.items() if not isinstance(v, bool)
            and isinstance(v, int | float) and math.isfinite(v)}


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name) or "run"


class Tracker:
    """Where a run's figures go: :meth:`log` for the pipeline's, :meth:`callbacks` for a
    trainer's."""

    def log(self, prefix: str, figures: dict[str, Any], step: int) -> None:
        """The numbers among ``figures`` as ``prefix/key`` at ``step`` (the pipeline's)."""
        raise NotImplementedError

    def callbacks(self, name: str) -> list[Any]:
        """Hugging Face trainer callbacks that log a trainer named ``name`` here."""
        return [log_callback(self, _safe(name))]

    def close(self) -> None:
        """Flush and finish (the run's end, or its failure)."""


class TensorBoardTracker(Tracker):
    """TensorBoard event files under ``root``: one writer per trainer, one for the pipeline."""

    def __init__(self, root: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MissingExtraError("tensorboard", "track") from None
        self.root = Path(root)
        self._writer_class = SummaryWriter
        self._writers: dict[str, Any] = {}

    def writer(self, name: str) -> Any:
        safe = _safe(name)
        if safe not in self._writers:
            self._writers[safe] = self._writer_class(log_dir=str(self.root / safe))
        return self._writers[safe]

    def log(self, prefix: str, figures: dict[str, Any], step: int) -> None:
        writer = self.writer(PIPELINE)
        for key, value in _numbers(figures).items():
            writer.add_scalar(f"{prefix}/{key}", value, step)
        writer.flush()

    def callbacks(self, name: str) -> list[Any]:
        from transformers.integrations import TensorBoardCallback

        return [TensorBoardCallback(tb_writer=self.writer(name))]

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class _StepTracker(Tracker):
    """One run of a tracker whose steps only go up (W&B, trackio): each series carries its own
    step as a figure beside it, ``<series>/step``."""

    def log(self, prefix: str, figures: dict[str, Any], step: int) -> None:
        numbers = _numbers(figures)
        if numbers:
            self._log({f"{prefix}/{k}": v for k, v in numbers.items()}, prefix, step)

    def _log(self, figures: dict[str, float], series: str, step: int) -> None:
        raise NotImplementedError


class WandbTracker(_StepTracker):
    """A W&B run in offline mode under ``root/wandb`` (nothing is sent; no key is read)."""

    def __init__(self, root: Path, name: str) -> None:
        try:
            import wandb
        except ImportError:
            raise MissingExtraError("wandb", "track") from None
        root.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=PROJECT, name=name, dir=str(root), mode="offline",
                              reinit="create_new",
                              # no console capture, system stats, metadata (the command
                              # line, the environment's facts) or code: only the figures
                              settings=wandb.Settings(silent=True, console="off",
                                                      x_disable_stats=True, x_disable_meta=True,
                                                      disable_code=True, disable_git=True,
                                                      x_save_requirements=False))
        self._series: set[str] = set()

    def _log(self, figures: dict[str, float], series: str, step: int) -> None:
        if series not in self._series:  # the series' figures are plotted against its step
            self._series.add(series)
            self.run.define_metric(f"{series}/step", hidden=True)
            self.run.define_metric(f"{series}/*", step_metric=f"{series}/step")
        self.run.log({**figures, f"{series}/step": step})

    def close(self) -> None:
        self.run.finish()


class TrackioTracker(_StepTracker):
    """A trackio run, project ``dreamgym-agents``, in trackio's local store."""

    def __init__(self, root: Path, name: str) -> None:
        try:
            import trackio
            from trackio.sqlite_storage import SQLiteStorage
        except ImportError:
            raise MissingExtraError("trackio", "track") from None
        with contextlib.redirect_stdout(_LoggerStream()):
            self.run = trackio.init(project=PROJECT, name=name, auto_log_cpu=False,
                                    auto_log_gpu=False)
        # its store's place is read when trackio is first imported (TRL imports it)
        logger.info("tracking into trackio run %s of %s", name,
                    SQLiteStorage.get_project_db_path(PROJECT))

    def _log(self, figures: dict[str, float], series: str, step: int) -> None:
        self.run.log({**figures, f"{series}/step": step})

    def close(self) -> None:
        with contextlib.redirect_stdout(_LoggerStream()):
            self.run.finish()


class _LoggerStream:
    """trackio's banner lines, to the log instead of the run's terminal."""

    def write(self, text: str) -> int:
        if text.strip():
            logger.info("trackio: %s", text.strip())
        return len(text)

    def flush(self) -> None:
        pass


def log_callback(tracker: Tracker, name: str) -> Any:
    """A Hugging Face trainer callback: the trainer's logs (their numbers) as ``name/<key>``
    at its global step, into ``tracker``."""
    from transformers import TrainerCallback

    class LogCallback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and state.is_world_process_zero:
                tracker.log(name, logs, state.global_step)

    return LogCallback()


def make_tracker(kind: str, root: Path, name: str) -> Tracker | None:
    """The tracker of ``kind`` writing under ``root`` (None for ``none``); ``name`` names the
    run where the tracker has runs (the run's folder)."""
    kind = check_kind(kind)
    if kind == "tensorboard":
        return TensorBoardTracker(root)
    if kind == "wandb":
        return WandbTracker(Path(root), name)
    if kind == "trackio":
        return TrackioTracker(Path(root), name)
    return None


@contextlib.contextmanager
def active(kind: str, root: Path, name: str = "run") -> Iterator[Tracker | None]:
    """Track what runs inside the block into ``root`` (``kind`` ``none``: nothing)."""
    tracker = make_tracker(kind, Path(root), name)
    token = _ACTIVE.set(tracker)
    try:
        yield tracker
    finally:
        _ACTIVE.reset(token)
        if tracker is not None:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001  (what was logged is on disk already)
                logger.warning("closing the %s tracker failed: %s", kind, exc)


def current() -> Tracker | None:
    return _ACTIVE.get()


def trainer_callbacks(name: str) -> list[Any]:
    """The callbacks a Hugging Face trainer named ``name`` adds to log into the active tracker,
    none when nothing is tracked."""
    tracker = current()
    return [] if tracker is None else tracker.callbacks(name)
