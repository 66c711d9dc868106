"""Embedded bundles shipped with the package, one folder per task family (see
:mod:`dreamgym_agents.pipeline.bundle`); installed as ``dreamgym_agents.bundles``."""
