"""Runs a user can watch: a run's figures and its trainers' logs in TensorBoard.

``tracking=tensorboard`` (``dg-agents run --set tracking=tensorboard``) writes event files under
the run's ``tracking/`` folder, offline by construction: each trainer's logs (losses, rewards,
learning rate, KL … as TRL logs them) in a folder per trainer, and the pipeline's own figures
(each stage's real success, the dream's calibration, curriculum counts, real and synthetic
transitions, the experience model's fidelity: every number a stage records) in
``tracking/pipeline``. ``tensorboard --logdir runs/<run>/tracking`` shows them as they come.

The tracker is active for the length of a ``with active(...)`` block (a context variable: the
trainers called inside it find it with :func:`trainer_callbacks`, nothing is passed through
their signatures); outside one, nothing is written.
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

KINDS = ("none", "tensorboard")
"""The trackers: ``none`` (figures only in ``metrics.jsonl``) and ``tensorboard``."""
PIPELINE = "pipeline"

_ACTIVE: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar("tracker", default=None)


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        hint = (" (W&B and trackio are not wired in yet: tensorboard's event files are read by "
                "both)" if kind in ("wandb", "trackio") else "")
        raise ConfigError(f"tracking must be one of {', '.join(KINDS)}, got {kind!r}{hint}")
    return kind


class Tracker:
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
        safe = re.sub(r"[^\w.-]+", "_", name) or "run"
        if safe not in self._writers:
            self._writers[safe] = self._writer_class(log_dir=str(self.root / safe))
        return self._writers[safe]

    def log(self, prefix: str, figures: dict[str, Any], step: int) -> None:
        """The numbers among ``figures`` as scalars ``prefix/key`` at ``step`` (the pipeline's)."""
        writer = self.writer(PIPELINE)
        for key, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                writer.add_scalar(f"{prefix}/{key}", value, step)
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


@contextlib.contextmanager
def active(kind: str, root: Path) -> Iterator[Tracker | None]:
    """Track what runs inside the block into ``root`` (``kind`` ``none``: nothing)."""
    tracker = Tracker(root) if check_kind(kind) == "tensorboard" else None
    token = _ACTIVE.set(tracker)
    try:
        yield tracker
    finally:
        _ACTIVE.reset(token)
        if tracker is not None:
            tracker.close()


def current() -> Tracker | None:
    return _ACTIVE.get()


def trainer_callbacks(name: str) -> list[Any]:
    """The callbacks a Hugging Face trainer named ``name`` adds to log into the active tracker
    (TensorBoard's, on its own writer), none when nothing is tracked."""
    tracker = current()
    if tracker is None:
        return []
    from transformers.integrations import TensorBoardCallback

    return [TensorBoardCallback(tb_writer=tracker.writer(name))]
