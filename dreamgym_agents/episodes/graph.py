"""The episode graph (LangGraph) and the concurrent, resumable runner.

One episode is a small cyclic graph: ``reset → agent ⇄ environment → END``. The agent node asks the
agent for a decision; the environment node executes it and appends the transition; the router
``should_continue`` ends the episode when the environment says done or ``max_steps`` is reached.
Services (environment, agent) live in the graph's runtime context; only data lives in the state,
which LangGraph's SQLite checkpointer saves (one thread per episode) when the episode ends.

The runner plays many episodes at once (``concurrency`` environments in a pool) and appends each
finished episode to ``trajectories.jsonl`` exactly once. Rerunning the same command on the same
output folder resumes: episodes already in the file are skipped, an episode whose checkpoint says it
finished (killed between checkpoint and file write) is written from its checkpoint, and an episode
cut off mid-way is played again from its start (a live page cannot be rewound to a checkpoint).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import operator
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from dreamgym_agents.episodes.agent import Agent
from dreamgym_agents.episodes.env import Environment, Observation
from dreamgym_agents.errors import ConfigError, DreamGymError, ModelError, UnplayableTaskError
from dreamgym_agents.types import (
    ModelUsage,
    Task,
    Trajectory,
    Transition,
    append_trajectory,
    read_trajectories,
)

logger = logging.getLogger(__name__)

TRAJECTORIES_FILE = "trajectories.jsonl"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
ERRORS_FILE = "errors.jsonl"
CHECKPOINT_FILE = "checkpoints.sqlite"


class EpisodeState(TypedDict, total=False):
    """Data of one episode (checkpointed after every node)."""

    episode_id: str
    task: dict[str, Any]
    observation: dict[str, Any]
    decision: dict[str, Any] | None
    transitions: Annotated[list[dict[str, Any]], operator.add]
    step: int
    done: bool
    success: bool
    termination: str
    started_at: float


@dataclass
class EpisodeContext:
    """Services of one episode, handed to the nodes through the runtime context."""

    env: Environment
    agent: Agent
    max_steps: int
    executor: concurrent.futures.Executor | None = None
    """Where the environment's blocking calls run (None: the event loop's default pool)."""


async def in_thread(executor: concurrent.futures.Executor | None, fn: Callable[..., Any],
                    *args: Any) -> Any:
    """``fn(*args)`` in ``executor``'s threads (None: ``asyncio.to_thread``'s default pool)."""
    if executor is None:
        return await asyncio.to_thread(fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor,
                                                            functools.partial(fn, *args))


async def reset_node(state: EpisodeState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    task = Task.from_dict(state["task"])
    ctx = runtime.context
    obs = await in_thread(ctx.executor, ctx.env.reset, task)
    return {"observation": asdict(obs), "step": 0, "done": False, "success": False,
            "termination": "", "decision": None}


async def agent_node(state: EpisodeState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    task = Task.from_dict(state["task"])
    history = [Transition.from_dict(t) for t in state.get("transitions", [])]
    start = time.perf_counter()
    decision = await runtime.context.agent.act(
        task, Observation(**state["observation"]), history, state["episode_id"]
    )
    decision.seconds = decision.seconds or time.perf_counter() - start
    return {"decision": asdict(decision)}


async def environment_node(
    state: EpisodeState, runtime: Runtime[EpisodeContext]
) -> dict[str, Any]:
    ctx = runtime.context
    decision = state["decision"] or {}
    before = Observation(**state["observation"])
    start = time.perf_counter()
    result = await in_thread(ctx.executor, ctx.env.step, decision.get("action", ""))
    env_seconds = time.perf_counter() - start
    step = state["step"]
    out_of_steps = not result.done and step + 1 >= ctx.max_steps
    transition = Transition(
        episode_id=state["episode_id"],
        step=step,
        task_id=state["task"]["task_id"],
        state=before.state,
        action=decision.get("action", ""),
        next_state=result.observation.state,
        reward=result.reward,
        done=result.done or out_of_steps,
        success=result.success,
        reasoning=decision.get("reasoning", ""),
        provenance=ctx.env.provenance,
        valid=result.valid,
        error=result.error,
        url=before.url,
        agent_seconds=decision.get("seconds", 0.0),
        env_seconds=env_seconds,
        usage=ModelUsage(**decision.get("usage", {})),
        info={**result.info, **({"raw": decision["raw"]} if decision.get("raw") else {}),
              **({"truncated": True} if out_of_steps else {})},
    )
    # an environment that scores an episode at the step limit ends it there itself
    limit = out_of_steps or bool(result.info.get("step_limit"))
    termination = "max_steps" if limit else ("done" if result.done else "")
    return {
        "transitions": [_fields(transition)],
        "observation": _fields(result.observation),
        "decision": None,
        "step": step + 1,
        "done": result.done or out_of_steps,
        "success": result.success,
        "termination": termination,
    }


def _fields(item: Transition | Observation) -> dict[str, Any]:
    """A step's record as the state's plain data: ``asdict`` one level deep (its ``info`` a
    fresh mapping of the same values; a transition's usage as a mapping). ``asdict``'s deep
    copy of every info value (a game's admissible commands, the retrieved demos' ids) costs a
    dream a noticeable share of its CPU a step; nothing mutates those values once recorded."""
    data = {f.name: getattr(item, f.name) for f in fields(item)}
    data["info"] = dict(item.info)
    if isinstance(item, Transition):
        data["usage"] = asdict(item.usage)
    return data


def should_continue(state: EpisodeState) -> str:
    """Route after the environment: end the episode or ask the agent again."""
    return END if state.get("done") else "agent"


def build_episode_graph(checkpointer: Any = None) -> Any:
    """Build and compile the episode graph."""
    builder = StateGraph(EpisodeState, context_schema=EpisodeContext)
    builder.add_node("reset", reset_node)
    builder.add_node("agent", agent_node)
    builder.add_node("environment", environment_node)
    builder.add_edge(START, "reset")
    builder.add_edge("reset", "agent")
    builder.add_edge("agent", "environment")
    builder.add_conditional_edges("environment", should_continue, ["agent", END])
    return builder.compile(checkpointer=checkpointer)


def _with_partial(exc: DreamGymError, state: Any, agent: str) -> DreamGymError:
    """``exc``, with the steps its episode played before it (``exc.partial``: a trajectory
    whose ``termination`` is ``cut``; None when it played none): a real step played is kept
    even when its episode could not finish (a budget spent mid-episode)."""
    steps = (state or {}).get("transitions") or []
    partial = None
    if steps:
        partial = trajectory_from_state(state, agent)
        partial.termination = "cut"
    exc.partial = partial  # type: ignore[attr-defined]
    return exc


def trajectory_from_state(state: EpisodeState, agent: str) -> Trajectory:
    """Turn a finished episode's state into a :class:`Trajectory`."""
    transitions = [Transition.from_dict(t) for t in state.get("transitions", [])]
    provenance = transitions[0].provenance if transitions else "real"
    return Trajectory(
        episode_id=state["episode_id"],
        task=Task.from_dict(state["task"]),
        transitions=transitions,
        success=bool(state.get("success")),
        reward=sum(t.reward for t in transitions),
        agent=agent,
        provenance=provenance,
        wall_seconds=time.time() - state.get("started_at", time.time()),
        termination=state.get("termination") or "done",
    )


@dataclass
class RunConfig:
    """How a batch of episodes is run.

    Attributes:
        out_dir: Output folder (trajectories, summary, checkpoints).
        concurrency: Episodes played at once (one environment each).
        max_steps: Episode length limit.
        meta: What identifies the run (task, split, agent, ...); a rerun must match it to resume.
    """

    out_dir: Path
    concurrency: int = 2
    max_steps: int = 15
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be at least 1, got {self.max_steps}")


@dataclass
class RunResult:
    """What a run did: the summary written to ``summary.json`` and the episodes that failed."""

    summary: dict[str, Any]
    failed: list[dict[str, Any]]
    skipped: int

    @property
    def retryable(self) -> list[dict[str, Any]]:
        """The failed episodes a rerun may play (all but those whose task can never be played,
        ``UnplayableTaskError``: a broken game file)."""
        return [f for f in self.failed if not f.get("unplayable")]

    def check(self, what: str, errors: Path) -> None:
        """End a stage that must not go on with episodes missing, in one line; episodes whose
        task can never be played are only logged (a rerun would fail them the same way).

        Raises:
            ConfigError: Episodes failed that a rerun may play.
        """
        unplayable = len(self.failed) - len(self.retryable)
        if unplayable:
            logger.warning("%s: %d task(s) could not be played and were left out, each with "
                           "its reason in %s", what, unplayable, errors)
        if self.retryable:
            raise ConfigError(f"{len(self.retryable)} {what} episode(s) failed (see {errors}); "
                              "rerun the same command to retry them")


def episode_id_for(task: Task, agent: str) -> str:
    """A run's episode id: unique per agent and task, stable across reruns (resume), and
    distinct between runs of different agents (their transitions share one buffer)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in agent)
    return f"{safe}-{task.family}-{task.split or 'file'}-{task.task_id}"


def prepare_out_dir(cfg: RunConfig) -> set[str]:
    """Create the folder, check that a resumed run matches, and return finished episode ids."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    run_file = cfg.out_dir / RUN_FILE
    if run_file.exists():
        previous = json.loads(run_file.read_text())
        if previous != cfg.meta:
            diff = ", ".join(
                f"{k}={previous.get(k)!r}" for k in sorted(set(previous) | set(cfg.meta))
                if previous.get(k) != cfg.meta.get(k)
            )
            raise ConfigError(
                f"{cfg.out_dir} holds a different run ({diff}): use another --out folder"
            )
    else:
        run_file.write_text(json.dumps(cfg.meta, indent=2, sort_keys=True))
    traj_file = cfg.out_dir / TRAJECTORIES_FILE
    if not traj_file.exists():
        return set()
    return {t.episode_id for t in read_trajectories(traj_file, repair=True)}


async def run_episodes(
    tasks: list[Task],
    make_env: Callable[[], Environment],
    agent: Agent,
    cfg: RunConfig,
    *,
    on_episode: Callable[[Trajectory | None], None] | None = None,
) -> RunResult:
    """Play one episode per task, concurrently and resumably; write trajectories and summary.

    Args:
        tasks: The tasks (one episode each).
        make_env: Builds one environment (called at most ``concurrency`` times).
        agent: The agent.
        cfg: Run settings.
        on_episode: Called after each episode (with None for a failed one), e.g. to advance a
            progress bar; also called once per skipped (already finished) episode.
    """
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    finished = prepare_out_dir(cfg)
    traj_file = cfg.out_dir / TRAJECTORIES_FILE
    pending = [t for t in tasks if episode_id_for(t, agent.name) not in finished]
    skipped = len(tasks) - len(pending)
    for _ in range(skipped):
        if on_episode:
            on_episode(None)
    failed: list[dict[str, Any]] = []
    write_lock = asyncio.Lock()
    envs: asyncio.Queue[Environment] = asyncio.Queue()
    created: list[Environment] = []
    wall_start = time.perf_counter()
    # Each episode holds a thread while its environment steps (a dream's step waits on the
    # experience model): the loop's default pool (min(32, CPUs + 4) threads) would cap the
    # episodes in flight, so the run brings its own, one thread per episode and a few spare.
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=cfg.concurrency + 4,
                                                     thread_name_prefix="episode")

    async def acquire_env() -> Environment:
        if envs.empty() and len(created) < cfg.concurrency:
            env = await in_thread(executor, make_env)
            created.append(env)
            return env
        return await envs.get()

    async with AsyncSqliteSaver.from_conn_string(str(cfg.out_dir / CHECKPOINT_FILE)) as saver:
        graph = build_episode_graph(saver)
        semaphore = asyncio.Semaphore(cfg.concurrency)

        async def play(task: Task) -> None:
            episode_id = episode_id_for(task, agent.name)
            config = {"configurable": {"thread_id": episode_id},
                      "recursion_limit": 2 * cfg.max_steps + 10}
            async with semaphore:
                snapshot = await graph.aget_state(config)
                values = snapshot.values if snapshot else {}
                if values.get("done"):
                    traj = trajectory_from_state(values, agent.name)
                else:
                    if values:
                        await saver.adelete_thread(episode_id)  # cut off mid-way: start over
                    env = await acquire_env()
                    try:
                        state = await graph.ainvoke(
                            {"episode_id": episode_id, "task": task.to_dict(),
                             "transitions": [], "started_at": time.time()},
                            config,
                            context=EpisodeContext(env=env, agent=agent, max_steps=cfg.max_steps,
                                                   executor=executor),
                            # one checkpoint, when the episode ends: what resume reads (a
                            # finished episode not yet in the file); one cut off mid-way is
                            # played again from its start, so its steps need none
                            durability="exit",
                        )
                    except ModelError as exc:
                        envs.put_nowait(env)
                        if not exc.retryable:
                            raise
                        failed.append({"episode_id": episode_id, "error": str(exc)})
                        if on_episode:
                            on_episode(None)
                        return
                    except DreamGymError as exc:
                        envs.put_nowait(env)
                        failed.append({"episode_id": episode_id, "error": str(exc),
                                       **({"unplayable": True}
                                          if isinstance(exc, UnplayableTaskError) else {})})
                        if on_episode:
                            on_episode(None)
                        return
                    envs.put_nowait(env)
                    traj = trajectory_from_state(state, agent.name)
                async with write_lock:
                    await in_thread(executor, append_trajectory, traj_file, traj)
            if on_episode:
                on_episode(traj)

        try:
            results = await asyncio.gather(*(play(t) for t in pending), return_exceptions=True)
        finally:
            for env in created:
                await in_thread(executor, env.close)
            executor.shutdown(wait=False)
        for res in results:
            if isinstance(res, BaseException):
                raise res

    if failed:
        with open(cfg.out_dir / ERRORS_FILE, "a", encoding="utf-8") as fh:
            for item in failed:
                fh.write(json.dumps(item) + "\n")
    summary = summarize(read_trajectories(traj_file) if traj_file.exists() else [], cfg.meta)
    summary["wall_seconds"] = round(time.perf_counter() - wall_start, 3)
    summary["failed_episodes"] = len(failed)
    summary["unplayable_episodes"] = sum(1 for item in failed if item.get("unplayable"))
    summary["resumed_episodes"] = skipped
    (cfg.out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True))
    return RunResult(summary=summary, failed=failed, skipped=skipped)


