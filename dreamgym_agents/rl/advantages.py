"""Turn-level GAE for multi-turn PPO: a turn's advantage from the episode's rewards and a critic's
values, spread over that turn's action tokens.

An episode is a row of turns. Turn ``t`` acts in the state its context ends with (the
observation, before the action): its value ``V[t]`` is the critic's reading there, at the last
context token before the turn's first action token (:func:`value_positions`). With reward
``r[t]`` after turn ``t``::

    δ[t] = r[t] + γ · V[t+1] − V[t]
    A[t] = δ[t] + γ · λ · A[t+1]
    R[t] = A[t] + V[t]

``V[T]``, after the last turn, is 0 at a terminal end. For an episode the step limit cut
(``terminal=False``) it is the critic's reading of the state after the last turn: truncation is
not termination.

CleanRL's ``ppo.py`` computes the same recursion over environment steps; here a step is a turn,
and the environment's tokens between turns take no part (:func:`spread`).
"""

from __future__ import annotations

from collections.abc import Sequence


def turn_gae(rewards: Sequence[float], values: Sequence[float], *, gamma: float, lam: float,
             terminal: bool, last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """The advantages and returns of an episode's turns.

    Args:
        rewards: The reward after each turn (a sparse task reward: 0 … 0, then the outcome).
        values: The critic's value of the state each turn acted in.
        gamma: Discount per turn.
        lam: GAE's λ (1: the discounted return minus the value; 0: the one-turn TD error).
        terminal: The episode ended by the task (success or failure: nothing follows); False
            when the step limit cut it, so the value of the state after its last turn,
            ``last_value``, stands in for what would have followed.
        last_value: The critic's value of the state after the last turn (read only when the
            episode was truncated).

    Raises:
        ValueError: ``rewards`` and ``values`` differ in length, or γ or λ is outside [0, 1].
    """
    if len(rewards) != len(values):
        raise ValueError(f"one value per turn: {len(rewards)} rewards, {len(values)} values")
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {x}")
    advantages = [0.0] * len(rewards)
    following = 0.0 if terminal else float(last_value)  # V of the state after the last turn
    carried = 0.0
    for t in reversed(range(len(rewards))):
        delta = float(rewards[t]) + gamma * following - float(values[t])
        carried = delta + gamma * lam * carried
        advantages[t] = carried
        following = float(values[t])
    returns = [a + float(v) for a, v in zip(advantages, values, strict=True)]
    return advantages, returns


def action_runs(env_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of a completion's turns: each run of action tokens
    (``env_mask`` 1; the environment's tokens between turns are 0), in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(env_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(env_mask)))
    return runs


def value_positions(prompt_length: int, env_mask: Sequence[int]) -> list[int]:
    """Where each turn's value is read, as indices into the whole sequence (prompt, then
    completion): the last context token before the turn's first action token."""
    return [prompt_length + start - 1 for start, _ in action_runs(env_mask)]


def spread(turn_values: Sequence[float], env_mask: Sequence[int]) -> list[float]:
    """One figure per completion token: each turn's (an advantage) on its action tokens, 0 on
    the environment's.

    Raises:
        ValueError: Not one figure per turn.
    """
    runs = action_runs(env_mask)
    if len(runs) != len(turn_values):
        raise ValueError(f"{len(turn_values)} figures for {len(runs)} turns")
    out = [0.0] * len(env_mask)
    for (start, end), value in zip(runs, turn_values, strict=True):
        out[start:end] = [float(value)] * (end - start)
    return out
