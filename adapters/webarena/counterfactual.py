"""Counterfactual final answers, judged by the task's own evaluator (training-data augmentation).

An experience model must tell a right final answer from a wrong one, and recorded data holds few
wrong ones: an oracle always answers right, and exploration rarely answers at all. For tasks
whose evaluator reads only the answer text (WebArena ``string_match`` without an LLM judge), the
outcome of *another* answer on the same final page is exact and cheap: the task's evaluator is a
pure function of the text. So each recorded right answer yields a few variants — a word of the
page (what random and giving-up agents say), the right answer quoted — each labelled by
:func:`dreamgym_agents.adapters.webarena.evaluation.evaluate_task`, never by us (the web family's
:meth:`~dreamgym_agents.adapters.webarena.family.WebArenaFamily.relabel`).

A variant is a new trajectory: the recorded steps up to the answer (context only, marked by
``info["train_from_step"]``) and the new final step. Variants are training examples, not buffer
records: the buffer keeps what really happened.

:func:`stop_trajectories` does the same for an agent that stops *earlier*, anywhere on a recorded
path, as exploring and giving-up agents do: at a recorded state of an episode whose task is judged
by its answer alone, or by the final URL alone (``url_match``: the state's URL is what the
evaluator reads), it says a word of that page or "done". Recorded data holds few such stops (an
oracle stops once, at the end) while a random agent in the dream stops anywhere; without them a
small model learns that a stop on an unfamiliar page is a success. Tasks judged by the site's state
(``program_html``) cannot be labelled this way and get none.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from dreamgym_agents.adapters.webarena.agents import call
from dreamgym_agents.adapters.webarena.evaluation import (
    SITE_PLACEHOLDER,
    evaluate_task,
    fill_placeholders,
)
from dreamgym_agents.adapters.webarena.experience_prompt import answer_text
from dreamgym_agents.adapters.webarena.state import parse_state
from dreamgym_agents.types import Trajectory, Transition

COUNTERFACTUAL = "counterfactual"


def answer_only_evaluator(config: dict[str, Any]) -> bool:
    """True when a task's outcome depends on the answer text alone (no page, no judge)."""
    ev = config.get("eval") or {}
    return (list(ev.get("eval_types") or []) == ["string_match"]
            and "fuzzy_match" not in (ev.get("reference_answers") or {}))


def url_only_evaluator(config: dict[str, Any]) -> bool:
    """True when a task's outcome depends on the final page's URL alone."""
    return list((config.get("eval") or {}).get("eval_types") or []) == ["url_match"]


class _UrlPage:
    """The one thing ``url_match`` reads of a page: its URL."""

    def __init__(self, url: str) -> None:
        self.url = url


def _offline_sites(*urls: str) -> dict[str, str]:
    """A base URL for every WebArena placeholder in ``urls``. States name sites by placeholder,
    so any base does, as long as the state and the reference resolve to the same."""
    return {m.group(0): f"http://{m.group(1).lower()}.offline.invalid"
            for url in urls for m in SITE_PLACEHOLDER.finditer(url)}


def _variant(traj: Trajectory, at: int, step: dict[str, Any], result: Any, *, kind: str,
             tag: str) -> Trajectory:
    """``traj``'s steps before ``at`` as context, then a new final step: the transition at
    ``at`` with the ``step`` fields, labelled by the evaluator's ``result`` (episode id suffixed
    ``~tag``, agent ``+kind``)."""
    episode_id = f"{traj.episode_id}~{tag}"
    final = Transition.from_dict({  # to_dict copies deeply
        **traj.transitions[at].to_dict(), **step, "episode_id": episode_id,
        "reward": result.score, "success": result.success, "done": True, "reasoning": "",
        "info": {COUNTERFACTUAL: True, "counterfactual_of": traj.episode_id,
                 "eval": {"score": result.score, "details": result.details}},
    })
    return Trajectory(
        episode_id=episode_id, task=traj.task, transitions=[*traj.transitions[:at], final],
        success=result.success, reward=result.score, agent=f"{traj.agent}+{kind}",
        provenance=traj.provenance, termination="done",
        info={"counterfactual_of": traj.episode_id, "train_from_step": at},
    )


