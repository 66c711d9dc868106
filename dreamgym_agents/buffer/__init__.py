"""The replay buffer: real and offline transitions in Chroma, retrieved by (state, action)."""
