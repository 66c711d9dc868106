"""Prompt learning for a hosted experience model: ``dspy.GEPA`` rewrites the instruction of the
full experience prompt, every candidate scored by fidelity on held-out real transitions.

The program (:func:`make_program`) predicts one recorded step per example through the
experience model's own prediction path (:meth:`ExperienceModel.predict`: its retrieval, prompt
layout, parser and retries), with the candidate's instruction; the call is entered in DSPy's
trace as its ``step`` predictor's, so GEPA reflects on the step's inputs, the prediction and a
feedback that shows the real outcome. The score of a step: reward right (1/4), done right
(1/4) and the next state's line F1 against the real one (1/2); an unreadable answer scores 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.experience.fidelity import state_f1
from dreamgym_agents.experience.model import build_signature, clip_state, load_template
from dreamgym_agents.optimize.dspy_bridge import compile_gepa, index_examples
from dreamgym_agents.prompts.programs import PromptProgram
from dreamgym_agents.types import Task, Trajectory, Transition

if TYPE_CHECKING:
    from dreamgym_agents.experience.model import ExperienceModel
    from dreamgym_agents.gateway.llm import Gateway

FEEDBACK_LINES = 12
"""Lines of the real next state shown to the reflection model."""


@dataclass
class RecordedStep:
    """One real transition and what the experience model sees before it."""

    task: Task
    history: list[Transition]
    transition: Transition
    episode_id: str


def recorded_steps(trajectories: list[Trajectory], limit: int, seed: int) -> list[RecordedStep]:
    """Up to ``limit`` valid real steps of ``trajectories``, drawn by ``seed`` across episodes."""
    steps = [RecordedStep(traj.task, traj.transitions[:i], t, traj.episode_id)
             for traj in trajectories for i, t in enumerate(traj.transitions) if t.valid]
    random.Random(seed).shuffle(steps)
    return steps[:limit]


def step_score(pred: Any, real: Transition, strip_ids: Any = None) -> tuple[float, str]:
    """(score, feedback) of a prediction of the real step ``real``."""
    if pred.failure:
        return 0.0, f"The answer could not be read: {pred.failure}"
    reward_ok = (float(pred.reward) > 0) == (real.reward > 0)
    done_ok = bool(pred.done) == bool(real.terminated)
    f1 = state_f1(pred.next_state, real.next_state, strip_ids=strip_ids)
    score = 0.25 * reward_ok + 0.25 * done_ok + 0.5 * f1
    lines = [f"Score {score:.2f}: reward {'right' if reward_ok else 'wrong'} (real "
             f"{real.reward:g}), done {'right' if done_ok else 'wrong'} (real "
             f"{str(real.terminated).lower()}), next state line F1 {f1:.2f}."]
    if f1 < 1:
        lines.append("The real next state was:\n" + clip_state(real.next_state, FEEDBACK_LINES))
    return score, "\n".join(lines)


def make_program(model: ExperienceModel, steps: list[RecordedStep],
                 strip_ids: Any = None) -> Any:
    """A DSPy module predicting recorded step ``index`` through ``model``'s own path."""
    import dspy

    class ExperienceSteps(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = dspy.Predict(build_signature(model.codec.prompt_file))

        def forward(self, index: int) -> Any:
            s = steps[index]
            t = s.transition
            pred = model.predict(s.task, s.history, t.state, t.action,
                                 exclude_episode=s.episode_id,
                                 instruction=self.step.signature.instructions)
            out = pred.output
            fields = ({"reasoning": out.reasoning, "next_state": out.next_state,
                       "reward": out.reward, "done": out.done, "success": out.success}
                      if out is not None else {"reasoning": "", "next_state": "", "reward": 0.0,
                                               "done": False, "success": False})
            trace = dspy.settings.trace
            if trace is not None:  # the call is this predictor's, for GEPA's reflection
                inputs = {"task": s.task.intent, "history": f"({len(s.history)} step(s))",
                          "retrieved": f"({len(pred.demos)} real transition(s))",
                          "state": clip_state(t.state, FEEDBACK_LINES), "action": t.action}
                trace.append((self.step, inputs, dspy.Prediction(**fields)))
            result = dspy.Prediction(**fields, failure=pred.failure)
            score, feedback = step_score(result, t, strip_ids)
            result.score, result.feedback = score, feedback
            return result

    return ExperienceSteps()




def optimize_experience(
    model: ExperienceModel,
    *,
    reflection: Gateway,
    held_out: list[Trajectory],
    confirm: list[Trajectory],
    budget: int,
    train_steps: int,
    val_steps: int,
    minibatch: int,
    seed: int,
    out: Path,
    family: str,
    strip_ids: Any = None,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[PromptProgram, dict[str, Any]]:
    """GEPA on the full experience prompt's instruction (see the module doc).

    Args:
        model: The experience model (full prompt style), its gateway and buffer.
        reflection: The model GEPA asks for new instructions.
        held_out: Real episodes the train and validation steps come from (validation tasks).
        confirm: Real episodes of test tasks, each step scored before and after (may be empty).
        budget: Step predictions GEPA may make (its ``max_metric_calls``).
        train_steps: Steps feeding the reflection.
        val_steps: Steps scoring each candidate.
        minibatch: Steps per reflective minibatch.
        seed: Seed of the step draw and of GEPA.
        out: GEPA's log folder.
        family: The task family (recorded in the program).
        strip_ids: The family's id stripper for the state F1 (``StateFormat.strip_ids``).
        say: Progress lines.

    Returns:
        The program and its scores (mean step score on validation before and after, and on the
        confirmation steps before and after).
    """

    if model.cfg.prompt_style != "full":
        raise ConfigError("--target experience optimises the full prompt's instruction: set "
                          "experience.prompt_style=full (the compact prompt has none)")
    steps = recorded_steps(held_out, train_steps + val_steps, seed)
    if len(steps) < 2:
        raise ConfigError(f"{len(steps)} held-out real step(s): need at least 2 to optimise on")
    trainset, valset = index_examples(len(steps), train_steps)
    say(f"GEPA on the experience prompt: {budget} predictions at most, {len(trainset)} train "
        f"and {len(valset)} validation steps of {len(held_out)} real episodes")
    student = make_program(model, steps, strip_ids)
    student.step.signature = student.step.signature.with_instructions(model.instruction)
    compiled, scores = compile_gepa(student, trainset, valset, budget=budget,
                                    reflection=reflection, minibatch=minibatch, seed=seed,
                                    log_dir=str(out / "gepa"))
    instruction = compiled.step.signature.instructions
    checks = recorded_steps(confirm, 10**9, seed)
    if checks:
        for label, text in (("before", model.instruction), ("after", instruction)):
            program = make_program(model, checks, strip_ids)
            program.step.signature = program.step.signature.with_instructions(text)
            mean = sum(program(index=i).score for i in range(len(checks))) / len(checks)
            scores[f"test_{label}"] = round(mean, 4)
        scores["test_steps"] = len(checks)
    template = model.codec.prompt_file
    program = PromptProgram(target="experience", family=family, template=template,
                            instruction=instruction, model=model.gateway.cfg.model,
                            scores=scores)
    return replace(program, optimizer={"name": "dspy.GEPA", "budget": budget,
                                       "train_steps": len(trainset),
                                       "val_steps": len(valset), "seed": seed,
                                       "template_instruction": load_template(template)[
                                           "instruction"] == model.instruction}), scores
