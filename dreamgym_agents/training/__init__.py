"""Training: the experience model's SFT (and, later, GRPO/PPO and sim-to-real), one file each."""
