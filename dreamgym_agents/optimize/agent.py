"""Prompt learning for a hosted agent: DSPy optimises its instruction and worked examples,
scored by success in the dream, then confirmed on real tasks.

The program (:class:`DreamEpisodes`) plays one whole episode in the dream per example: each
step is one call of its ``step`` predictor (the agent's template, :mod:`.dspy_bridge`), the
episode runs through the same episode graph as every other agent, and the example's score is
the episode's success (with feedback naming what went wrong, for GEPA's reflection). Worked
examples are chosen by ``dspy.LabeledFewShot`` from real demonstrations (the embedded bundle's
oracle episodes on the train split, or a file); the instruction by ``dspy.GEPA``: train tasks
feed its reflective minibatches, validation tasks score each candidate (its Pareto set).
Baseline and optimised prompts are then played on real test tasks, if asked. Every episode,
dream or real, is written to the output folder.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym_agents.episodes.agent import (
    Decision,
    agent_fields,
    render_history,
    template_instruction,
)
from dreamgym_agents.episodes.graph import EnvPool, in_thread, play_episodes
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.optimize.dspy_bridge import (
    agent_adapter,
    agent_signature,
    compile_gepa,
    dspy_lm,
)
from dreamgym_agents.prompts import load_prompt
from dreamgym_agents.prompts.programs import PromptProgram
from dreamgym_agents.types import Task, Trajectory, Transition, append_trajectory

if TYPE_CHECKING:
    from dreamgym_agents.episodes.env import Environment, Observation
    from dreamgym_agents.gateway.llm import Gateway


@dataclass
class OptimizeConfig:
    """Settings of ``dg-agents optimize``.

    Attributes:
        budget: Dream episodes GEPA may play to score candidates (its ``max_metric_calls``).
        demos: Worked examples put in the prompt (0: none), from the demonstrations.
        train_tasks: Train tasks GEPA's reflective minibatches draw from.
        val_tasks: Validation tasks every candidate is scored on in the dream.
        minibatch: Episodes per reflective minibatch.
        max_steps: Steps of a dream episode.
        confirm_tasks: Real test tasks played by the baseline and the optimised prompt
            (0: no real confirmation).
        seed: Seed of the optimiser and the demo choice.
        train_steps: ``--target experience``: held-out real steps feeding the reflection.
        val_steps: ``--target experience``: held-out real steps scoring each candidate.
    """

    budget: int = 24
    demos: int = 2
    train_tasks: int = 6
    val_tasks: int = 4
    minibatch: int = 2
    max_steps: int = 10
    confirm_tasks: int = 5
    seed: int = 0
    train_steps: int = 12
    val_steps: int = 12

    def __post_init__(self) -> None:
        for name in ("budget", "train_tasks", "val_tasks", "minibatch", "max_steps",
                     "train_steps", "val_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"optimize.{name} must be at least 1, got {getattr(self, name)}")
        if self.demos < 0 or self.confirm_tasks < 0:
            raise ConfigError("optimize.demos and optimize.confirm_tasks must be 0 or more")
        if self.budget < self.val_tasks:
            raise ConfigError(f"optimize.budget ({self.budget}) must cover one scoring of the "
                              f"{self.val_tasks} validation tasks; raise it or lower val_tasks")


@dataclass
class OptimizeResult:
    """What one optimisation did and measured."""

    program: PromptProgram
    dream_episodes: int
    synthetic_transitions: int
    real_transitions: int
    scores: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# The program
# --------------------------------------------------------------------------------------------


class StepAgent:
    """An agent whose every step is one call of a DSPy predictor (run in a thread, so DSPy's
    trace, a context variable, follows the call)."""

    def __init__(self, predictor: Any, action_space: str, name: str,
                 history_steps: int = 5) -> None:
        self.predictor = predictor
        self.action_space = action_space
        self.name = name
        self.history_steps = history_steps

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        fields = agent_fields(task, observation, history, self.action_space,
                              self.history_steps)
        call = functools.partial(self.predictor, **fields)
        pred = await in_thread(None, call)
        return Decision(action=str(pred.action or ""), reasoning=str(pred.reasoning or ""))


def episode_feedback(traj: Trajectory, max_steps: int) -> str:
    """What an episode tells the reflection model: the outcome and its invalid actions."""
    steps = len(traj.transitions)
    if traj.success:
        return f"Success: the task was accomplished in {steps} step(s)."
    invalid = [t for t in traj.transitions if not t.valid]
    lines = [f"Failure: the task was not accomplished after {steps} step(s)"
             + (" (the step limit)" if steps >= max_steps else "") + "."]
    if invalid:
        lines.append(f"{len(invalid)} action(s) were refused, e.g. {invalid[0].action!r}: "
                     f"{invalid[0].error}")
    if traj.transitions:
        lines.append("Actions taken: " + "; ".join(t.action for t in traj.transitions[-6:]))
    return "\n".join(lines)


def make_program(template: str, play: Callable[[str, Any], Trajectory], action_space: str,
                 agent_name: str, max_steps: int) -> Any:
    """A DSPy module playing one dream episode per call (``task_id`` → success)."""
    import dspy

    class DreamEpisodes(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = dspy.Predict(agent_signature(template))

        def forward(self, task_id: str) -> Any:
            agent = StepAgent(self.step, action_space, agent_name)
            traj = play(task_id, agent)
            return dspy.Prediction(success=traj.success, reward=traj.reward,
                                   steps=len(traj.transitions),
                                   score=1.0 if traj.success else 0.0,
                                   feedback=episode_feedback(traj, max_steps))

    return DreamEpisodes()




# --------------------------------------------------------------------------------------------
# Worked examples
# --------------------------------------------------------------------------------------------


def demo_examples(demos: list[Trajectory], family: str, seed: int) -> list[Any]:
    """Step examples from the successful episodes of ``demos``: one from each episode, taken
    at a step chosen by ``seed`` (so the examples show different moments of a task)."""
    import random

    import dspy

    rng = random.Random(seed)
    out = []
    for traj in demos:
        steps = [t for t in traj.transitions if t.valid]
        if not traj.success or not steps:
            continue
        t = rng.choice(steps)
        before = traj.transitions[:t.step]
        out.append(dspy.Example(intent=traj.task.intent, history=render_history(before),
                                state=t.state, reasoning=t.reasoning or "", action=t.action,
                                ).with_inputs("intent", "history", "state"))
    if not out:
        raise ConfigError(f"the demonstrations hold no successful {family} episode to take "
                          "worked examples from (or set optimize.demos=0)")
    return out


# --------------------------------------------------------------------------------------------
# Optimisation
# --------------------------------------------------------------------------------------------


def choose_demos(demos: list[Trajectory], family: str, k: int, seed: int) -> list[dict[str, str]]:
    """``k`` worked examples chosen by ``dspy.LabeledFewShot`` from the steps of the
    successful ``demos`` (:func:`demo_examples`); none for ``k`` 0."""
    import dspy

    if not k:
        return []
    holder = dspy.Module()
    holder.step = dspy.Predict("intent, history, state -> reasoning, action")
    chosen = dspy.LabeledFewShot(k=k).compile(holder, trainset=demo_examples(demos, family,
                                                                              seed), sample=True)
    return [_demo_dict(d) for d in chosen.step.demos]


def baseline_program(family: Any, model: str, demos: list[dict[str, str]] | None = None,
                     ) -> PromptProgram:
    """The family's agent template as written (its own instruction), with ``demos``."""
    name = getattr(family, "agent_prompt", "agent.md")
    return PromptProgram(target="agent", family=family.name, template=name,
                         instruction=template_instruction(load_prompt(name)),
                         demos=list(demos or []), model=model)


