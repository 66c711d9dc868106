"""Paired comparisons of policies on the same tasks: per-task outcomes and a bootstrap interval.

Two rows of a bench (or two policies of any evaluation) are compared on what they share: the
same test tasks at the same seeds. Each shared (seed, task) gives one difference of outcomes
(1, 0 or -1); the comparison reports their mean (the difference of success rates on those
pairs), and a 95 % percentile bootstrap interval obtained by resampling the pairs with
replacement. Pairing removes the tasks' own difficulty from the noise, which mean ± std over
seeds does not: two policies that solve the same easy tasks differ by nothing on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BOOTSTRAP_DRAWS = 10_000
"""Resamples of the pairs behind an interval (the interval's ends move by about a pair's
worth between seeds of the resampling at this count)."""
CONFIDENCE = 0.95


@dataclass
class PairedDifference:
    """``a - b`` on the (seed, task) pairs both have.

    Attributes:
        diff: Mean difference of outcomes (a's success rate minus b's, on the pairs).
        low: Lower end of the bootstrap interval.
        high: Upper end.
        pairs: Shared (seed, task) pairs.
        tasks: Distinct tasks among them.
        seeds: Distinct seeds among them.
        wins: Pairs a solved and b did not.
        losses: Pairs b solved and a did not.
    """

    diff: float
    low: float
    high: float
    pairs: int
    tasks: int
    seeds: int
    wins: int
    losses: int

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0."""
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


Outcomes = Mapping[tuple[int, str], float]
"""Outcomes by (seed, task id): 1.0 solved, 0.0 not."""


def paired_difference(a: Outcomes, b: Outcomes, *, draws: int = BOOTSTRAP_DRAWS,
                      confidence: float = CONFIDENCE, seed: int = 0) -> PairedDifference | None:
    """``a - b`` over their shared (seed, task) pairs with a percentile bootstrap interval
    (``draws`` resamples of the pairs, with replacement; ``seed`` makes it repeatable); None
    when they share no pair."""
    import numpy as np

    keys = sorted(set(a) & set(b))
    if not keys:
        return None
    d = np.array([float(a[k]) - float(b[k]) for k in keys])
    rng = np.random.default_rng(seed)
    means = np.empty(draws)
    chunk = max(1, 2_000_000 // len(d))  # bounded memory whatever the number of pairs
    for start in range(0, draws, chunk):
        n = min(chunk, draws - start)
        means[start:start + n] = d[rng.integers(0, len(d), size=(n, len(d)))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail], method="inverted_cdf")
    return PairedDifference(diff=float(d.mean()), low=float(low), high=float(high),
                            pairs=len(keys), tasks=len({t for _, t in keys}),
                            seeds=len({s for s, _ in keys}), wins=int((d > 0).sum()),
                            losses=int((d < 0).sum()))


def episode_outcomes(folder: str | Path) -> dict[str, float]:
    """Each task's outcome in an evaluation folder's ``trajectories.jsonl`` (1.0 solved), the
    last episode of a task where it holds several; empty when the folder has none."""
    path = Path(folder) / "trajectories.jsonl"
    if not path.is_file():
        return {}
    out: dict[str, float] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                record = json.loads(line)
                out[str(record["task"]["task_id"])] = 1.0 if record.get("success") else 0.0
    return out


def seeded(per_seed: Iterable[tuple[int, Mapping[str, float]]]) -> dict[tuple[int, str], float]:
    """Outcomes by (seed, task) from each seed's outcomes by task."""
    return {(seed, task): value for seed, outcomes in per_seed
            for task, value in outcomes.items()}
