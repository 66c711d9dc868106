"""Reinforcement learning: GRPO on dream or real rollouts, and the curriculum of task variants."""
