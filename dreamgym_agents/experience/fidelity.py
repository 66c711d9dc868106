"""Fidelity of the experience model: how closely the dream follows the real environment.

Two kinds of measures (DreamGym, Sec. 5 and App.):

- **Against real transitions** (teacher forcing, see
  :meth:`~dreamgym_agents.experience.model.ExperienceModel.predict_trajectory`): reward, done
  and success accuracy, and :func:`state_f1`, an element-line F1 between the predicted and the
  real next state.
- **Judged** (no reference): an LLM judge scores sampled synthetic trajectories 0/1/2 on causal
  consistency, diversity, informativeness and hallucination (:func:`judge_trajectories`).

Everything here is a pure function except :func:`judge_trajectories`, which calls the given model.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from dreamgym_agents.episodes.env import normalize_text
from dreamgym_agents.experience.model import ChatModel, ExperiencePrediction, clip_state
from dreamgym_agents.types import Trajectory, Transition

logger = logging.getLogger(__name__)

RUBRIC = ("causal_consistency", "diversity", "informativeness", "hallucination")
"""The judge's criteria, each scored 0, 1 or 2 (higher is better for all four)."""

_JUDGE_INSTRUCTION = """\
You judge synthetic experience: a trajectory an agent played in a simulated environment (a
website, a text game, …), where a model predicted each next state from the previous state and the
agent's action. Score it on four criteria, each 0, 1 or 2:

- causal_consistency: each next state is a plausible consequence of the action in the previous
  state (2 = always, 1 = mostly, 0 = often not).
- diversity: the states are varied and the trajectory explores rather than repeating the same
  state (2 = varied, 1 = somewhat repetitive, 0 = the same state over and over).
- informativeness: the states hold the concrete content (items, values, fields, results) the
  task needs (2 = rich and relevant, 1 = partial, 0 = empty or generic).
- hallucination: the states stay realistic for the environment and consistent with each other
  (2 = no hallucination, 1 = minor invented or contradictory content, 0 = severe).

Answer with a short justification, then exactly:
<causal_consistency>0|1|2</causal_consistency>
<diversity>0|1|2</diversity>
<informativeness>0|1|2</informativeness>
<hallucination>0|1|2</hallucination>"""


StripIds = Callable[[str], str]
"""A state line without the ids a model cannot know (the family's ``StateFormat.strip_ids``:
a web element's ``[bid]``)."""


def _lines(state: str, strip_ids: StripIds | None) -> Counter[str]:
    lines = (normalize_text(s) for s in state.splitlines())
    if strip_ids is not None:
        lines = (strip_ids(s) for s in lines)
    return Counter(s for s in lines if s)


def state_f1(predicted: str, real: str, *, strip_ids: StripIds | None = None) -> float:
    """Line F1 between two rendered states.

    Each state is a multiset of its non-blank lines, whitespace-normalised (every line
    included, a web page's ``URL:`` and ``Title:`` too); precision and recall count the lines
    the two share. Two empty states score 1.0, one empty state 0.0.

    Args:
        predicted: The predicted state.
        real: The real state.
        strip_ids: Applied to every line first (None: lines compared as they are).
    """
    pred, ref = _lines(predicted, strip_ids), _lines(real, strip_ids)
    if not pred and not ref:
        return 1.0
    overlap = sum((pred & ref).values())
    return 2.0 * overlap / (sum(pred.values()) + sum(ref.values()))


