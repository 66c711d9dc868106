"""The bundled WebArena-compatible shopping site ("One Stop Market") and its task set.

Modules: ``data`` (the seeded catalog), ``store`` (per-episode instances), ``layout`` /
``pages`` / ``account_pages`` (HTML), ``server`` (:class:`ShoppingSite`), ``taskgen`` (the task
set in ``tasks/webarena_shopping``), ``oraclecheck`` (replays every task's oracle in Chromium).
"""

from dreamgym_agents.adapters.shopping.data import Catalog, generate_catalog
from dreamgym_agents.adapters.shopping.server import ShoppingSite

__all__ = ["Catalog", "ShoppingSite", "generate_catalog"]
