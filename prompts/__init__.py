"""The prompt templates (the Markdown files of this folder) and their one loader.

A family ships its own prompts in its package and names them ``package:file``
(``dreamgym_agents.adapters.alfworld:agent.md``); a name without a package is a file here.
A template with several parts marks each with a ``<!-- name -->`` line (:func:`prompt_blocks`).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from dreamgym_agents.errors import ConfigError

_BLOCK = re.compile(r"^<!--\s*([a-z_]+)\s*-->\s*$", re.M)


def load_prompt(name: str) -> str:
    """The text of the prompt template ``name`` (a file here, or ``package:file``).

    Raises:
        ConfigError: No such template.
    """
    package, sep, file = name.rpartition(":")
    try:
        where = resources.files(package if sep else __name__) / file
        return where.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, IsADirectoryError):
        raise ConfigError(f"no prompt template {name!r}: name a file of dreamgym_agents/prompts "
                          "or package:file") from None


@functools.cache
def prompt_blocks(name: str, required: tuple[str, ...] = ()) -> dict[str, str]:
    """The blocks of the prompt template ``name`` by their ``<!-- name -->`` markers.

    Raises:
        ConfigError: No such template, or it lacks one of the ``required`` blocks.
    """
    parts = _BLOCK.split(load_prompt(name))  # [preamble, name1, body1, name2, body2, ...]
    blocks = {n: b.strip("\n") for n, b in zip(parts[1::2], parts[2::2], strict=True)}
    missing = set(required) - set(blocks)
    if missing:
        raise ConfigError(f"{name} lacks the blocks {sorted(missing)}: restore them")
    return blocks