def binary_scores(truth: Sequence[bool], predicted: Sequence[bool | None]) -> dict[str, Any]:
    """Accuracy, balanced accuracy (the mean of the two classes' recalls: 0.5 for any constant
    guess) and F1 of the positive class; a None prediction (an experience-model failure) counts
    as wrong. None for a score with no case to compute it on."""
    pairs = list(zip(truth, predicted, strict=True))
    right = [p is not None and p == t for t, p in pairs]
    pos = [r for (t, _), r in zip(pairs, right, strict=True) if t]
    neg = [r for (t, _), r in zip(pairs, right, strict=True) if not t]
    recalls = [sum(x) / len(x) for x in (pos, neg) if x]
    tp = sum(pos)
    said_pos = sum(p is True for _, p in pairs)
    precision = tp / said_pos if said_pos else 0.0
    recall = tp / len(pos) if pos else 0.0
    return {"accuracy": round(sum(right) / len(right), 4) if right else None,
            "balanced_accuracy": round(sum(recalls) / len(recalls), 4) if recalls else None,
            "f1": round(2 * precision * recall / (precision + recall), 4)
            if precision + recall else (None if not pos else 0.0),
            "positives": len(pos), "n": len(pairs)}


def state_exact(predicted: str, real: str, *, strip_ids: StripIds | None = None) -> bool:
    """Whether two states hold the same lines in the same order (whitespace-normalised, blank
    lines dropped, ``strip_ids`` applied)."""
    def lines(state: str) -> list[str]:
        out = (normalize_text(s) for s in state.splitlines())
        return [s for s in (strip_ids(x) if strip_ids else x for x in out) if s]

    return lines(predicted) == lines(real)


