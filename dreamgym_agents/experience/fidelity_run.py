"""Dream runs and the fidelity evaluation behind ``dg-agents dream`` and ``dg-agents fidelity``.

- :func:`run_dream` plays one episode per task in the dream: the episode graph's runner with one
  :class:`~dreamgym_agents.experience.dream.DreamEnv` per concurrent episode, all sharing one
  experience model.
  Its ``summary.json`` also counts the experience-model failures (``em_failures``).
- :func:`run_fidelity` measures how closely the dream follows the real environment on held-out
  real runs (``dg-agents eval`` output folders, normally of the test split), DreamGym Sec. 5:

  1. every held-out transition is predicted with teacher forcing (the recorded history and state,
     the episode itself excluded from retrieval) and scored with
     :func:`~dreamgym_agents.experience.fidelity.transition_metrics`;
  2. whole episodes: each oracle episode's recorded actions are replayed in the dream from its
     real start state (:func:`replay_in_dream`), and a random agent plays the same tasks in the
     dream; their success rates are set beside the real runs' ones;
  3. optionally, an LLM judge scores the dream episodes on the rubric of
     :func:`~dreamgym_agents.experience.fidelity.judge_trajectories`.

  Everything goes to ``OUT/fidelity.json``, ``OUT/predictions.jsonl`` and
  ``OUT/oracle_replay.jsonl``, and the random agent's dream run to ``OUT/random_dream/``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from dreamgym_agents.episodes.agent import Agent
from dreamgym_agents.episodes.env import TaskFamily, ends_by_type, spread_tasks
from dreamgym_agents.episodes.graph import (
    RUN_FILE,
    SUMMARY_FILE,
    TRAJECTORIES_FILE,
    RunConfig,
    RunResult,
    run_episodes,
)
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.experience.dream import DreamBuffer, DreamConfig, DreamEnv
from dreamgym_agents.experience.fidelity import (
    RUBRIC,
    episode_success_rate,
    judge_trajectories,
    reward_check,
    state_f1,
    transition_metrics,
)
from dreamgym_agents.experience.model import (
    ChatModel,
    ExperienceModel,
    ExperiencePrediction,
    transition_id,
)
from dreamgym_agents.types import (
    ModelUsage,
    Task,
    Trajectory,
    Transition,
    read_trajectories,
    write_trajectories,
)

logger = logging.getLogger(__name__)

FIDELITY_FILE = "fidelity.json"
PREDICTIONS_FILE = "predictions.jsonl"
REPLAY_FILE = "oracle_replay.jsonl"
RANDOM_DREAM_DIR = "random_dream"
DEFAULT_MAX_STEPS = 15

PhaseProgress = Callable[[str, int], Callable[[bool], None]]
"""Progress hook: ``progress(phase, total)`` is called when a phase starts (``predict``,
``oracle replay``, ``random dream``, ``judge``) and returns the callback to call once per finished
item, with True when the item went well (a readable prediction, a successful episode)."""

_T = TypeVar("_T")
_R = TypeVar("_R")


# --------------------------------------------------------------------------------------------
# Dream runs
# --------------------------------------------------------------------------------------------


def experience_usage(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """The experience model's calls, tokens and cost over dream episodes (each step records
    its own: ``info["em_usage"]``)."""
    usage = ModelUsage()
    for traj in trajectories:
        for t in traj.transitions:
            if t.info.get("em_usage"):
                usage.add(ModelUsage(**t.info["em_usage"]))
    return {**asdict(usage), "total_tokens": usage.total_tokens}


def count_em_failures(trajectories: Iterable[Trajectory]) -> int:
    """Transitions whose experience-model answer could not be read (``info["em_failure"]``)."""
    return sum(bool(t.info.get("em_failure")) for traj in trajectories for t in traj.transitions)


async def run_dream(
    tasks: list[Task],
    agent: Agent,
    model: ExperienceModel,
    buffer: DreamBuffer | None,
    run_cfg: RunConfig,
    dream_cfg: DreamConfig | None = None,
    *,
    family: TaskFamily,
    on_episode: Callable[[Trajectory | None], None] | None = None,
) -> RunResult:
    """Play one episode per task in the dream, like ``dg-agents eval`` does in real environments.

    Same output folder as :func:`~dreamgym_agents.episodes.graph.run_episodes` (resumable,
    transitions of provenance ``synthetic``); ``summary.json`` gains ``em_failures``, the
    experience model's calls, tokens and cost (``experience_usage``; ``usage`` is the
    agent's) and, for a family that checks states (``state_success``), the dream's rewards
    against that check (``reward_check``), counted over every episode in the folder (resumed
    ones included).

    Args:
        tasks: The tasks (one episode each).
        agent: The agent.
        model: The experience model, shared by every dream environment.
        buffer: The replay buffer the dream takes recorded start states from (None synthesises
            them); retrieval goes through ``model``'s own buffer.
        run_cfg: Output folder, concurrency, episode length and the run's ``meta``.
        dream_cfg: The dream environments' settings.
        family: The tasks' family (its action set and state format).
        on_episode: Called after each episode (None for a failed one), e.g. for a progress bar.
    """
    dream_cfg = dream_cfg or DreamConfig()
    result = await run_episodes(tasks, lambda: DreamEnv(dream_cfg, model, buffer, family),
                                agent, run_cfg, on_episode=on_episode)
    traj_file = run_cfg.out_dir / TRAJECTORIES_FILE
    trajectories = read_trajectories(traj_file) if traj_file.exists() else []
    add_dream_figures(result.summary, trajectories, family)
    (run_cfg.out_dir / SUMMARY_FILE).write_text(
        json.dumps(result.summary, indent=2, sort_keys=True)
    )
    return result


def add_dream_figures(summary: dict[str, Any], trajectories: list[Trajectory],
                      family: TaskFamily) -> None:
    """A dream run's own figures, over its episodes: ``em_failures``, ``experience_usage``
    and, for a family that checks states, ``reward_check``."""
    summary["em_failures"] = count_em_failures(trajectories)
    summary["experience_usage"] = experience_usage(trajectories)
    checked = reward_check(trajectories, getattr(family, "state_success", None))
    if checked is not None:
        summary["reward_check"] = checked


class _HeldOutModel:
    """The experience model with one episode kept out of retrieval: a replayed episode must not
    find its own recorded transitions (that would copy the answer)."""

    def __init__(self, model: ExperienceModel, episode_id: str) -> None:
        self.model = model
        self.episode_id = episode_id

    def predict(self, task: Task | str, history: list[Transition], state: str, action: str, *,
                exclude_episode: str | None = None) -> ExperiencePrediction:
        return self.model.predict(task, history, state, action,
                                  exclude_episode=exclude_episode or self.episode_id)


class _RecordedStart:
    """A dream "buffer" that only knows one start state: the replayed episode's real one."""

    def __init__(self, state: str) -> None:
        self.state = state

    def start_state(self, task_id: str | None = None, *, start: str | None = None,
                    family: str | None = None) -> str | None:
        return self.state

    def retrieve(self, state: str, action: str, *, k: int | None = None,
                 where: dict | None = None, exclude_episode: str | None = None) -> list:
        return []  # the dream retrieves through the experience model, never through this


