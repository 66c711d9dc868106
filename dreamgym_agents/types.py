"""Core data types: Task, Transition, Trajectory, and the versioned JSONL trajectory format.

One line of ``trajectories.jsonl`` is one episode (a :class:`Trajectory`), written with
:func:`dump_trajectory_line` and read back with :func:`read_trajectories`. Every line carries
``"format": FORMAT_VERSION`` so later versions can migrate old files instead of misreading them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from dreamgym_agents.errors import ConfigError

FORMAT_VERSION = 1
"""Version of the trajectory JSONL format written by this package."""

Provenance = Literal["real", "offline", "synthetic"]
"""Where a transition came from: a live environment during training (``real``), recorded data
used to seed the buffer and train the experience model (``offline``), or the experience model's
dream (``synthetic``)."""

PROVENANCES: tuple[str, ...] = ("real", "offline", "synthetic")


@dataclass
class Task:
    """One task instance.

    Attributes:
        task_id: Unique id within its family, e.g. ``"shopping.test.17"``.
        family: Task family that knows how to build its environment (``"webarena"``).
        intent: The natural-language instruction shown to the agent.
        split: ``"train"``, ``"test"`` or ``""`` for a task loaded from an arbitrary file.
        config: The family's raw configuration (for WebArena: the task-config JSON object,
            including ``eval`` and ``start_url``), kept verbatim so nothing is lost.
        oracle: An optional oracle action program (family-specific steps) that solves the task.
        template: The instruction's template, the family's kind of task (WebArena's
            ``intent_template``, an ALFWorld task type); "" for a task made without one.
        template_id: The template's id where the family numbers them ("": ``template`` names
            it); what tasks are grouped by (:func:`~dreamgym_agents.episodes.env.task_template`).
        params: The values the instruction was made from, template placeholder → text
            (WebArena's ``instantiation_dict``), as stripped strings, empty ones left out.
    """

    task_id: str
    family: str
    intent: str
    split: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    oracle: list[dict[str, Any]] | None = None
    template: str = ""
    template_id: str = ""
    params: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params = {str(k): str(v).strip() for k, v in (self.params or {}).items()
                       if str(v).strip()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        known = _known(cls, data)
        config = known.get("config")
        if "template" not in data and isinstance(config, dict):
            # a record written before the typed fields: they were WebArena's config keys
            known["template"] = str(config.get("intent_template") or "")
            known["template_id"] = str(config.get("intent_template_id", ""))
            raw = config.get("instantiation_dict")
            known["params"] = raw if isinstance(raw, dict) else {}
        return cls(**known)


@dataclass
class ModelUsage:
    """Token usage and cost of model calls (summed when several calls made one step)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cache_hits: int = 0

    def add(self, other: ModelUsage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd
        self.cache_hits += other.cache_hits

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Transition:
    """One step ``(s, a, s', r, done)`` with everything needed to learn from it.

    Attributes:
        episode_id: Id of the episode (trajectory) this step belongs to.
        step: 0-based index of the step within the episode.
        task_id: Id of the task being solved.
        state: Abstract textual state the agent saw before acting.
        action: The action text the agent produced (as parsed out of its answer).
        next_state: Abstract textual state after the action.
        reward: Reward of this step (outcome reward: 1.0 only at a successful final step).
        done: Whether the episode ended with this step.
        success: Whether the task was accomplished (only meaningful when ``done``).
        reasoning: The agent's reasoning for this action (``<think>`` content), if any.
        provenance: ``real``, ``offline`` or ``synthetic``.
        valid: False when the action could not be parsed or executed (an invalid-action step).
        error: Why the action was invalid, or an evaluator note; empty when fine.
        url: Page URL before the action, when the environment has one.
        agent_seconds: Wall time spent by the agent choosing the action.
        env_seconds: Wall time spent by the environment executing it.
        usage: Model usage of the agent for this step.
        info: Free-form extra data (evaluator details, raw model output, ...).
    """

    episode_id: str
    step: int
    task_id: str
    state: str
    action: str
    next_state: str
    reward: float = 0.0
    done: bool = False
    success: bool = False
    reasoning: str = ""
    provenance: str = "real"
    valid: bool = True
    error: str = ""
    url: str = ""
    agent_seconds: float = 0.0
    env_seconds: float = 0.0
    usage: ModelUsage = field(default_factory=ModelUsage)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.provenance not in PROVENANCES:
            raise ConfigError(
                f"provenance must be one of {', '.join(PROVENANCES)}, got {self.provenance!r}"
            )
        if isinstance(self.usage, dict):
            self.usage = ModelUsage(**_known(ModelUsage, self.usage))

    @property
    def truncated(self) -> bool:
        """True when the episode was cut here by its step limit (``done`` without the
        environment saying so)."""
        return bool(self.info.get("truncated"))

    @property
    def terminated(self) -> bool:
        """True when the environment itself ended the episode with this step (``done`` minus
        step-limit truncation): what an experience model is asked to predict."""
        return self.done and not self.truncated

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transition:
        return cls(**_known(cls, data))


@dataclass
class Trajectory:
    """One episode: the task, its transitions, and the outcome.

    Attributes:
        episode_id: Unique id of the episode.
        task: The task attempted.
        transitions: The steps, in order.
        success: Whether the task was accomplished.
        reward: Total reward of the episode.
        agent: Name of the agent that acted (``oracle``, ``random`` or a model string).
        provenance: Provenance of the episode's transitions.
        wall_seconds: Wall time of the whole episode, reset included.
        termination: Why the episode ended: ``done``, ``max_steps`` or ``error``.
        info: Free-form extra data (evaluator report, start URL, ...).
    """

    episode_id: str
    task: Task
    transitions: list[Transition] = field(default_factory=list)
    success: bool = False
    reward: float = 0.0
    agent: str = ""
    provenance: str = "real"
    wall_seconds: float = 0.0
    termination: str = "done"
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return len(self.transitions)

    @property
    def usage(self) -> ModelUsage:
        total = ModelUsage()
        for t in self.transitions:
            total.add(t.usage)
        return total

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        version = data.get("format", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ConfigError(
                f"trajectory format {version} is not supported (this version reads "
                f"{FORMAT_VERSION}); upgrade dreamgym-agents"
            )
        data = _known(cls, data)
        data["task"] = Task.from_dict(data["task"])
        data["transitions"] = [Transition.from_dict(t) for t in data.get("transitions", [])]
        traj = cls(**data)
        last = traj.transitions[-1] if traj.transitions else None
        if traj.termination == "max_steps" and last is not None and last.done:
            # Records written before transitions carried the flag: the step limit ended them.
            last.info.setdefault("truncated", True)
        return traj


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Keep only the keys that are fields of ``cls`` (tolerates extra keys from newer writers)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def dump_trajectory_line(trajectory: Trajectory) -> str:
    """Serialise one trajectory as one JSONL line (with the trailing newline)."""
    return json.dumps(trajectory.to_dict(), ensure_ascii=False, sort_keys=True) + "\n"


def append_trajectory(path: str | Path, trajectory: Trajectory) -> None:
    """Append one trajectory to a JSONL file and flush it to disk.

    A single ``write`` of a whole line followed by ``fsync`` keeps the file readable if the process
    is killed: at worst the last line is partial, and :func:`read_trajectories` drops it.
    """
    line = dump_trajectory_line(trajectory).encode("utf-8")
    with open(path, "ab") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write trajectories to a JSONL file (replacing it). Returns how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8") as fh:
        for traj in trajectories:
            fh.write(dump_trajectory_line(traj))
            count += 1
    return count


def iter_trajectories(path: str | Path, *, repair: bool = False) -> Iterator[Trajectory]:
    """Yield trajectories from a JSONL file.

    Args:
        path: The file.
        repair: If True, a partial last line (a write cut off by a killed process) is dropped and
            truncated from the file. Any other malformed line raises :class:`ConfigError`.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    lines = raw.split(b"\n")
    offset = 0
    for i, line in enumerate(lines):
        is_last = i == len(lines) - 1
        if line.strip():
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                if is_last and repair:
                    with open(path, "r+b") as fh:
                        fh.truncate(offset)
                    return
                raise ConfigError(f"{path}:{i + 1}: not a JSON line ({exc.msg})") from None
            yield Trajectory.from_dict(data)
        offset += len(line) + 1


def read_trajectories(path: str | Path, *, repair: bool = False) -> list[Trajectory]:
    """Read every trajectory of a JSONL file (see :func:`iter_trajectories`)."""
    return list(iter_trajectories(path, repair=repair))


def to_hf_dataset(
    trajectories: Iterable[Trajectory], *, level: Literal["transition", "episode"] = "transition"
) -> Any:
    """Export trajectories to a Hugging Face ``datasets.Dataset``.

    Args:
        trajectories: The episodes.
        level: ``"transition"`` gives one row per step with the task intent and episode outcome
            attached (what SFT and the buffer consume); ``"episode"`` gives one row per episode with
            its transitions as a list of dicts.
    """
    try:
        import datasets
    except ImportError:
        from dreamgym_agents.errors import MissingExtraError

        raise MissingExtraError("datasets", "train") from None
    rows: list[dict[str, Any]] = []
    for traj in trajectories:
        if level == "episode":
            row = traj.to_dict()
            row["task"] = json.dumps(row["task"], sort_keys=True)
            row["info"] = json.dumps(row["info"], sort_keys=True)
            for t in row["transitions"]:
                t["info"] = json.dumps(t["info"], sort_keys=True)
            rows.append(row)
            continue
        for t in traj.transitions:
            row = t.to_dict()
            row["info"] = json.dumps(row["info"], sort_keys=True)
            row["intent"] = traj.task.intent
            row["family"] = traj.task.family
            row["episode_success"] = traj.success
            row["agent"] = traj.agent
            rows.append(row)
    return datasets.Dataset.from_list(rows)
