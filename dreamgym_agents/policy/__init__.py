"""The policy: a local LM writing one action per turn, constrained decoding, its SFT (the warm
start).
"""