@dataclass
class SearchResult:
    """What one GEPA search did: the best program and the episodes it played."""

    program: PromptProgram
    episodes: int
    transitions: int
    provenance: str
    scores: dict[str, Any] = field(default_factory=dict)


def search_instruction(
    start: PromptProgram,
    *,
    family: Any,
    gateway: Gateway,
    reflection: Gateway,
    make_env: Callable[[], Environment],
    train: list[Task],
    val: list[Task],
    budget: int,
    max_steps: int,
    minibatch: int,
    seed: int,
    out: Path,
    transition_budget: int | None = None,
) -> SearchResult:
    """``dspy.GEPA`` on ``start``'s instruction (its worked examples kept), every candidate
    scored by the success of whole episodes in the environments ``make_env`` makes (dream
    environments: 0 real transitions; real ones: sim-to-real), at most ``budget`` episodes
    and, when given, ``transition_budget`` steps (an episode that would pass it is not
    started). Every episode is appended to ``out/trajectories.jsonl``, GEPA's log is in
    ``out/gepa``.

    Raises:
        ConfigError: No train or validation tasks.
        DreamGymError: Episodes failed on infrastructure (nothing is kept).
    """
    import dspy

    from dreamgym_agents.rl.grpo import run_async

    if not train or not val:
        raise ConfigError(f"{family.name} needs train and validation tasks to optimise on")
    template = load_prompt(start.template)
    action_space = family.action_set().describe()
    out.mkdir(parents=True, exist_ok=True)
    tasks = {t.task_id: t for t in train + val}
    lock = threading.Lock()
    counter = itertools.count()
    played = {"episodes": 0, "transitions": 0, "provenance": ""}
    failures: list[BaseException] = []
    file = out / "trajectories.jsonl"

    def play(task_id: str, agent: Any) -> Trajectory:
        with lock:
            episode_id = f"opt-{next(counter):05d}-{task_id}"
            if transition_budget is not None and \
                    played["transitions"] + max_steps > transition_budget:
                # out of real steps: scored as a failure, with no step taken
                return Trajectory(episode_id=episode_id, task=tasks[task_id],
                                  termination="budget")
        pool = EnvPool(make_env, 1)
        try:
            [outcome] = run_async(play_episodes([(episode_id, tasks[task_id])], pool, agent,
                                                max_steps=max_steps), 2)
        except Exception as exc:  # DSPy scores a failed example 0 and goes on: keep it
            outcome = exc
        finally:
            pool.close()
        with lock:
            if not isinstance(outcome, Trajectory):
                failures.append(outcome)
                raise outcome
            played["episodes"] += 1
            played["transitions"] += len(outcome.transitions)
            played["provenance"] = outcome.provenance
            append_trajectory(file, outcome)
        return outcome

    student = make_program(template, play, action_space, gateway.cfg.model, max_steps)
    student.step.signature = student.step.signature.with_instructions(start.instruction)
    student.step.demos = [dspy.Example(**d) for d in start.demos]
    trainset = [dspy.Example(task_id=t.task_id).with_inputs("task_id") for t in train]
    valset = [dspy.Example(task_id=t.task_id).with_inputs("task_id") for t in val]
    with dspy.context(lm=dspy_lm(gateway), adapter=agent_adapter(template)):
        compiled, scores = compile_gepa(student, trainset, valset, budget=budget,
                                        reflection=reflection, minibatch=minibatch, seed=seed,
                                        log_dir=str(out / "gepa"))
    if failures:
        # an episode the infrastructure ended is no score of the prompt: nothing is kept
        raise _as_error(failures[0], len(failures))
    program = replace(start, instruction=compiled.step.signature.instructions,
                      model=gateway.cfg.model)
    return SearchResult(program=program, episodes=played["episodes"],
                        transitions=played["transitions"],
                        provenance=played["provenance"], scores=scores)


