"""From recorded trajectories to a trained experience model: annotate, seed, build, SFT.

``train_from_trajectories`` is what ``dg-agents train-experience`` runs; the embedded default
experience model (:mod:`dreamgym_agents.pipeline.embedded`) is this pipeline run on data the project
collects itself on the bundled site.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym_agents import launch
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.experience.annotate import annotate_deterministic, annotate_with_teacher
from dreamgym_agents.experience.data import ExampleConfig, build_examples
from dreamgym_agents.experience.sft import (
    ExperienceSFTConfig,
    train_experience_model,
    training_device,
)
from dreamgym_agents.types import Trajectory

if TYPE_CHECKING:
    from dreamgym_agents.buffer.replay import ReplayBuffer
    from dreamgym_agents.episodes.env import TaskFamily
    from dreamgym_agents.gateway.llm import Gateway

logger = logging.getLogger(__name__)

MANIFEST = "dreamgym_manifest.json"
RECORDED = {"provenance": {"$in": ["offline", "real"]}}


def train_from_trajectories(
    trajectories: list[Trajectory],
    buffer: ReplayBuffer | None,
    example_cfg: ExampleConfig,
    sft_cfg: ExperienceSFTConfig,
    *,
    teacher: Gateway | None = None,
    counterfactual_answers: int = 0,
    counterfactual_stops: int = 0,
    renamed: list[Trajectory] | None = None,
    codec_version: int | None = None,
    on_step: Callable[..., None] | None = None,
    family: TaskFamily,
) -> dict[str, Any]:
    """Annotate, make sure the buffer holds the data, build examples, train; returns a manifest.

    Args:
        trajectories: Recorded episodes (they seed an empty buffer).
        buffer: The replay buffer the examples' demonstrations come from; None in a
            launcher's other processes (:mod:`dreamgym_agents.launch`), since the main process
            builds the examples.
        example_cfg: What the examples show.
        sft_cfg: How the model is trained.
        teacher: A model writing the rationales; None derives them deterministically.
        counterfactual_answers: Variants of each recorded final answer, labelled by the task's
            evaluator, added as examples (not to the buffer): the task family's ``relabel``
            makes them (see :func:`relabelled`).
        counterfactual_stops: Stops at earlier recorded states per episode, labelled by the
            task's evaluator, added as examples (the family's ``relabel`` too).
        renamed: Copies of the episodes with their entities renamed (the family's
            ``renamed``), added as examples (not to the buffer).
        codec_version: The family's experience codec version to train in (None: its latest);
            the manifest records the one used, and the model is prompted in it.
        on_step: Called after each SFT step (a progress bar).
        family: The episodes' task family (resolved by the caller: its codec and relabelling).

    The manifest (also written next to the checkpoint) records the data, the settings, the losses
    and the time of each phase, so a model can always be traced back to how it was made.
    """
    codec = experience_codec(family, trajectories, codec_version)

    def prepare() -> dict[str, Any]:
        timings: dict[str, float] = {}
        start = time.perf_counter()
        variants, stops = relabelled(family, trajectories, answers=counterfactual_answers,
                                     stops=counterfactual_stops, seed=example_cfg.seed)
        everything = [*trajectories, *variants, *stops, *(renamed or [])]
        if teacher is None:
            annotated = annotate_deterministic(everything, codec)
            source = "deterministic"
        else:
            annotated = annotate_with_teacher(everything, teacher, codec)
            source = f"teacher:{teacher.cfg.model}"
        timings["annotate_s"] = time.perf_counter() - start

        if buffer is None:
            raise ConfigError("train_from_trajectories needs the replay buffer in the main "
                              "process")
        start = time.perf_counter()
        if buffer.count() == 0:
            buffer.add_trajectories(trajectories, provenance="offline")
        timings["seed_buffer_s"] = time.perf_counter() - start

        start = time.perf_counter()
        examples = build_examples(everything, buffer, example_cfg, codec, where=RECORDED)
        timings["build_examples_s"] = time.perf_counter() - start
        # The tokenizer (from scratch) learns its merges from the prompts, the answers and the
        # site's full pages, so page text costs few tokens.
        corpus = [e["messages"][-1]["content"] + "\n" + e["completion"] for e in examples]
        corpus += [t.next_state for traj in trajectories for t in traj.transitions[:3]]
        return {"examples": examples, "corpus": corpus, "annotated": annotated,
                "source": source, "timings": timings,
                "variants": (len(variants), sum(v.success for v in variants)),
                "stops": (len(stops), sum(v.success for v in stops))}

    # Under a launcher the main process alone touches the buffer; every process trains on its
    # examples (launch.shared).
    data = launch.shared(prepare, training_device())
    examples, corpus, annotated, source = (data["examples"], data["corpus"], data["annotated"],
                                           data["source"])
    timings = data["timings"]
    result = train_experience_model(examples, sft_cfg, corpus=corpus, on_step=on_step)
    timings["sft_s"] = result.seconds
    manifest = {
        "kind": "dreamgym-experience-model",
        "prompt_style": "compact",
        "codec_version": getattr(codec, "version", codec_version or 0),
        "episodes": len(trajectories),
        "transitions": sum(len(t.transitions) for t in trajectories),
        "annotated": annotated,
        "counterfactual_answers": {
            "per_answer": counterfactual_answers, "variants": data["variants"][0],
            "successful": data["variants"][1]},
        "counterfactual_stops": {
            "per_episode": counterfactual_stops, "stops": data["stops"][0],
            "successful": data["stops"][1]},
        "renamed_episodes": len(renamed or []),
        "rationale_source": source,
        "examples": result.examples,
        "dropped_too_long": result.dropped_too_long,
        "steps": result.steps,
        "planned_steps": result.planned_steps,
        "partial": result.partial,
        "resumed_from_step": result.resumed_from_step,
        "bf16_autocast": result.bf16,
        "device": result.device,
        "first_loss": result.first_loss,
        "last_loss": result.last_loss,
        "example_config": asdict(example_cfg),
        "sft_config": {k: v for k, v in asdict(sft_cfg).items() if k != "extra"},
        "timings": {k: round(v, 1) for k, v in timings.items()},
    }
    if launch.world_size() > 1:
        manifest["processes"] = launch.world_size()
    if launch.is_main():
        Path(result.path, MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def check_one_family(trajectories: list[Trajectory], family: TaskFamily) -> None:
    """Raise :class:`ConfigError` unless every episode is of ``family`` (one model simulates
    one family)."""
    names = sorted({traj.task.family.split(".", 1)[0] for traj in trajectories})
    if len(names) > 1:
        raise ConfigError(f"an experience model learns one task family; the episodes are of "
                          f"{', '.join(names)}: train one model per family")
    own = family.name.split(".", 1)[0]
    if names and names[0] != own:
        raise ConfigError(f"the episodes are of the {names[0]} family, not {own}")


def experience_codec(family: TaskFamily, trajectories: list[Trajectory],
                     version: int | None = None) -> Any:
    """The experience codec of ``family``, the episodes' (``TaskFamily.experience_codec``, in
    ``version``: None, the latest).

    Raises:
        ConfigError: The episodes are of several families, or of another one.
    """
    check_one_family(trajectories, family)
    return family.experience_codec(version)


def relabelled(family: TaskFamily, trajectories: list[Trajectory], *, answers: int, stops: int,
               seed: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(other final answers, earlier stops) of the recorded episodes, each labelled by its
    task's own evaluator: ``family`` relabels its own episodes (``TaskFamily.relabel``), in
    the episodes' order."""
    if answers < 1 and stops < 1 or not trajectories:
        return [], []
    return family.relabel(trajectories, answers=answers, stops=stops, seed=seed)


def read_manifest(checkpoint: str | Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint trained by this pipeline, or None."""
    path = Path(checkpoint, MANIFEST)
    return json.loads(path.read_text()) if path.exists() else None


def trained_settings(model: str) -> dict[str, Any]:
    """The experience settings a checkpoint trained by this pipeline must be prompted with:
    ``top_k``, the ablation flags, whether it saw its task's own records, ``prompt_style`` and
    ``codec_version`` (0 for a checkpoint whose manifest records none); empty for other model
    strings. The checkpoint is ``hf/<dir>``, or the same directory served by an OpenAI-compatible
    server under its path (``openai/<dir>``: vLLM and ``transformers serve`` name a model by the
    path they loaded it from)."""
    path = model[3:] if model.startswith("hf/") else model.partition("/")[2]
    manifest = (read_manifest(path) if path and Path(path).is_dir() else None) or {}
    trained = manifest.get("example_config", {})
    out = {k: trained[k] for k in ("top_k", "use_history", "use_retrieval", "use_reasoning",
                                   "exclude_same_task") if k in trained}
    if "prompt_style" in manifest:
        out["prompt_style"] = manifest["prompt_style"]
    if manifest:
        out["codec_version"] = int(manifest.get("codec_version") or 0)
    return out
