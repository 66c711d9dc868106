"""dreamgym-agents: train LLM agents with synthetic experience (DreamGym)."""

__version__ = "0.1.0"