class EnvPool:
    """Environments kept between batches of episodes (a browser is slow to start).

    ``acquire`` hands out an idle environment or makes a new one; callers bound how many they
    hold at once to ``size`` (:func:`play_episodes` does). ``close`` closes every one made.
    """

    def __init__(self, make_env: Callable[[], Environment], size: int) -> None:
        if size < 1:
            raise ConfigError(f"an environment pool needs at least 1 environment, got {size}")
        self.make_env = make_env
        self.size = size
        self._idle: list[Environment] = []
        self._made: list[Environment] = []

    async def acquire(self) -> Environment:
        if self._idle:
            return self._idle.pop()
        env = await asyncio.to_thread(self.make_env)
        self._made.append(env)
        return env

    def release(self, env: Environment) -> None:
        self._idle.append(env)

    def close(self) -> None:
        for env in self._made:
            env.close()
        self._made, self._idle = [], []


async def play_episodes(
    episodes: list[tuple[str, Task]],
    pool: EnvPool,
    agent: Agent,
    *,
    max_steps: int,
    on_episode: Callable[[Trajectory | None], None] | None = None,
) -> list[Trajectory | DreamGymError]:
    """Play episodes through the episode graph, in memory (no files, no checkpoints): what a
    trainer's rollouts need. At most ``pool.size`` run at once.

    Args:
        episodes: ``(episode_id, task)`` pairs; ids must be unique (a group of rollouts of one
            task gets one id each).
        pool: The environments.
        agent: The agent (a policy being trained).
        max_steps: Episode length limit.
        on_episode: Called after each episode (None for a failed one).

    Returns:
        One entry per episode, in order: its trajectory, or the infrastructure error that ended
        it (:class:`~dreamgym_agents.errors.DreamGymError`; a non-retryable model error raises).
    """
    graph = build_episode_graph()
    semaphore = asyncio.Semaphore(pool.size)

    async def play(episode_id: str, task: Task) -> Trajectory | DreamGymError:
        async with semaphore:
            env = await pool.acquire()
            state: Any = None
            try:
                # the values after each node: the steps so far survive an error mid-episode
                async for values in graph.astream(
                    {"episode_id": episode_id, "task": task.to_dict(), "transitions": [],
                     "started_at": time.time()},
                    {"recursion_limit": 2 * max_steps + 10},
                    context=EpisodeContext(env=env, agent=agent, max_steps=max_steps),
                    stream_mode="values",
                ):
                    state = values
            except ModelError as exc:
                if not exc.retryable:
                    raise
                outcome: Trajectory | DreamGymError = _with_partial(exc, state, agent.name)
            except DreamGymError as exc:
                outcome = _with_partial(exc, state, agent.name)
            else:
                outcome = trajectory_from_state(state, agent.name)
            finally:
                pool.release(env)
        if on_episode:
            on_episode(outcome if isinstance(outcome, Trajectory) else None)
        return outcome

    return list(await asyncio.gather(*(play(eid, task) for eid, task in episodes)))