def candidate_answers(state: str, answer: str, rng: random.Random, count: int) -> list[str]:
    """Up to ``count`` distinct answers other than ``answer``: a mistake, a rewording, an empty
    answer, then more mistakes.

    Mistakes are words of the page (what random and giving-up agents say); the rewording is
    ``answer`` in quotes (the evaluator decides whether it passes); the empty answer is what an
    agent says on a page without text, which recorded data never has on a question task. The
    embedded recipe's default ``counterfactual_answers`` takes the first two.

    Left out on purpose: answers inside a sentence, since whether they pass depends on the
    evaluator's kind (``must_include`` or ``exact_match``), which the prompt does not show, so they
    teach a small model noise; and plausible mistakes (another value of the same kind from the
    page, such as another product's price), since telling them apart needs knowing which line
    belongs to the asked entity, which the compact prompt does not show, and a small model trained
    on them learns only to doubt every right answer (evidence:
    docs/history/results-2026-11-to-12.md).
    """
    names = [line.name for line in parse_state(state).lines if line.name]
    words = sorted({w for name in names for w in name.split()})
    rewordings = [f"'{answer}'"] if answer else []
    empty = [""] if answer.strip() else []
    out: list[str] = []
    for pool_source in [words, rewordings, empty] + [words] * count:
        if len(out) >= count:
            break
        pool = [c for c in pool_source
                if c.strip().lower() != answer.strip().lower() and c not in out]
        if pool:
            out.append(rng.choice(pool))
    return out


def counterfactual_trajectories(
    trajectories: Iterable[Trajectory], *, per_answer: int = 2, seed: int = 0,
) -> list[Trajectory]:
    """Variants of every recorded final answer of an answer-only task.

    Args:
        trajectories: Recorded episodes (only those ending in a valid final answer are used).
        per_answer: Variants per recorded answer.
        seed: Choice of the variants (deterministic given the episode ids).

    Returns:
        New trajectories (``agent`` suffixed ``+counterfactual``), labelled by the evaluator.
    """
    out: list[Trajectory] = []
    for traj in trajectories:
        if not traj.transitions or per_answer < 1:
            continue
        last = traj.transitions[-1]
        answer = answer_text(last.action)
        # Only right answers are varied: their mistakes are the negatives recorded data lacks
        # (wrong answers are already negatives, and their variants would mostly be too).
        if (answer is None or not last.valid or not last.success
                or not answer_only_evaluator(traj.task.config)):
            continue
        rng = random.Random(f"{seed}|{traj.episode_id}")
        for j, candidate in enumerate(candidate_answers(last.state, answer, rng, per_answer)):
            result = evaluate_task(traj.task.config, answer=candidate, page=None, site_urls={})
            out.append(_variant(traj, len(traj.transitions) - 1,
                                {"action": call("send_msg_to_user", candidate)}, result,
                                kind=COUNTERFACTUAL, tag=f"cf{j}"))
    return out


def stop_trajectories(
    trajectories: Iterable[Trajectory], *, per_episode: int = 2, seed: int = 0,
) -> list[Trajectory]:
    """Stops at recorded states before an episode's last step, labelled by the task's evaluator.

    Args:
        trajectories: Recorded episodes; those of answer-only and URL-only tasks are used.
        per_episode: Stops per episode (at distinct recorded states, chosen at random).
        seed: Choice of the states and the words (deterministic given the episode ids).

    Returns:
        New trajectories (``agent`` suffixed ``+stop``): the recorded steps before the state as
        context, then the stop (a word of the page, or ``done``), with the evaluator's verdict.
    """
    out: list[Trajectory] = []
    for traj in trajectories:
        config = traj.task.config
        by_answer, by_url = answer_only_evaluator(config), url_only_evaluator(config)
        if not (by_answer or by_url) or per_episode < 1:
            continue
        rng = random.Random(f"stop|{seed}|{traj.episode_id}")
        steps = [i for i, t in enumerate(traj.transitions[:-1]) if t.valid]
        for j, i in enumerate(sorted(rng.sample(steps, min(per_episode, len(steps))))):
            state = traj.transitions[i].state
            words = [w for line in parse_state(state).lines for w in line.name.split() if w]
            answer = rng.choice(words) if words and rng.random() < 0.7 else "done"
            url = next((ln[4:].strip() for ln in state.splitlines()[:2]
                        if ln.startswith("URL:")), "")
            sites = _offline_sites(url, str(config["eval"].get("reference_url", "")))
            page = _UrlPage(fill_placeholders(url, sites, strict=False)) if by_url else None
            result = evaluate_task(config, answer=answer, page=page, site_urls=sites)
            out.append(_variant(traj, i, {"action": call("send_msg_to_user", answer),
                                          "next_state": state, "error": ""},
                                result, kind="stop", tag=f"stop{j}"))
    return out
