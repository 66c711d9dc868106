"""The episode loop: environments and task families, agents, the LangGraph episode graph."""
