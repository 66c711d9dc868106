"""Turn-level GAE (dreamgym_agents/rl/advantages.py) against hand computations and its
identities."""

from __future__ import annotations

import random

import pytest

from dreamgym_agents.rl.advantages import action_runs, spread, turn_gae, value_positions


def test_gae_matches_the_hand_computation():
    # δ2 = 1 − 0.7 = 0.3; δ1 = 0.9·0.7 − 0.5 = 0.13, A1 = 0.13 + 0.72·0.3 = 0.346;
    # δ0 = 0.9·0.5 − 0.2 = 0.25, A0 = 0.25 + 0.72·0.346 = 0.49912
    advantages, returns = turn_gae([0, 0, 1], [0.2, 0.5, 0.7], gamma=0.9, lam=0.8,
                                   terminal=True)
    assert advantages == pytest.approx([0.49912, 0.346, 0.3])
    assert returns == pytest.approx([0.69912, 0.846, 1.0])


def test_gamma_and_lambda_one_give_the_return_minus_the_value_and_lambda_zero_the_td_error():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(1, 8)
        rewards = [rng.choice([0.0, 0.0, 1.0]) for _ in range(n)]
        values = [rng.random() for _ in range(n)]
        advantages, returns = turn_gae(rewards, values, gamma=1.0, lam=1.0, terminal=True)
        to_go = [sum(rewards[t:]) for t in range(n)]
        assert returns == pytest.approx(to_go)
        assert advantages == pytest.approx([g - v for g, v in zip(to_go, values, strict=True)])
        gamma = rng.random()
        td, _ = turn_gae(rewards, values, gamma=gamma, lam=0.0, terminal=True)
        following = [*values[1:], 0.0]
        assert td == pytest.approx([r + gamma * f - v for r, f, v in
                                    zip(rewards, following, values, strict=True)])


def test_a_truncated_episode_is_bootstrapped_from_the_value_a_terminal_one_is_not():
    rewards, values = [0.0, 0.0], [0.4, 0.6]
    ended, _ = turn_gae(rewards, values, gamma=1.0, lam=1.0, terminal=True, last_value=0.9)
    cut, cut_returns = turn_gae(rewards, values, gamma=1.0, lam=1.0, terminal=False,
                                last_value=0.9)
    assert ended == pytest.approx([-0.4, -0.6])  # nothing follows a failed end
    assert cut == pytest.approx([0.5, 0.3]) and cut_returns == pytest.approx([0.9, 0.9])


def test_environment_tokens_between_turns_change_nothing():
    turn_advantages, _ = turn_gae([0, 0, 1], [0.2, 0.5, 0.7], gamma=0.9, lam=0.8,
                                  terminal=True)
    rng = random.Random(1)
    for _ in range(10):
        mask: list[int] = []
        for turn in range(3):
            mask += [0] * (rng.randint(1, 30) if turn else 0) + [1] * rng.randint(1, 6)
        tokens = spread(turn_advantages, mask)
        # each action token carries its turn's advantage, each environment token nothing
        per_turn = [tokens[start:end] for start, end in action_runs(mask)]
        assert [set(t) for t in per_turn] == [{a} for a in turn_advantages]
        assert all(v == 0.0 for v, m in zip(tokens, mask, strict=True) if not m)


def test_a_turns_value_is_read_before_its_first_action_token():
    mask = [1, 1, 0, 0, 0, 1, 0, 1, 1]
    assert action_runs(mask) == [(0, 2), (5, 6), (7, 9)]
    # the prompt (10 tokens) ends with the first observation; later turns' observations are
    # the completion's environment tokens just before them
    assert value_positions(10, mask) == [9, 14, 16]
    with pytest.raises(ValueError, match="2 figures for 3 turns"):
        spread([0.1, 0.2], mask)
    with pytest.raises(ValueError, match="one value per turn"):
        turn_gae([0, 1], [0.5], gamma=1, lam=1, terminal=True)
    with pytest.raises(ValueError, match="lam must be in"):
        turn_gae([1], [0.5], gamma=1, lam=1.5, terminal=True)


def test_the_value_loss_falls_on_fixed_returns():
    import torch

    from dreamgym_agents.rl.ppo import value_loss

    torch.manual_seed(0)
    hidden = torch.randn(4, 6, 8)  # four rows of six tokens, the critic's inputs
    head = torch.nn.Linear(8, 1)
    returns = torch.tensor([[1.0, 0, 0, 0.5, 0, 0]] * 4)
    starts = torch.tensor([[1.0, 0, 0, 1, 0, 0]] * 4)
    optimiser = torch.optim.Adam(head.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        values = head(hidden).squeeze(-1)
        loss = value_loss(values, values.detach() * starts, returns, starts, clip=0.2)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss))
    assert losses[-1] < 0.1 * losses[0]
    # clipped: a value far from its old one earns no more than the clipped step does
    old, far = torch.zeros(1, 1), torch.full((1, 1), 5.0)
    one = torch.ones(1, 1)
    assert float(value_loss(far, old, one, one, clip=0.2)) == 0.5 * 16.0  # max of the two