def evaluate_program(program: PromptProgram | None, gateway: Gateway, family: Any,
                     make_env: Callable[[], Environment], tasks: list[Task], folder: Path, *,
                     max_steps: int, concurrency: int = 1, name: str = "program",
                     on_episode: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """The agent prompted by ``program`` (None: the template as written) on real ``tasks``
    (resumable, in ``folder``); returns the episodes' ``summary.json`` body.

    Raises:
        ConfigError: Episodes failed on infrastructure (rerun to retry them).
    """
    import asyncio

    from dreamgym_agents.episodes.agent import LLMAgent
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes

    template = program.template if program else getattr(family, "agent_prompt", "agent.md")
    agent = LLMAgent(gateway, family.action_set().describe(), prompt=template, program=program)
    run_cfg = RunConfig(out_dir=folder, concurrency=concurrency, max_steps=max_steps,
                        meta={"command": "evaluate-program", "program": name})
    result = asyncio.run(run_episodes(tasks, make_env, agent, run_cfg, on_episode=on_episode))
    if result.failed:
        raise ConfigError(f"{len(result.failed)} real episode(s) of {name} failed (see "
                          f"{folder / 'errors.jsonl'}); rerun the same command to retry them")
    return result.summary


def optimize_agent(
    cfg: OptimizeConfig,
    *,
    family: Any,
    gateway: Gateway,
    reflection: Gateway,
    make_dream_env: Callable[[], Environment],
    make_real_env: Callable[[], Environment] | None,
    demos: list[Trajectory],
    out: Path,
    say: Callable[[str], None] = lambda _: None,
) -> OptimizeResult:
    """Optimise the agent prompt of ``gateway``'s model on ``family`` (see the module doc).

    Args:
        cfg: Budget, task counts and seed.
        family: The task family (its train, validation and test tasks).
        gateway: The agent's model.
        reflection: The model GEPA asks for new instructions (may be the agent's).
        make_dream_env: A new dream environment (the experience model's).
        make_real_env: A new real environment, for the confirmation (None: no confirmation).
        demos: Real demonstrations the worked examples come from.
        out: Output folder: the dream episodes, GEPA's log, the real episodes, the program.
        say: Progress lines.
    """
    from dreamgym_agents.episodes.env import spread_tasks

    chosen = choose_demos(demos, family.name, cfg.demos, cfg.seed)
    if chosen:
        say(f"worked examples: {len(chosen)} chosen by dspy.LabeledFewShot")
    start = baseline_program(family, gateway.cfg.model, chosen)
    say(f"GEPA: {cfg.budget} dream episodes at most, {cfg.train_tasks} train and "
        f"{cfg.val_tasks} validation tasks")
    found = search_instruction(
        start, family=family, gateway=gateway, reflection=reflection, make_env=make_dream_env,
        train=family.load_tasks("train")[:cfg.train_tasks],
        val=family.load_tasks("validation")[:cfg.val_tasks], budget=cfg.budget,
        max_steps=cfg.max_steps, minibatch=cfg.minibatch, seed=cfg.seed, out=out / "dream")
    scores = {f"dream_{k}": v for k, v in found.scores.items()}
    real = 0
    if make_real_env is not None and cfg.confirm_tasks:
        tests = spread_tasks(family.load_tasks("test"), cfg.confirm_tasks)
        for label, prog in (("before", None), ("after", found.program)):
            summary = evaluate_program(prog, gateway, family, make_real_env, tests,
                                       out / f"real-{label}", max_steps=cfg.max_steps,
                                       name=label)
            scores[f"real_test_{label}"] = summary["success_rate"]
            real += summary["real_transitions"]
            say(f"real test tasks, {label}: {summary['successes']}/{summary['episodes']} "
                "succeeded")
    program = replace(found.program, scores=scores,
                      optimizer={"name": "dspy.LabeledFewShot + dspy.GEPA", **asdict(cfg)})
    return OptimizeResult(program=program, dream_episodes=found.episodes,
                          synthetic_transitions=found.transitions, real_transitions=real,
                          scores=scores)


def _as_error(first: BaseException, count: int) -> BaseException:
    from dreamgym_agents.errors import DreamGymError

    if isinstance(first, DreamGymError):
        first.args = (f"{count} dream episode(s) failed, the first: {first}",)
        return first
    return RuntimeError(f"{count} dream episode(s) failed, the first: {first!r}")


def _demo_dict(example: Any) -> dict[str, str]:
    return {k: str(example.get(k) or "") for k in ("intent", "history", "state", "reasoning",
                                                   "action")}