def summarize(trajectories: list[Trajectory], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Metrics of a set of episodes (the body of ``summary.json``)."""
    steps = [t for traj in trajectories for t in traj.transitions]
    usage = ModelUsage()
    for traj in trajectories:
        usage.add(traj.usage)
    env_steps = [t.env_seconds for t in steps]
    terminations: dict[str, int] = {}
    for traj in trajectories:
        terminations[traj.termination] = terminations.get(traj.termination, 0) + 1
    n = len(trajectories)
    return {
        **(meta or {}),
        "episodes": n,
        "successes": sum(t.success for t in trajectories),
        "success_rate": round(sum(t.success for t in trajectories) / n, 4) if n else 0.0,
        "real_transitions": sum(t.provenance == "real" for t in steps),
        "offline_transitions": sum(t.provenance == "offline" for t in steps),
        "synthetic_transitions": sum(t.provenance == "synthetic" for t in steps),
        "invalid_actions": sum(not t.valid for t in steps),
        "mean_steps": round(len(steps) / n, 3) if n else 0.0,
        "mean_env_step_seconds": round(sum(env_steps) / len(env_steps), 4) if env_steps else 0.0,
        "episode_seconds_total": round(sum(t.wall_seconds for t in trajectories), 3),
        "terminations": terminations,
        "usage": {**asdict(usage), "total_tokens": usage.total_tokens},
    }