def replay_in_dream(
    trajectory: Trajectory, model: ExperienceModel, dream_cfg: DreamConfig | None = None, *,
    family: TaskFamily,
) -> Trajectory:
    """Play a recorded episode's actions, in order, in the dream.

    The dream starts from the episode's real initial state and retrieves nothing of the episode
    itself. An unparseable recorded action is an invalid step that does not end the replay (a real
    environment lets the agent go on after one, and so did the recorded episode). The replay stops
    when the dream says done or the recorded actions run out (then it is not a success).

    Returns:
        The dream episode (``episode_id`` ``<original>-replay``, provenance ``synthetic``);
        ``termination`` is ``done``, or ``max_steps`` when the actions ran out first.
    """
    cfg = replace(dream_cfg or DreamConfig(), invalid_action_ends_episode=False)
    episode_id = f"{trajectory.episode_id}-replay"
    if not trajectory.transitions:
        return Trajectory(episode_id=episode_id, task=trajectory.task, agent=trajectory.agent,
                          provenance="synthetic", termination="max_steps")
    start = trajectory.transitions[0].state
    env = DreamEnv(cfg, _HeldOutModel(model, trajectory.episode_id),  # type: ignore[arg-type]
                   _RecordedStart(start), family)
    try:
        env.reset(trajectory.task)
        done = success = False
        for t in trajectory.transitions:
            result = env.step(t.action)
            if result.done:
                done, success = True, result.success
                break
        steps = env.history
    finally:
        env.close()
    for t in steps:
        t.episode_id = episode_id
    return Trajectory(
        episode_id=episode_id, task=trajectory.task, transitions=steps, success=success,
        reward=sum(t.reward for t in steps), agent=trajectory.agent, provenance="synthetic",
        termination="done" if done else "max_steps",
        info={"replay_of": trajectory.episode_id, "real_success": trajectory.success},
    )


