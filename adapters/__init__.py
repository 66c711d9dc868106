"""Package data and modules mapped into the dreamgym_agents namespace."""
