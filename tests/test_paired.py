"""Paired differences of policies on the same (seed, task) pairs, with a bootstrap interval."""

from __future__ import annotations

import json

import pytest

from dreamgym_agents.pipeline.paired import episode_outcomes, paired_difference, seeded


def test_the_bootstrap_interval_of_a_hand_computed_case():
    """Four pairs, one won: the mean of four draws with replacement is k/4 with k ~ B(4, 1/4):
    P(k) = .316, .422, .211, .047, .004 (k = 0..4), cumulative .316, .738, .949, .996. The
    2.5 % quantile is k = 0 and the 97.5 % quantile k = 3: the interval is [0, 0.75]."""
    a = {(0, "t1"): 1.0, (0, "t2"): 0.0, (0, "t3"): 1.0, (0, "t4"): 0.0}
    b = {(0, "t1"): 0.0, (0, "t2"): 0.0, (0, "t3"): 1.0, (0, "t4"): 0.0, (1, "t1"): 1.0}
    found = paired_difference(a, b, draws=20_000)
    assert found is not None
    assert (found.diff, found.low, found.high) == (0.25, 0.0, 0.75)
    assert (found.pairs, found.tasks, found.seeds, found.wins, found.losses) == (4, 4, 1, 1, 0)
    assert not found.excludes_zero
    assert paired_difference(a, b, draws=20_000) == found  # the same resamples: repeatable


def test_a_consistent_gain_has_an_interval_above_zero_and_unpaired_keys_are_left_out():
    a = {(s, f"t{i}"): 1.0 if i < 30 else 0.0 for s in range(3) for i in range(40)}
    b = {(s, f"t{i}"): 1.0 if i < 20 else 0.0 for s in range(3) for i in range(40)}
    b[(9, "other")] = 1.0
    found = paired_difference(a, b)
    assert found.diff == pytest.approx(0.25) and found.pairs == 120 and found.seeds == 3
    assert 0 < found.low < found.diff < found.high < 0.5 and found.excludes_zero
    assert paired_difference(b, a).high < 0  # the other way round
    assert paired_difference(a, {(5, "x"): 1.0}) is None  # nothing in common


def test_outcomes_are_read_from_an_evaluation_folder(tmp_path):
    lines = [{"task": {"task_id": "3"}, "success": True},
             {"task": {"task_id": 7}, "success": False}]
    (tmp_path / "trajectories.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    assert episode_outcomes(tmp_path) == {"3": 1.0, "7": 0.0}
    assert episode_outcomes(tmp_path / "missing") == {}
    assert seeded([(0, {"3": 1.0}), (1, {"3": 0.0})]) == {(0, "3"): 1.0, (1, "3"): 0.0}
