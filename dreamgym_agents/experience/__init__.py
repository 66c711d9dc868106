"""The experience model: its prompt and codec, the dream environment, its training data and SFT,
fidelity.
"""