def transition_metrics(
    pairs: Sequence[tuple[Transition, ExperiencePrediction]], *,
    strip_ids: StripIds | None = None, is_terminal: Callable[[str], bool] | None = None,
    reveals: Callable[[str, str], bool] | None = None,
) -> dict[str, Any]:
    """Fidelity of predictions against the real transitions they predict.

    Choice: the headline metrics average over **all** ``n`` pairs, an experience-model failure
    counting as wrong for the accuracies and 0 for ``state_f1`` (a model must not look better by
    failing on hard steps). The same metrics over the readable predictions only carry an ``_ok``
    suffix. ``em_failure_rate`` is the share of failures. Rewards match when they differ by less
    than 1e-6. ``done`` is compared with the real step's *termination*: a step cut by the
    episode's step limit was not ended by the environment, and the dream applies its own limit.
    With no pairs every metric is 0.0 and ``n`` is 0.

    The steps that ended their episode (the real step *terminated*: a final answer) decide every
    episode's outcome, and are few among the navigation steps, so they are reported apart:
    ``final_success_recall`` is the share of real successful final steps predicted successful
    (the dream lets right answers succeed), ``final_failure_recall`` the share of real failed
    final steps predicted unsuccessful (it does not reward wrong ones); None without such steps;
    a failure counts as wrong.

    Accuracy flatters a model on rare classes (always predicting reward 0 scores high where
    few steps are rewarded), so reward (positive: 1) and done (positive: the environment ended
    the episode) are also scored as balanced accuracy and F1, next to trivial baselines in
    ``baselines``: reward always 0; done read off the action's type alone by ``is_terminal``
    (None when not given), e.g. :func:`~dreamgym_agents.episodes.env.ends_by_type` of the
    family's action set, where an answer ends an episode and nothing else does; and for the
    next state, copying the current state (its state F1 and exact match against the real next
    state). ``state_exact`` is the share of next states predicted exactly (:func:`state_exact`).
    ``reveals`` is the family's ``StateFormat.reveals(state, next_state)``: whether the real
    next state shows what the state could not say, which no model can know (a receptacle's
    contents seen for the first time). With it, ``state_exact_determined`` is the share over
    the other transitions (``n_determined`` of them; a failure counts as wrong) and
    ``state_exact_revealing`` over those (``n_revealing``); absent without ``reveals``.

    Returns:
        ``reward_accuracy``, ``done_accuracy``, ``success_accuracy``, ``state_f1``,
        ``state_exact``,
        ``em_failure_rate``, ``n``, ``n_ok``, ``reward_accuracy_ok`` … ``state_f1_ok``,
        ``final_success_recall``, ``final_failure_recall``, ``n_final_success``,
        ``n_final_failure``, ``reward_balanced_accuracy``, ``reward_f1``,
        ``done_balanced_accuracy``, ``done_f1``, ``baselines`` and, with ``reveals``,
        ``state_exact_determined``, ``n_determined``, ``state_exact_revealing``,
        ``n_revealing``.
    """
    names = ("reward_accuracy", "done_accuracy", "success_accuracy", "state_f1", "state_exact")
    sums = dict.fromkeys(names, 0.0)
    n_ok = 0
    finals = {True: [0, 0], False: [0, 0]}  # real outcome → [steps, predicted alike]
    exact_by = {False: [0, 0], True: [0, 0]}  # reveals → [transitions, predicted exactly]
    for real, prediction in pairs:
        out = prediction.output
        group = exact_by[bool(reveals(real.state, real.next_state))] if reveals else None
        if group is not None:
            group[0] += 1
        if real.terminated:
            finals[real.success][0] += 1
            finals[real.success][1] += out is not None and out.success == real.success
        if out is None:
            continue
        n_ok += 1
        sums["reward_accuracy"] += abs(out.reward - real.reward) < 1e-6
        sums["done_accuracy"] += out.done == real.terminated
        sums["success_accuracy"] += out.success == real.success
        sums["state_f1"] += state_f1(out.next_state, real.next_state, strip_ids=strip_ids)
        exact = state_exact(out.next_state, real.next_state, strip_ids=strip_ids)
        sums["state_exact"] += exact
        if group is not None:
            group[1] += exact
    n = len(pairs)
    metrics: dict[str, float] = {name: sums[name] / n if n else 0.0 for name in names}
    metrics.update({f"{name}_ok": sums[name] / n_ok if n_ok else 0.0 for name in names})
    metrics["em_failure_rate"] = (n - n_ok) / n if n else 0.0
    metrics["n"] = n
    metrics["n_ok"] = n_ok
    for outcome, name in ((True, "success"), (False, "failure")):
        total, alike = finals[outcome]
        metrics[f"final_{name}_recall"] = alike / total if total else None
        metrics[f"n_final_{name}"] = total
    reward_truth = [real.reward > 0.5 for real, _ in pairs]
    done_truth = [real.terminated for real, _ in pairs]
    reward = binary_scores(reward_truth, [None if p.output is None else p.output.reward > 0.5
                                          for _, p in pairs])
    done = binary_scores(done_truth, [None if p.output is None else bool(p.output.done)
                                      for _, p in pairs])
    metrics.update({"reward_balanced_accuracy": reward["balanced_accuracy"],
                    "reward_f1": reward["f1"], "done_balanced_accuracy": done["balanced_accuracy"],
                    "done_f1": done["f1"]})
    copies = [state_f1(real.state, real.next_state, strip_ids=strip_ids) for real, _ in pairs]
    same = [state_exact(real.state, real.next_state, strip_ids=strip_ids) for real, _ in pairs]
    if reveals is not None:
        for flag, name in ((False, "determined"), (True, "revealing")):
            total, alike = exact_by[flag]
            metrics[f"state_exact_{name}"] = alike / total if total else None
            metrics[f"n_{name}"] = total
    metrics["baselines"] = {
        "reward_always_0": binary_scores(reward_truth, [False] * n),
        "done_from_action_type": None if is_terminal is None else binary_scores(
            done_truth, [is_terminal(real.action) for real, _ in pairs]),
        "state_f1_copy_current_page": round(sum(copies) / n, 4) if n else 0.0,
        "state_exact_copy_current_page": round(sum(same) / n, 4) if n else 0.0,
    }
    return metrics


StateCheck = Callable[[Any, str], "bool | None"]
"""A family's check of whether a state satisfies a task (``TaskFamily.state_success``)."""


