"""Prompt learning for the curriculum's LLM task generator: ``dspy.GEPA`` rewrites the
instruction of ``prompts/task_generator.md``, every candidate scored by the share of its
proposed variants the curriculum accepts by the same rules as in training: well formed, new,
not a validation or test task, and feasible by the family's check.

The program (:func:`make_program`) asks the generator for variants of one train seed per
example through its own prompt and parser (:class:`~dreamgym_agents.rl.curriculum.
LLMTaskGenerator`), with the candidate's instruction; the call is entered in DSPy's trace as its
``step`` predictor's, and the feedback names each rejected variant's reason.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.optimize.dspy_bridge import compile_gepa, index_examples
from dreamgym_agents.prompts.programs import PromptProgram
from dreamgym_agents.rl.curriculum import PROMPT_FILE, split_generator_template

if TYPE_CHECKING:
    from dreamgym_agents.gateway.llm import Gateway
    from dreamgym_agents.rl.curriculum import Curriculum, LLMTaskGenerator
    from dreamgym_agents.types import Task


def signature(instruction: str) -> type:
    """The DSPy signature of one proposal (its docstring: ``instruction``)."""
    import dspy

    class ProposeVariants(dspy.Signature):
        __doc__ = instruction

        seed_task: str = dspy.InputField(desc="the task the agent solves only sometimes")
        template: str = dspy.InputField(desc="its template and parameters")
        answer: str = dspy.OutputField(desc="JSON with the candidates and the choice")

    return ProposeVariants


def make_program(generator: LLMTaskGenerator, curriculum: Curriculum, seeds: list[Task],
                 n: int, instruction: str) -> Any:
    """A DSPy module asking ``generator`` for ``n`` variants of seed ``index``."""
    import dspy

    class TaskVariants(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = dspy.Predict(signature(instruction))

        def forward(self, index: int) -> Any:
            seed = seeds[index]
            candidates, _ = generator.generate(seed, n, self.step.signature.instructions)
            reasons = collections.Counter()
            accepted = 0
            for raw in candidates:
                task, why = curriculum.check(seed, raw)
                accepted += task is not None
                if task is None:
                    reasons[why] += 1
            answer = str(candidates)[:2000]
            trace = dspy.settings.trace
            if trace is not None:  # the call is this predictor's, for GEPA's reflection
                inputs = {"seed_task": seed.intent,
                          "template": seed.template}
                trace.append((self.step, inputs, dspy.Prediction(answer=answer)))
            score = accepted / max(1, len(candidates))
            lines = [f"{accepted} of {len(candidates)} proposed variant(s) accepted."]
            lines += [f"{count} rejected: {why}" for why, count in reasons.most_common()]
            return dspy.Prediction(answer=answer, score=score, feedback="\n".join(lines))

    return TaskVariants()




def optimize_task_generator(
    generator: LLMTaskGenerator,
    curriculum: Curriculum,
    *,
    reflection: Gateway,
    seeds: list[Task],
    candidates: int,
    budget: int,
    train_seeds: int,
    minibatch: int,
    seed: int,
    out: Path,
    family: str,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[PromptProgram, dict[str, Any]]:
    """GEPA on the task generator's instruction (see the module doc): the first
    ``train_seeds`` of ``seeds`` feed the reflection, the others score each candidate; the
    scores are shares of accepted variants."""

    if len(seeds) < 2:
        raise ConfigError(f"{len(seeds)} seed task(s): need at least 2 to optimise on")
    head, _ = split_generator_template(generator.template)
    baseline = (generator.instruction or head.format(n=candidates)).strip()
    trainset, valset = index_examples(len(seeds), train_seeds)
    say(f"GEPA on the task generator's prompt: {budget} proposals at most, {len(trainset)} "
        f"train and {len(valset)} validation seeds")
    student = make_program(generator, curriculum, seeds, candidates, baseline)
    compiled, scores = compile_gepa(student, trainset, valset, budget=budget,
                                    reflection=reflection, minibatch=minibatch, seed=seed,
                                    log_dir=str(out / "gepa"))
    program = PromptProgram(
        target="task-generator", family=family, template=PROMPT_FILE,
        instruction=compiled.step.signature.instructions, model=generator.gateway.cfg.model,
        optimizer={"name": "dspy.GEPA", "budget": budget, "train_seeds": len(trainset),
                   "val_seeds": len(valset), "variants_per_seed": candidates, "seed": seed},
        scores=scores)
    return program, scores
