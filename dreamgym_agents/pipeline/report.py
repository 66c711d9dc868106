"""The run's results: ``summary.json``, ``report.md`` and a plot of real success against the real
transitions RL used (``success_vs_real.png``)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLOT_FILE = "success_vs_real.png"
CURVE_FILE = "rollout_success.png"


def summarize_run(state: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run's finished stages (``summary.json``)."""
    done = state.get("done", {})

    def stage(name: str, key: str, default: Any = None) -> Any:
        return done.get(name, {}).get(key, default)

    dream_real = stage("dream_rl", "real_transitions", 0) or 0
    s2r_real = stage("s2r", "real_transitions", 0) or 0
    return {
        "sft_success": stage("eval_sft", "success"),
        "dream_success": stage("eval_dream", "success"),
        "s2r_success": stage("eval_s2r", "success"),
        "real_transitions_used": dream_real + s2r_real,
        "dream_real_transitions": dream_real,
        "s2r_real_transitions": s2r_real,
        "synthetic_transitions": (stage("dream_rl", "synthetic_transitions", 0) or 0)
        + (stage("s2r", "synthetic_transitions", 0) or 0),
        "offline_transitions": stage("sft", "offline_transitions"),
        "eval_episodes": stage("eval_sft", "episodes"),
        "eval_real_transitions": sum(stage(s, "eval_real_transitions", 0) or 0
                                     for s in ("eval_sft", "eval_dream", "eval_s2r")),
        "dream_rollout_success": stage("dream_rl", "rollout_success"),
        "s2r_rollout_success": stage("s2r", "rollout_success"),
        "curriculum": stage("dream_rl", "curriculum"),
        # validation/test tasks kept out of training, by stage (0 everywhere on the shipped data)
        "held_out_rejected": {k: v.get("held_out_rejected") for k, v in done.items()
                              if v.get("held_out_rejected") is not None},
        "em_failures": stage("dream_rl", "em_failures"),
        # each RL stage's starting and final policies, in the dream against reality
        "calibration": {name: calibration_figures(done[name].get("calibration"))
                        for name in ("dream_rl", "s2r")
                        if name in done and done[name].get("calibration")},
        "buffer_added": dict(state.get("buffer_added", {})),
        "experience_refreshes": [
            {k: r.get(k) for k in ("stage", "fresh_transitions", "steps", "first_loss",
                                   "last_loss", "model", "skipped")}
            for r in state.get("refreshes", [])],
        "wall_seconds": state.get("wall_seconds"),
        "stage_seconds": {k: v.get("seconds") for k, v in done.items()},
    }


def calibration_figures(calibration: dict[str, Any] | None) -> dict[str, Any]:
    """A stage's calibration as the summary keeps it: per policy (start, final), dream and
    real success and the false- and missed-reward rates over every task."""
    out: dict[str, Any] = {}
    keys = ("tasks", "dream_success", "real_success", "false_reward_rate",
            "missed_reward_rate", "agreement")
    for side, found in (calibration or {}).items():
        if not found:
            continue
        out[side] = {k: found["all"].get(k) for k in keys}
        if found.get("trained"):
            out[side]["trained"] = {k: found["trained"].get(k) for k in (*keys, "kinds")}
    return out


def calibration_lines(done: dict[str, Any]) -> list[str]:
    """The report's calibration table: each RL stage's policies, dream against reality."""
    rows = []
    for name in ("dream_rl", "s2r"):
        for side, found in (done.get(name, {}).get("calibration") or {}).items():
            if not found:
                continue
            kinds = ", ".join(f"{k} {v['dream_successes']}/{v['real_successes']}"
                              for k, v in found["by_kind"].items())
            for part, label in (("trained", "kinds the dream trains on"), ("all", "all")):
                c = found.get(part)
                if not c:
                    continue
                rows.append(f"| {name}, {side} policy | {label} | {c['tasks']} | "
                            f"{fmt(c['dream_success'])} | {fmt(c['real_success'])} | "
                            f"{fmt(c['false_reward_rate'])} | {fmt(c['missed_reward_rate'])} | "
                            f"{kinds if part == 'all' else ''} |")
    if not rows:
        return []
    return ["## The dream against reality (calibration)", "",
            "Each RL stage's starting and final policies, greedy, on the same validation "
            "tasks in the dream and on the real environment: success in both, the dream's "
            "false-reward rate (real failures it rewarded) and missed-reward rate (real "
            "successes it did not), over the tasks of the kinds the dream trains on and over "
            "all.", "",
            "| policy | tasks of | tasks | dream success | real success | false-reward rate | "
            "missed-reward rate | dream/real successes by evaluator kind |",
            "|---|---|---|---|---|---|---|---|", *rows, ""]


def points(summary: dict[str, Any]) -> list[tuple[str, int, float]]:
    """(label, real RL transitions, real success) of each evaluated policy."""
    out = []
    if summary.get("sft_success") is not None:
        out.append(("SFT", 0, summary["sft_success"]))
    if summary.get("dream_success") is not None:
        out.append(("DreamGym", summary["dream_real_transitions"], summary["dream_success"]))
    if summary.get("s2r_success") is not None:
        out.append(("DreamGym-S2R", summary["real_transitions_used"], summary["s2r_success"]))
    return out


