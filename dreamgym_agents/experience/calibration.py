"""Calibration of a policy's own dream: one policy, the same tasks, in the dream and for real.

Fidelity (:mod:`~dreamgym_agents.experience.fidelity`) replays recorded transitions, teacher
forced; it says how well the experience model predicts steps someone else took. What RL needs
is different: the dream must not pay the *policy being trained* for what reality would not.
Calibration plays the policy itself, greedy or with the same sampling seeds, once in the dream
and once in the real environment on the same tasks, and compares the outcomes task by task:

- success in the dream and in reality, overall and per evaluator kind (a task counts under
  each kind its evaluators have: ``TaskFamily.task_eval_types``);
- agreement: the tasks whose dream and real outcomes are the same;
- the false-reward rate: of the tasks the real environment failed, the share the dream
  rewarded (what RL in the dream would learn to exploit);
- the missed-reward rate: of the tasks the real environment rewarded, the share the dream did
  not (what RL in the dream could not learn).

:func:`calibrate_policy` plays both in resumable folders ``real/`` and ``dream/`` (the real
episodes may be an evaluation already played, such as a stage's validation) and writes
``calibration.json``; ``dg-agents calibrate`` is the command, and ``dg-agents run`` records it
for the warm start and after each RL stage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.types import Task, Trajectory, read_trajectories

CALIBRATION_FILE = "calibration.json"


@dataclass
class Calibration:
    """Dream against reality on one set of tasks (one evaluator kind, or all).

    Attributes:
        kind: The evaluator kind (``all`` for every task).
        tasks: Tasks played in both.
        dream_successes: Tasks the dream rewarded.
        real_successes: Tasks the real environment rewarded.
        agree: Tasks whose outcomes are the same in both.
        false_rewards: Tasks the dream rewarded and the real environment did not.
        missed_rewards: Tasks the real environment rewarded and the dream did not.
    """

    kind: str
    tasks: int = 0
    dream_successes: int = 0
    real_successes: int = 0
    agree: int = 0
    false_rewards: int = 0
    missed_rewards: int = 0

    def add(self, dream: bool, real: bool) -> None:
        self.tasks += 1
        self.dream_successes += dream
        self.real_successes += real
        self.agree += dream == real
        self.false_rewards += dream and not real
        self.missed_rewards += real and not dream

    @property
    def dream_success(self) -> float:
        return self.dream_successes / self.tasks if self.tasks else 0.0

    @property
    def real_success(self) -> float:
        return self.real_successes / self.tasks if self.tasks else 0.0

    @property
    def gap(self) -> float:
        """Dream success minus real success."""
        return self.dream_success - self.real_success

    @property
    def false_reward_rate(self) -> float | None:
        """Of the real failures, the share the dream rewarded (None: no real failure)."""
        failures = self.tasks - self.real_successes
        return self.false_rewards / failures if failures else None

    @property
    def missed_reward_rate(self) -> float | None:
        """Of the real successes, the share the dream did not reward (None: none)."""
        return self.missed_rewards / self.real_successes if self.real_successes else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        for name in ("dream_success", "real_success", "gap", "false_reward_rate",
                     "missed_reward_rate"):
            value = getattr(self, name)
            out[name] = None if value is None else round(value, 4)
        out["agreement"] = round(self.agree / self.tasks, 4) if self.tasks else None
        return out


def compare(dream: Iterable[Trajectory], real: Iterable[Trajectory],
            kinds: Callable[[Task], Sequence[str]],
            trained: Iterable[str] | None = None) -> dict[str, Any]:
    """Pair dream and real episodes by task (the last of each task's) and count
    (:class:`Calibration`) overall, per evaluator kind and, with ``trained`` (the kinds the
    dream trains on: ``TaskFamily.dream_eval_types``), over the tasks whose evaluators are all
    of those kinds (``trained``); each task's pair is listed."""
    dreamt = {str(t.task.task_id): t for t in dream}
    played = {str(t.task.task_id): t for t in real}
    overall = Calibration("all")
    allowed = set(trained) if trained is not None else None
    on_trained = Calibration("trained")
    by_kind: dict[str, Calibration] = {}
    pairs = []
    for task_id in sorted(set(dreamt) & set(played), key=_natural):
        d, r = bool(dreamt[task_id].success), bool(played[task_id].success)
        task = played[task_id].task
        overall.add(d, r)
        task_kinds = sorted(set(kinds(task))) or ["none"]
        for kind in task_kinds:
            by_kind.setdefault(kind, Calibration(kind)).add(d, r)
        if allowed is not None and set(kinds(task)) <= allowed:
            on_trained.add(d, r)
        pairs.append({"task_id": task_id, "kinds": task_kinds, "dream": d, "real": r,
                      "dream_steps": len(dreamt[task_id].transitions),
                      "real_steps": len(played[task_id].transitions)})
    return {"all": overall.as_dict(),
            **({"trained": {**on_trained.as_dict(), "kinds": sorted(allowed)}}
               if allowed is not None else {}),
            "by_kind": {k: c.as_dict() for k, c in sorted(by_kind.items())},
            "unpaired": {"dream": len(set(dreamt) - set(played)),
                         "real": len(set(played) - set(dreamt))},
            "tasks": pairs}


def _natural(task_id: str) -> tuple[int, str]:
    return (int(task_id), "") if task_id.isdigit() else (1 << 62, task_id)


def calibrate_policy(
    tasks: list[Task], agent: Any, family: Any, experience_model: Any, buffer: Any,
    folder: Path, *, concurrency: int, max_steps: int, meta: dict[str, Any],
    real_folder: Path | None = None, dream_cfg: Any = None, env_cfg: Any = None,
    on_episode: Callable[[Any], None] | None = None, trained: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Play ``agent`` on ``tasks`` in the dream and for real (unless ``real_folder`` already
    holds its real episodes of them), compare (:func:`compare`), write
    ``folder/calibration.json`` and return it (with the real transitions it played:
    ``real_transitions``).

    Raises:
        ConfigError: Episodes failed on infrastructure (rerun to retry them).
    """
    import asyncio

    from dreamgym_agents.episodes.env import EnvConfig, env_config_for_agent
    from dreamgym_agents.episodes.graph import RunConfig, run_episodes
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.experience.fidelity_run import run_dream

    folder.mkdir(parents=True, exist_ok=True)
    played_real = 0
    wanted = {str(t.task_id) for t in tasks}
    if real_folder is None:
        real_folder = folder / "real"
        env_cfg = env_config_for_agent(family, env_cfg or EnvConfig(max_steps=max_steps), agent)
        result = asyncio.run(run_episodes(
            tasks, lambda: family.make_env(env_cfg), agent,
            RunConfig(out_dir=real_folder, concurrency=concurrency, max_steps=max_steps,
                      meta={**meta, "side": "real"}), on_episode=on_episode))
        if result.failed:
            raise ConfigError(f"{len(result.failed)} real calibration episode(s) failed (see "
                              f"{real_folder / 'errors.jsonl'}); rerun to retry them")
        played_real = int(result.summary["real_transitions"])
    dream = asyncio.run(run_dream(
        tasks, agent, experience_model, buffer,
        RunConfig(out_dir=folder / "dream", concurrency=concurrency, max_steps=max_steps,
                  meta={**meta, "side": "dream"}), dream_cfg, family=family,
        on_episode=on_episode))
    if dream.failed:
        raise ConfigError(f"{len(dream.failed)} dream calibration episode(s) failed (see "
                          f"{folder / 'dream' / 'errors.jsonl'}); rerun to retry them")
    real = [t for t in read_trajectories(real_folder / "trajectories.jsonl")
            if str(t.task.task_id) in wanted]
    dreamt = [t for t in read_trajectories(folder / "dream" / "trajectories.jsonl")
              if str(t.task.task_id) in wanted]
    out = {**compare(dreamt, real, family.task_eval_types, trained),
           "real_folder": str(real_folder),
           "real_transitions": played_real, "em_failures": dream.summary.get("em_failures", 0),
           "meta": meta}
    (folder / CALIBRATION_FILE).write_text(json.dumps(out, indent=2, sort_keys=True))
    return out


def render(calibration: dict[str, Any], title: str = "") -> list[str]:
    """Markdown lines: one row per evaluator kind, then all."""
    lines = [f"**{title}**", ""] if title else []
    lines += ["| evaluator kind | tasks | dream success | real success | agreement | "
              "false rewards (rate) | missed rewards (rate) |", "|---|---|---|---|---|---|---|"]
    rows = [*calibration["by_kind"].values(), calibration["all"]]
    if "trained" in calibration:
        rows.append({**calibration["trained"],
                     "kind": f"trained on ({', '.join(calibration['trained']['kinds'])})"})
    for c in rows:
        def rate(n: int, r: float | None) -> str:
            return f"{n} ({r:.2f})" if r is not None else f"{n} (—)"
        lines.append(f"| {c['kind']} | {c['tasks']} | {c['dream_successes']} "
                     f"({c['dream_success']:.2f}) | {c['real_successes']} "
                     f"({c['real_success']:.2f}) | {c['agree']} | "
                     f"{rate(c['false_rewards'], c['false_reward_rate'])} | "
                     f"{rate(c['missed_rewards'], c['missed_reward_rate'])} |")
    return lines


def summary_line(calibration: dict[str, Any], part: str = "all") -> str:
    """One line: dream vs real success, false and missed rewards, over every task (``part``:
    ``trained``, over the kinds the dream trains on)."""
    c = calibration[part]
    false = c["false_reward_rate"]
    missed = c["missed_reward_rate"]
    return (f"dream {c['dream_successes']}/{c['tasks']} vs real {c['real_successes']}/"
            f"{c['tasks']}, false rewards {c['false_rewards']}"
            f"{f' ({false:.2f})' if false is not None else ''}, missed {c['missed_rewards']}"
            f"{f' ({missed:.2f})' if missed is not None else ''}")