def reward_check(trajectories: Sequence[Trajectory], check: StateCheck | None,
                 ) -> dict[str, int] | None:
    """The dream's rewards against the family's own check of each predicted state: how many of
    the rewarded steps reach a state that does not satisfy the task (``rewarded_unmet``: the
    experience model rewarded what the game would not) and how many unrewarded ones do
    (``met_unrewarded``). Invalid and failed steps are left out; None without a check."""
    if check is None:
        return None
    out = {"checked": 0, "rewarded": 0, "rewarded_unmet": 0, "met_unrewarded": 0}
    for traj in trajectories:
        for t in traj.transitions:
            if not t.valid or t.info.get("em_failure"):
                continue
            met = check(traj.task, t.next_state)
            if met is None:
                continue
            rewarded = t.reward > 0
            out["checked"] += 1
            out["rewarded"] += rewarded
            out["rewarded_unmet"] += rewarded and not met
            out["met_unrewarded"] += met and not rewarded
    return out


def episode_success_rate(trajectories: Sequence[Trajectory]) -> float:
    """Share of successful episodes (0.0 for none)."""
    return sum(t.success for t in trajectories) / len(trajectories) if trajectories else 0.0


def rubric_prompt(trajectory: Trajectory, *, max_state_lines: int = 40) -> list[dict[str, str]]:
    """The judge's messages for one (synthetic) trajectory.

    Args:
        trajectory: The episode to judge.
        max_state_lines: Lines of each state shown.
    """
    steps = []
    first = trajectory.transitions[0].state if trajectory.transitions else ""
    steps.append(f"## Initial state\n{clip_state(first, max_state_lines)}")
    for t in trajectory.transitions:
        outcome = f"reward {t.reward:g}, done {str(t.done).lower()}"
        if not t.valid:
            outcome += f", invalid action: {t.error}"
        steps.append(
            f"## Step {t.step + 1}\nAction: {t.action}\nResult ({outcome}):\n"
            f"{clip_state(t.next_state, max_state_lines)}"
        )
    user = f"# Task\n{trajectory.task.intent}\n\n" + "\n\n".join(steps)
    return [{"role": "system", "content": _JUDGE_INSTRUCTION},
            {"role": "user", "content": user}]


class RubricParseError(ValueError):
    """The judge's answer lacks a score or has one outside 0/1/2."""


def parse_rubric(text: str) -> dict[str, int]:
    """Read the four scores ``<criterion>0|1|2</criterion>`` of a judge's answer.

    Raises:
        RubricParseError: A criterion is missing or not 0, 1 or 2 (names them).
    """
    scores: dict[str, int] = {}
    problems = []
    for name in RUBRIC:
        match = re.search(rf"<\s*{name}\s*>\s*([^<]*?)\s*(?:<|$)", text or "", re.I)
        raw = match.group(1).strip("\"'`*. ") if match else None
        if raw in ("0", "1", "2"):
            scores[name] = int(raw)
        else:
            problems.append(f"<{name}> {'missing' if raw is None else repr(raw[:20])}")
    if problems:
        raise RubricParseError("unreadable judge scores: " + ", ".join(problems))
    return scores


def judge_trajectories(
    gateway: ChatModel, trajectories: Sequence[Trajectory], n: int, *, seed: int = 0
) -> dict[str, Any]:
    """Judge ``n`` trajectories sampled (without replacement, by ``seed``) from ``trajectories``.

    An unreadable judge answer is counted in ``unparseable`` and left out of the means.

    Returns:
        The mean score of each criterion (None when no answer was readable), ``judged`` (readable
        answers) and ``unparseable``.

    Raises:
        ModelError: The judge's model call failed.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    sample = random.Random(seed).sample(list(trajectories), min(n, len(trajectories)))
    totals = dict.fromkeys(RUBRIC, 0)
    judged = unparseable = 0
    for trajectory in sample:
        answer = gateway.complete(rubric_prompt(trajectory))
        try:
            scores = parse_rubric(answer.text)
        except RubricParseError as exc:
            unparseable += 1
            logger.info("judge answer for %s unreadable: %s", trajectory.episode_id, exc)
            continue
        judged += 1
        for name in RUBRIC:
            totals[name] += scores[name]
    means: dict[str, Any] = {k: (v / judged if judged else None) for k, v in totals.items()}
    return {**means, "judged": judged, "unparseable": unparseable}