def plot(summary: dict[str, Any], path: Path) -> bool:
    """Draw real success against real RL transitions; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    pts = points(summary)
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    xs = [p[1] for p in pts]
    ys = [p[2] for p in pts]
    ax.plot(xs, ys, "o-", color="#3465a4")
    for label, x, y in pts:
        ax.annotate(f"{label} ({y:.2f})", (x, y), textcoords="offset points", xytext=(6, 6),
                    fontsize=8)
    ax.set_xlabel("real transitions used by RL")
    ax.set_ylabel("real test success")
    ax.set_ylim(0, max(0.1, max(ys, default=0) * 1.3))
    ax.set_xlim(-max(10, max(xs, default=0) * 0.05), max(10, max(xs, default=0)) * 1.25)
    ax.grid(alpha=0.3)
    ax.set_title("Real success vs. real transitions")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def rollout_curves(metrics_file: Path) -> dict[str, list[float]]:
    """Each training stage's rollout success, batch by batch (``rollout/success`` lines of
    ``metrics.jsonl``; a restarted stage's curve is its last attempt's)."""
    curves: dict[str, list[float]] = {}
    if not metrics_file.exists():
        return curves
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if "rollout/success" not in row or "stage" not in row:
            continue
        curve = curves.setdefault(row["stage"], [])
        if row.get("batch") == 1:
            curve.clear()  # a restarted stage: its new attempt
        curve.append(float(row["rollout/success"]))
    return curves


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1):i + 1]
        out.append(sum(part) / len(part))
    return out


def plot_curves(curves: dict[str, list[float]], path: Path) -> bool:
    """Draw each stage's rollout success per batch (raw and smoothed); False without
    matplotlib or curves."""
    if not any(curves.values()):
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for (stage, values), color in zip(curves.items(), ("#3465a4", "#cc0000", "#4e9a06"),
                                      strict=False):
        xs = list(range(1, len(values) + 1))
        ax.plot(xs, values, ".", color=color, alpha=0.35)
        ax.plot(xs, smooth(values, max(1, len(values) // 5)), "-", color=color,
                label=f"{stage} ({'dream' if stage == 'dream_rl' else 'real'} rollouts)")
    ax.set_xlabel("batch of rollouts")
    ax.set_ylabel("rollout success")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Rollout success while training")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def write_report(out: Path, cfg: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Write ``summary.json``, ``report.md`` and the plot into ``out``; return the summary."""
    summary = summarize_run(state)
    summary["report"] = str(out / "report.md")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    drew = plot(summary, out / PLOT_FILE)
    done = state.get("done", {})
    lines = [
        f"# DreamGym run: {cfg.task}, preset {cfg.preset}, seed {cfg.seed}", "",
        "| policy | real RL transitions | synthetic transitions | real test success |",
        "|---|---|---|---|",
    ]
    prompt = "worked_examples" in done.get("sft", {})  # a hosted policy: prompts were learnt
    warm = "Prompt with worked examples (LabeledFewShot)" if prompt else "SFT warm start"
    lines.append(f"| {warm} | 0 | 0 | {fmt(summary['sft_success'])} |")
    if "dream_rl" in done:
        d = done["dream_rl"]
        dream_cfg = getattr(cfg, "dream", None)
        trainer = "GEPA" if prompt else getattr(dream_cfg, "algorithm", "grpo").upper()
        lines.append(f"| DreamGym ({'real' if getattr(cfg, 'real_rl', False) else 'dream'} "
                     f"{trainer}) | {d.get('real_transitions', 0)} | "
                     f"{d.get('synthetic_transitions', 0)} | {fmt(summary['dream_success'])} |")
    if "s2r" in done:
        lines.append(f"| DreamGym-S2R | {summary['real_transitions_used']} | "
                     f"{summary['synthetic_transitions']} | {fmt(summary['s2r_success'])} |")
    lines += ["", f"Evaluated on {summary['eval_episodes']} test task(s) of the real site; "
              f"wall time {summary['wall_seconds']} s.", ""]
    if drew:
        lines += [f"![real success vs real transitions]({PLOT_FILE})", ""]
    curves = rollout_curves(out / "metrics.jsonl")
    if curves:
        lines += ["| training stage | batches | rollout success, first quarter → last quarter |",
                  "|---|---|---|"]
        for stage, values in curves.items():
            q = max(1, len(values) // 4)
            first, last = sum(values[:q]) / q, sum(values[-q:]) / q
            lines.append(f"| {stage} | {len(values)} | {first:.3f} → {last:.3f} |")
        lines.append("")
        if plot_curves(curves, out / CURVE_FILE):
            lines += [f"![rollout success while training]({CURVE_FILE})", ""]
    lines += calibration_lines(done)
    if summary.get("buffer_added") or summary.get("experience_refreshes"):
        added = ", ".join(f"{k} {v}" for k, v in summary["buffer_added"].items()) or "none"
        lines += [f"Replay buffer (`buffer/`, the run's own): real transitions added by stage: "
                  f"{added}."]
        for r in summary.get("experience_refreshes", []):
            if r.get("skipped"):
                lines.append(f"Experience model not refreshed ({r['skipped']}).")
            else:
                lines.append(f"Experience model refreshed after {r['stage']}: "
                             f"{r['fresh_transitions']} fresh real transitions, {r['steps']} "
                             f"steps, loss {fmt(r['first_loss'])} → {fmt(r['last_loss'])}.")
        lines.append("")
    if summary.get("curriculum"):
        c = summary["curriculum"]
        lines += ["Curriculum: " + ", ".join(f"{k} {c[k]}" for k in
                                             ("proposed", "accepted", "malformed", "infeasible",
                                              "held_out", "synthetic_groups") if k in c), ""]
    lines += ["## Stages", "", "| stage | seconds | result |", "|---|---|---|"]
    for name, result in done.items():
        brief = {k: v for k, v in result.items()
                 if isinstance(v, (int, float, str)) and k not in ("seconds", "path", "folder")}
        text = ", ".join(f"{k}={v}" for k, v in list(brief.items())[:6])
        lines.append(f"| {name} | {result.get('seconds', '')} | {text} |")
    lines += ["", "## Configuration", "", "```json",
              json.dumps(asdict(cfg), indent=2, sort_keys=True), "```", ""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return summary
