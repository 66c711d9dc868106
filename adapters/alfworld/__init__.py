"""ALFWorld household tasks (the ``alfworld`` family): games generated offline from the PDDL
domain of the ``alfworld`` wheel, played through textworld (``pip install
'dreamgym-agents[alfworld]'``)."""

from dreamgym_agents.adapters.alfworld.family import AlfworldFamily

__all__ = ["AlfworldFamily"]
