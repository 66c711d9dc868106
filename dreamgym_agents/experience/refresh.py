"""The experience model learns from the run's fresh real transitions (a Dyna schedule).

DreamGym's replay buffer "is continuously enriched with fresh interactions" and the experience
model co-evolves with the policy; any model-based RL loop refits its model on the real
transitions it plays (Dyna). Here, where a run plays real episodes (sim-to-real, GRPO-real),
their transitions enter the run's own buffer (:mod:`dreamgym_agents.pipeline.run`), and
:func:`refresh_experience_model` fine-tunes the experience model on them: examples built as
the model's own training built them (its manifest's ``example_config``, demonstrations
retrieved from the buffer, other tasks' only), mixed with ``replay`` recorded examples per
fresh one so that what it knew of the rest of the site is kept, a few optimisation steps
from the current weights. Resumable (a rerun continues from its last saved step); the new
checkpoint carries the manifest, so it is prompted as before.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Trajectory

logger = logging.getLogger(__name__)

READY_FILE = "READY"


@dataclass
class ExperienceRefreshConfig:
    """The Dyna schedule of a run (``experience_refresh.*``).

    Attributes:
        enabled: Fine-tune the experience model on the run's fresh real transitions.
        every_batches: In a stage that plays real episodes, refresh after every this many
            batches (0: once, when the stage ends); a stage always ends with a refresh when
            fresh transitions are waiting.
        min_transitions: Fresh real transitions needed for a refresh (fewer wait for more).
        steps: Optimisation steps of one refresh.
        learning_rate: Its learning rate (fine-tuning: far below a from-scratch model's 1e-3).
        batch_size: Examples a step.
        replay: Recorded examples (the model's own training data, from the buffer's offline
            episodes) mixed in per fresh one.

    Each refresh is calibrated before and after (the run's ``calibrate_limit`` validation
    tasks, :mod:`~dreamgym_agents.experience.calibration`).
    """

    enabled: bool = False
    every_batches: int = 0
    min_transitions: int = 20
    steps: int = 60
    learning_rate: float = 1e-4
    batch_size: int = 8
    replay: float = 1.0

    def __post_init__(self) -> None:
        if self.every_batches < 0 or self.min_transitions < 1 or self.steps < 1:
            raise ConfigError("experience_refresh: every_batches must be >= 0, min_transitions "
                              "and steps >= 1")
        if self.learning_rate <= 0 or self.batch_size < 1 or self.replay < 0:
            raise ConfigError("experience_refresh: learning_rate and batch_size must be "
                              "positive, replay >= 0")


def refresh_experience_model(
    base: str | Path, fresh: list[Trajectory], recorded: list[Trajectory], buffer: Any,
    out_dir: str | Path, cfg: ExperienceRefreshConfig, *, family: Any, seed: int = 0,
    on_step: Any = None,
) -> dict[str, Any]:
    """Fine-tune the checkpoint ``base`` on ``fresh`` episodes' transitions (with
    ``cfg.replay`` examples of ``recorded`` episodes per fresh example), into
    ``out_dir/model``; a finished refresh (``out_dir/READY``) is returned as it was.
    ``family``: the episodes' task family (a :class:`~dreamgym_agents.episodes.env.TaskFamily`).

    Raises:
        ConfigError: ``base`` is not a checkpoint this toolkit trained (no manifest: a hosted
            model, or one trained elsewhere, has no recipe to fine-tune by), or there is
            nothing to learn from.
    """
    from dreamgym_agents.experience.annotate import annotate_deterministic
    from dreamgym_agents.experience.data import ExampleConfig, build_examples
    from dreamgym_agents.experience.sft import ExperienceSFTConfig, train_experience_model
    from dreamgym_agents.experience.training import (
        MANIFEST,
        RECORDED,
        experience_codec,
        read_manifest,
    )

    out = Path(out_dir)
    ready = out / READY_FILE
    if ready.is_file():
        return json.loads(ready.read_text())
    base = Path(str(base).removeprefix("hf/"))
    manifest = read_manifest(base)
    if manifest is None:
        raise ConfigError(f"experience_refresh: {base} is not an experience model trained by "
                          "dg-agents (no manifest): nothing says how to fine-tune it")
    if not fresh:
        raise ConfigError("experience_refresh: no fresh transitions to learn from")
    started = time.perf_counter()
    example_cfg = ExampleConfig(**{**manifest.get("example_config", {}), "seed": seed,
                                   "max_examples": None})
    codec = experience_codec(family, fresh, manifest.get("codec_version"))
    rng = random.Random(seed)
    annotate_deterministic(fresh, codec)
    new = build_examples(fresh, buffer, example_cfg, codec, where=RECORDED)
    old: list[dict[str, Any]] = []
    wanted = int(round(cfg.replay * len(new)))
    if wanted and recorded:
        pool = list(recorded)
        rng.shuffle(pool)
        # a few more episodes than needed: an episode gives several examples
        steps = sum(len(t.transitions) for t in pool) or 1
        share = pool[:max(1, int(len(pool) * min(1.0, 2 * wanted / steps)) + 1)]
        annotate_deterministic(share, codec)
        old = build_examples(share, buffer, example_cfg, codec, where=RECORDED)
        rng.shuffle(old)
        old = old[:wanted]
    examples = new + old
    if not examples:
        raise ConfigError("experience_refresh: the fresh episodes give no trainable example")
    rng.shuffle(examples)
    target = out / "model"
    sft_cfg = ExperienceSFTConfig(
        output_dir=str(target), base_model=str(base), max_steps=cfg.steps,
        batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, seed=seed,
        checkpoint_every=max(1, cfg.steps // 4),
        max_length=int((manifest.get("sft_config") or {}).get("max_length", 1024)))
    result = train_experience_model(examples, sft_cfg, on_step=on_step)
    if result.partial:  # never with a step count alone; kept for a time budget in sft.extra
        raise ConfigError("experience_refresh: the fine-tuning stopped early")
    shutil.rmtree(target / "trainer", ignore_errors=True)  # resume state; the model is done
    figures = {
        "model": str(target), "base": str(base), "fresh_episodes": len(fresh),
        "fresh_transitions": sum(len(t.transitions) for t in fresh),
        "fresh_examples": len(new), "replayed_examples": len(old), "steps": result.steps,
        "first_loss": result.first_loss, "last_loss": result.last_loss,
        "resumed_from_step": result.resumed_from_step,
        "seconds": round(time.perf_counter() - started, 1), "config": asdict(cfg),
    }
    refreshed = {**manifest, "refreshed": [*manifest.get("refreshed", []), figures]}
    (target / MANIFEST).write_text(json.dumps(refreshed, indent=2, sort_keys=True))
    out.mkdir(parents=True, exist_ok=True)
    ready.write_text(json.dumps(figures, indent=2, sort_keys=True))
    logger.info("experience model refreshed on %d fresh transitions (%d examples, %d "
                "replayed) in %.0f s: loss %.3f -> %.3f", figures["fresh_transitions"],
                len(new), len(old), figures["seconds"], result.first_loss or 0.0,
                result.last_loss or 0.0)
    return figures