# --------------------------------------------------------------------------------------------
# Held-out real runs
# --------------------------------------------------------------------------------------------


@dataclass
class RealRun:
    """A recorded real run: an output folder of ``dg-agents eval``.

    Attributes:
        path: The folder.
        agent: The agent that played it (``oracle``, ``random``, a model string), from its
            ``run.json``/``summary.json``, else from its episodes.
        trajectories: Its episodes.
        meta: Its ``run.json`` (or ``summary.json``) content.
    """

    path: Path
    agent: str
    trajectories: list[Trajectory]
    meta: dict[str, Any] = field(default_factory=dict)


def load_real_run(path: str | Path) -> RealRun:
    """Read a ``dg-agents eval`` output folder.

    Raises:
        ConfigError: The folder is missing, has no ``trajectories.jsonl``, holds no episodes, or
            holds dream (synthetic) episodes instead of real ones.
    """
    path = Path(path)
    hint = f"run `dg-agents eval --split test --out {path}` first"
    if not path.is_dir():
        raise ConfigError(f"real run folder {path} does not exist: {hint}")
    traj_file = path / TRAJECTORIES_FILE
    if not traj_file.is_file():
        raise ConfigError(f"real run folder {path} has no {TRAJECTORIES_FILE}: {hint}")
    meta: dict[str, Any] = {}
    for name in (RUN_FILE, SUMMARY_FILE):
        if (path / name).is_file():
            try:
                meta = json.loads((path / name).read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path / name}: not valid JSON ({exc.msg})") from None
            break
    trajectories = read_trajectories(traj_file)
    if not trajectories:
        raise ConfigError(f"real run folder {path}: {TRAJECTORIES_FILE} holds no episodes")
    steps = [t for traj in trajectories for t in traj.transitions]
    if steps and all(t.provenance == "synthetic" for t in steps):
        raise ConfigError(f"real run folder {path} holds dream (synthetic) episodes: pass the "
                          "output of `dg-agents eval`, not of `dg-agents dream`")
    agent = str(meta.get("agent") or trajectories[0].agent or "")
    return RealRun(path=path, agent=agent, trajectories=trajectories, meta=meta)


def load_real_runs(paths: Iterable[str | Path]) -> list[RealRun]:
    """:func:`load_real_run` of each folder (at least one)."""
    runs = [load_real_run(p) for p in paths]
    if not runs:
        raise ConfigError("fidelity needs at least one real run folder (dg-agents eval output)")
    return runs


def _task_key(task: Task) -> tuple[str, str, str]:
    return task.family, task.split, task.task_id


