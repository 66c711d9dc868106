"""SFT examples for the experience model (paper Eq. 5): inputs → reasoning, next state, outcome.

Each recorded transition becomes one (prompt, completion) pair. The prompt is the compact
experience prompt: task, last-H history, top-k demonstrations retrieved from the buffer (never
from the transition's own episode), current page and action. The completion is the rationale,
then the next state written as the family's experience codec writes it (the web codec: its
shortest faithful form, full or a reference plus edits), then reward, done and success. Prompt
and answer come from the same codec the model is prompted with at inference
(:mod:`dreamgym_agents.experience.codec`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from dreamgym_agents.experience.annotate import DETERMINISTIC
from dreamgym_agents.experience.codec import ExperienceCodec
from dreamgym_agents.experience.model import retrieve_demos
from dreamgym_agents.types import Trajectory, Transition

UNPARSEABLE_PREFIX = "invalid action:"


class Retriever(Protocol):
    def retrieve(self, state: str, action: str, *, k: int | None = None,
                 where: dict | None = None,
                 exclude_episode: str | None = None) -> list[Transition]: ...


@dataclass
class ExampleConfig:
    """What the examples show (the ablation flags must match the model's inference settings).

    Attributes:
        top_k: Demonstrations per example.
        history_steps: Previous steps shown.
        use_history: Show history (False: the no-history ablation).
        use_retrieval: Show demonstrations (False: the no-retrieval ablation).
        use_reasoning: Train the rationale before the prediction (False: empty reasoning).
        max_examples: Cap on the number of examples (sampled, successes and final steps kept
            first); None keeps all.
        seed: Sampling seed.
        exclude_same_task: Retrieve demonstrations from *other* tasks only, as a held-out task
            sees them (otherwise the model learns to copy a demo of the very same task, which
            no new task has).
        final_answer_repeat: Times each final-answer example is included: the whole judgement
            of an answer is a few tokens of a long completion, and rarer than page changes.
        judge_repeat: Short copies of each final-answer example added for its verdict alone,
            the loss on the verdict and the outcome only (``"loss": "decisions"``). Their
            prompt has no demonstrations, a fraction of the tokens, but keeps the task,
            history, page, action, the answer's evidence, the retrieved tally and the checks.
            A small model learns to read a verdict off the checks line from many cheap
            examples, then does so in full prompts, where the checks and the tally are the
            last lines too (evidence: docs/history/results-2026-11-to-12.md).
        contrast_repeat: Times an example is included when its reward differs from that of
            most of its retrieved demonstrations: there the answer cannot be copied from the
            demonstrations, and such steps are few. In ALFWorld, a wrong object moved into the
            goal's receptacle is retrieved next to the expert's rewarded moves into it, and a
            model that copies them rewards it.
    """

    top_k: int = 3
    history_steps: int = 2
    use_history: bool = True
    use_retrieval: bool = True
    use_reasoning: bool = True
    max_examples: int | None = None
    seed: int = 0
    exclude_same_task: bool = True
    final_answer_repeat: int = 1
    judge_repeat: int = 0
    contrast_repeat: int = 1


def completion_text(t: Transition, demos: list[Transition], codec: ExperienceCodec, *,
                    use_reasoning: bool, previous: str | None = None, intent: str = "") -> str:
    """The target answer for one transition.

    ``previous`` is the state going back returns to, when the model sees the history;
    ``intent`` is the task.
    """
    pages = codec.demo_pages(demos, t.state, t.action)
    next_state = codec.encode_state(t.next_state, t.state, pages, previous, t.action)
    rationale = t.info.get("em_rationale")
    if not rationale or t.info.get("em_rationale_source", DETERMINISTIC) == DETERMINISTIC:
        # derived, it says which of the shown states the next one follows
        rationale = codec.rationale(t, intent, written_as=next_state.splitlines()[0],
                                    pages=pages)
    # The outcome comes right after the reasoning that decides it, before the page (a small
    # model otherwise writes it after hundreds of page tokens, detached from its own reasoning).
    return (
        f"<reasoning>{rationale if use_reasoning else ''}</reasoning>\n"
        f"<reward>{int(t.reward >= 1)}</reward>\n<done>{str(t.terminated).lower()}</done>\n"
        f"<success>{str(t.success).lower()}</success>\n"
        f"<next_state>\n{next_state}\n</next_state>"
    )


_REASONING_END = "</reasoning>"
_OUTCOME_START, _OUTCOME_END = "<reward>", "</success>"
_STATE_START = "<next_state>\n"


def decision_spans(completion: str, codec: ExperienceCodec, *,
                   next_state: bool = True) -> list[tuple[int, int]]:
    """Character spans of a completion where its decisions are written: the reasoning's
    verdict (a derived rationale's outcome sentence, one of the ``codec``'s verdicts, else its
    last sentence) and, for a step that is not an answer, its opening words saying which state
    follows (one of the codec's ``follows``), the outcome
    block (reward, done, success) and the first line of the next state (which page, or which
    reference, it is), with the line after a reference (its first edit, or the block's end when
    the page is the reference unchanged); the page is left out with ``next_state=False``.

    Those few tokens decide what the dream does; the rest of a completion (page lines, edits) is
    long and mostly copied. :class:`~dreamgym_agents.experience.sft.ExperienceSFTConfig`
    ``decision_weight`` weighs these spans' tokens more in the loss.
    """
    spans: list[tuple[int, int]] = []
    end = completion.find(_REASONING_END)
    opening = completion.find(">") + 1
    if 0 < opening <= end:
        verdicts = [(completion.find(v, opening, end), len(v)) for v in codec.verdicts]
        found = [(at, n) for at, n in verdicts if at >= 0]
        if found:
            at, n = min(found)
            spans.append((at, at + n))
            # a derived rationale of another step opens with which state follows
            led = [completion.find(p, opening, end) for p in codec.follows]
            lead = min((x for x in led if x >= 0), default=-1)
            if lead == opening:
                stop = min(x for x in (completion.find(":", lead, end),
                                       completion.find(".", lead, end), end) if x >= 0)
                spans.append((lead, stop))
        else:  # a teacher's rationale: its last sentence concludes
            body = completion[:end].rstrip()
            cut = body.rstrip(".").rfind(". ")
            spans.append((cut + 2 if cut >= opening else opening, end))
    start, stop = completion.find(_OUTCOME_START), completion.find(_OUTCOME_END)
    if start >= 0 and stop > start:
        spans.append((start, stop + len(_OUTCOME_END)))
    at = completion.find(_STATE_START) if next_state else -1
    if at >= 0:
        first = at + len(_STATE_START)
        line_end = completion.find("\n", first)
        end = line_end if line_end > first else len(completion)
        if completion.startswith("@", first) and line_end > first:
            # A reference: whether and how the page changes is the next line, its first edit
            # or the block's end; trained without it, a model writes a fill's page as '@state'
            # and stops there, the typed value lost.
            after = completion.find("\n", line_end + 1)
            end = after if after > line_end else len(completion)
        spans.append((first, end))
    return [(a, b) for a, b in spans if b > a]


def contrasts(t: Transition, demos: list[Transition]) -> bool:
    """Whether ``t``'s reward differs from that of most of its ``demos`` (none: no)."""
    if not demos:
        return False
    rewarded = sum(d.reward >= 1 for d in demos)
    return (t.reward >= 1) != (rewarded * 2 > len(demos))


def trainable(t: Transition) -> bool:
    """Steps the experience model should learn from: everything but unparseable actions
    (the dream handles those without the model) and experience-model failures."""
    return not t.error.startswith(UNPARSEABLE_PREFIX) and not t.info.get("em_failure")


def build_examples(
    trajectories: Iterable[Trajectory], retriever: Retriever | None, cfg: ExampleConfig,
    codec: ExperienceCodec, *, where: dict | None = None,
) -> list[dict[str, Any]]:
    """One chat example per trainable transition: ``{"messages", "completion", "meta",
    "decision_spans"}`` (see :func:`decision_spans`), in the family's ``codec``.

    Steps before a trajectory's ``info["train_from_step"]`` are history only: counterfactual
    variants repeat their source episode's steps
    (:mod:`dreamgym_agents.adapters.webarena.counterfactual`). A variant's demonstrations never
    come from the episode it was made from (``info["counterfactual_of"]`` or
    ``info["renamed_from"]``).
    """
    steps: list[tuple[Trajectory, int]] = [
        (traj, i) for traj in trajectories for i, t in enumerate(traj.transitions)
        if trainable(t) and i >= int(traj.info.get("train_from_step", 0))
    ]
    if cfg.max_examples is not None and len(steps) > cfg.max_examples:
        rng = random.Random(cfg.seed)
        key = [(0 if traj.transitions[i].terminated else 1, rng.random()) for traj, i in steps]
        order = sorted(range(len(steps)), key=key.__getitem__)
        steps = [steps[j] for j in sorted(order[: cfg.max_examples])]
    examples = []
    generic, episode = codec, None
    for traj, i in steps:
        t = traj.transitions[i]
        if traj.episode_id != episode:  # the codec of the episode's task (its world bound in)
            episode, codec = traj.episode_id, generic.for_task(traj.task)
        demos: list[Transition] = []
        if cfg.use_retrieval and retriever is not None:
            scope = where
            if cfg.exclude_same_task and traj.task.task_id:
                scope = {**(where or {}), "task_id": {"$ne": traj.task.task_id}}
            source = str(traj.info.get("counterfactual_of") or traj.info.get("renamed_from")
                         or traj.episode_id)
            demos = retrieve_demos(retriever, codec, traj.task.intent, t.state, t.action,
                                   k=cfg.top_k, where=scope, exclude_episode=source,
                                   params=traj.task.params)
        messages = codec.render(
            traj.task.intent,
            traj.transitions[:i] if cfg.use_history else None,
            t.state, t.action,
            demos if cfg.use_retrieval else None,
            history_steps=cfg.history_steps, use_reasoning=cfg.use_reasoning,
            params=traj.task.params,
        )
        completion = completion_text(
            t, demos, codec, use_reasoning=cfg.use_reasoning,
            previous=codec.back_page(traj.transitions[:i]) if cfg.use_history else None,
            intent=traj.task.intent)
        example = {
            "messages": messages,
            "completion": completion,
            "decision_spans": decision_spans(completion, codec),
            "meta": {"episode_id": traj.episode_id, "step": t.step},
        }
        final = codec.answer_text(t.action) is not None
        repeat = cfg.final_answer_repeat if final else 1
        if cfg.contrast_repeat > 1 and contrasts(t, demos):
            repeat = max(repeat, cfg.contrast_repeat)
            example["meta"]["contrast"] = True
        examples.extend(dict(example) for _ in range(max(1, repeat)))
        if final and cfg.judge_repeat > 0:
            judge = {
                "messages": codec.render(
                    traj.task.intent, traj.transitions[:i] if cfg.use_history else None,
                    t.state, t.action, None, history_steps=cfg.history_steps,
                    use_reasoning=cfg.use_reasoning, params=traj.task.params,
                    tally=getattr(demos, "tally", None)),
                "completion": completion,
                # the verdict and the outcome; the page written after them is not trained here
                "decision_spans": decision_spans(completion, codec, next_state=False),
                "loss": "decisions",
                "meta": {**example["meta"], "judge": True},
            }
            examples.extend(dict(judge) for _ in range(cfg.judge_repeat))
    return examples
