"""WebArena-format web tasks (the ``webarena`` family): WebArena task configs played in Chromium
through BrowserGym, on the real WebArena sites when their variables are set, else on the bundled
shopping site (:mod:`dreamgym_agents.adapters.shopping`). ``pip install 'dreamgym-agents[web]'``.

Modules: ``family`` (tasks, splits, sites, the family's hooks), ``actions`` (the action set),
``agents`` (the offline agents), ``browser`` and ``chromium`` (the real environment), ``cli``
(the ``site`` command).
"""

from dreamgym_agents.adapters.webarena.family import WebArenaFamily

__all__ = ["WebArenaFamily"]