def held_out_tasks(runs: list[RealRun], limit: int | None = None) -> list[Task]:
    """The tasks of the runs, in order of first appearance.

    With ``limit``, that many tasks spread over the task templates: one of each template in
    turn (in order of first appearance), as many rounds as it takes. Task files list a
    template's tasks together, and the first N of the bundled test split are all questions:
    a short run would measure no navigation or action task at all.
    """
    seen: dict[tuple[str, str, str], Task] = {}
    for run in runs:
        for traj in run.trajectories:
            seen.setdefault(_task_key(traj.task), traj.task)
    return spread_tasks(list(seen.values()), limit)


# --------------------------------------------------------------------------------------------
# The fidelity run
# --------------------------------------------------------------------------------------------


@dataclass
class FidelityConfig:
    """Settings of a fidelity evaluation.

    Attributes:
        out_dir: Output folder (``fidelity.json``, ``predictions.jsonl``, ``oracle_replay.jsonl``,
            ``random_dream/``).
        family: Task family the held-out runs must belong to (``webarena``, ``alfworld``, …).
        limit: Use only this many tasks of the real runs (all their episodes), spread over the
            task templates (:func:`held_out_tasks`); None uses all.
        concurrency: Predictions, replays and dream episodes in flight at once.
        max_steps: Episode length of the random agent's dream run; None takes the random real
            run's ``max_steps`` (from its ``run.json``), else 15.
        seed: Seed of the random agent and of the judge's sample.
        judge_samples: Dream episodes the judge scores (sampled without replacement).
        ignore_ids: Compare states without the ids a model cannot know (the family's
            ``StateFormat.strip_ids``: a web element's ``[bid]``).
    """

    out_dir: Path
    family: str
    limit: int | None = None
    concurrency: int = 2
    max_steps: int | None = None
    seed: int = 0
    judge_samples: int = 10
    ignore_ids: bool = False

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"fidelity.limit must be >= 1 or null (all tasks), got {self.limit}")
        if self.concurrency < 1:
            raise ConfigError(f"fidelity.concurrency must be >= 1, got {self.concurrency}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"fidelity.max_steps must be >= 1 or null, got {self.max_steps}")
        if self.judge_samples < 1:
            raise ConfigError(f"fidelity.judge_samples must be >= 1, got {self.judge_samples}")


async def _gather_bounded(
    items: list[_T], fn: Callable[[_T], _R], concurrency: int, tick: Callable[[_R], None]
) -> list[_R]:
    """``fn`` over ``items`` in threads, at most ``concurrency`` at once; results in order."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(item: _T) -> _R:
        async with semaphore:
            result = await asyncio.to_thread(fn, item)
        tick(result)
        return result

    return list(await asyncio.gather(*(one(item) for item in items)))


def _success(trajectories: list[Trajectory]) -> float | None:
    return round(episode_success_rate(trajectories), 4) if trajectories else None


def _prediction_row(agent: str, real: Transition, prediction: ExperiencePrediction,
                    strip_ids: Callable[[str], str] | None) -> dict[str, Any]:
    out = prediction.output
    return {
        "id": transition_id(real), "agent": agent, "task_id": real.task_id,
        "action": real.action,
        "real": {"reward": real.reward, "done": real.terminated, "success": real.success},
        "predicted": None if out is None else {"reward": out.reward, "done": out.done,
                                               "success": out.success},
        "state_f1": None if out is None else round(
            state_f1(out.next_state, real.next_state, strip_ids=strip_ids), 4),
        "em_failure": prediction.failure, "demos": prediction.demos,
        # the model's own answer (reference and edits unexpanded): what to read when a
        # prediction is wrong
        "raw": prediction.raw,
    }


async def run_fidelity(
    cfg: FidelityConfig,
    runs: list[RealRun],
    model: ExperienceModel,
    buffer: DreamBuffer | None,
    dream_cfg: DreamConfig | None = None,
    *,
    judge: ChatModel | None = None,
    meta: dict[str, Any] | None = None,
    progress: PhaseProgress | None = None,
    task_family: TaskFamily,
) -> dict[str, Any]:
    """Evaluate the experience model against held-out real runs (see the module docstring).

    Args:
        cfg: Output folder, task limit, concurrency, ….
        runs: The real runs (:func:`load_real_runs`); ``oracle`` and ``random`` runs also give
            the episode-level figures.
        model: The experience model (its ``cfg`` holds the ablation flags reported).
        buffer: The replay buffer for the random agent's dream start states.
        dream_cfg: Settings of the dream environments.
        judge: A model to score dream episodes on the rubric; None skips the judge.
        meta: What identifies the evaluation (experience model, ablation flags, buffer, …):
            written into the report and the random dream run's ``run.json`` (a rerun must match
            it to resume that run), so leave out what does not change the dream (the judge).
        progress: Progress hook (:data:`PhaseProgress`).
        task_family: The family ``cfg.family`` names, resolved by the caller (its action set,
            offline agents and state format).

    Returns:
        The report written to ``OUT/fidelity.json``: ``reward_accuracy``, ``done_accuracy``,
        ``success_accuracy``, ``state_f1``, ``em_failure_rate`` (and their ``_ok`` variants),
        ``oracle_real_success``, ``oracle_dream_success``, ``random_real_success``,
        ``random_dream_success`` (None without such a run), ``counts``, the ablation flags, the
        rubric means (None without a judge) and ``judge``.

    Raises:
        ConfigError: A run's tasks are of another family.
        ModelError: An experience-model or judge call failed (after the gateway's retries).
    """
    dream_cfg = dream_cfg or DreamConfig()
    meta = dict(meta or {})

    def phase(name: str, total: int) -> Callable[[bool], None]:
        return progress(name, total) if progress else (lambda ok: None)

    family = cfg.family.split(".", 1)[0]
    for run in runs:
        other = sorted({t.task.family for t in run.trajectories} - {family})
        if other:
            raise ConfigError(f"real run folder {run.path} holds {', '.join(other)} tasks, not "
                              f"{family} ones: evaluate on family {other[0]} or pass runs of "
                              f"{family}")
    if task_family.name.split(".", 1)[0] != family:
        raise ConfigError(f"fidelity of the {family} family measured with the "
                          f"{task_family.name} family's parts")
    action_set = task_family.action_set()
    agents = task_family.offline_agents(cfg.seed)
    states = task_family.state_format()
    strip_ids = states.strip_ids if cfg.ignore_ids else None
    reveals = getattr(states, "reveals", None)
    tasks = held_out_tasks(runs, cfg.limit)
    keys = {_task_key(t) for t in tasks}
    episodes = [(run.agent, traj) for run in runs for traj in run.trajectories
                if _task_key(traj.task) in keys]
    cfg.out_dir.mkdir(parents=True, exist_ok=True)

    # 1. Teacher-forced predictions of every held-out transition.
    tick = phase("predict", len(episodes))
    per_episode = await _gather_bounded(
        [traj for _, traj in episodes], model.predict_trajectory, cfg.concurrency,
        lambda pairs: tick(all(p.ok for _, p in pairs)),
    )
    pairs = [pair for episode_pairs in per_episode for pair in episode_pairs]
    metrics = transition_metrics(pairs, strip_ids=strip_ids,
                                 is_terminal=ends_by_type(action_set), reveals=reveals)
    with open(cfg.out_dir / PREDICTIONS_FILE, "w", encoding="utf-8") as fh:
        for (agent, _), episode_pairs in zip(episodes, per_episode, strict=True):
            for real, prediction in episode_pairs:
                row = _prediction_row(agent, real, prediction, strip_ids)
                fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")

    # 2a. The oracle's recorded actions replayed in the dream.
    oracle_real = [traj for agent, traj in episodes if agent == "oracle"]
    tick = phase("oracle replay", len(oracle_real))
    replays = await _gather_bounded(
        oracle_real,
        lambda traj: replay_in_dream(traj, model, dream_cfg, family=task_family),
        cfg.concurrency, lambda traj: tick(traj.success),
    )
    write_trajectories(cfg.out_dir / REPLAY_FILE, replays)

    # 2b. A random agent in the dream on the same tasks.
    random_real = [traj for agent, traj in episodes if agent == "random"]
    max_steps = cfg.max_steps or next(
        (int(run.meta["max_steps"]) for run in runs
         if run.agent == "random" and run.meta.get("max_steps")), DEFAULT_MAX_STEPS)
    run_cfg = RunConfig(
        out_dir=cfg.out_dir / RANDOM_DREAM_DIR, concurrency=cfg.concurrency, max_steps=max_steps,
        meta={"command": "fidelity", "part": "random_dream", **meta, "agent": "random",
              "tasks": [t.task_id for t in tasks], "max_steps": max_steps, "seed": cfg.seed},
    )
    tick = phase("random dream", len(tasks))
    random_run = await run_dream(tasks, agents["random"], model, buffer, run_cfg, dream_cfg,
                                 family=task_family,
                                 on_episode=lambda t: tick(bool(t and t.success)))
    random_dream = read_trajectories(run_cfg.out_dir / TRAJECTORIES_FILE) \
        if (run_cfg.out_dir / TRAJECTORIES_FILE).exists() else []
    random_dream = [t for t in random_dream if _task_key(t.task) in keys]

    # 3. The judge, on the dream episodes.
    dreamed = [*replays, *[t for t in random_dream if t.transitions]]
    rubric: dict[str, Any] = dict.fromkeys(RUBRIC)
    judge_info: dict[str, Any] | None = None
    if judge is not None and dreamed:
        tick = phase("judge", 1)
        scores = await asyncio.to_thread(judge_trajectories, judge, dreamed, cfg.judge_samples,
                                         seed=cfg.seed)
        tick(scores["judged"] > 0)
        rubric = {k: None if scores[k] is None else round(scores[k], 4) for k in RUBRIC}
        judge_cfg = getattr(judge, "cfg", None)
        judge_info = {"model": getattr(judge_cfg, "model", ""), "samples": cfg.judge_samples,
                      "judged": scores["judged"], "unparseable": scores["unparseable"]}
        if hasattr(judge, "usage"):  # a gateway: the judge's calls, tokens and cost
            judge_info["usage"] = asdict(judge.usage)

    report: dict[str, Any] = {
        **meta,
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()},
        "oracle_real_success": _success(oracle_real),
        "oracle_dream_success": _success(replays),
        "random_real_success": _success(random_real),
        "random_dream_success": _success(random_dream),
        "use_history": model.cfg.use_history,
        "use_retrieval": model.cfg.use_retrieval,
        "use_reasoning": model.cfg.use_reasoning,
        **rubric,
        "judge": judge_info,
        "counts": {
            "tasks": len(tasks),
            "real_episodes": len(episodes),
            "transitions": metrics["n"],
            "transitions_ok": metrics["n_ok"],
            "invalid_transitions_skipped": sum(
                not t.valid for _, traj in episodes for t in traj.transitions),
            "oracle_episodes": len(oracle_real),
            "random_episodes": len(random_real),
            "random_dream_episodes": len(random_dream),
            "random_dream_failed": len(random_run.failed),
            "dream_em_failures": count_em_failures([*replays, *random_dream]),
        },
        "real_runs": [
            {"path": str(run.path), "agent": run.agent, "episodes": len(run.trajectories),
             "success_rate": _success(run.trajectories)} for run in runs
        ],
    }
    (cfg.out_dir / FIDELITY_FILE).write_text(json.dumps(report, indent=2, sort_keys=True))
    logger.info("fidelity: %d transitions, %d tasks → %s", metrics["n"], len(tasks),
                cfg.out_dir / FIDELITY_FILE)
    return report
