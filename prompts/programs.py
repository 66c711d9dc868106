"""Saved prompt programs: what ``dg-agents optimize`` learns, loaded by name.

A program is data, not code: the instruction that replaces a template's own and the worked
examples (demonstrations) shown before the task. The agent (``LLMAgent``) and the experience
model render them in their usual layout, so a program optimised with DSPy runs without DSPy.

Programs live in ``prompts/programs/<name>.json`` (installed as
``dreamgym_agents/prompts/programs``) and load by that name, or from any ``.json`` path.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import ConfigError

PROGRAM_VERSION = 1
PROGRAMS_DIR = "programs"
TARGETS = ("agent", "experience", "task-generator")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class PromptProgram:
    """An optimised prompt.

    Attributes:
        target: What it prompts: ``agent``, ``experience`` or ``task-generator``.
        family: The task family it was optimised on (a program is used with that family only).
        template: The prompt template it fills (``load_prompt`` name).
        instruction: The instruction replacing the template's own.
        demos: Worked examples, each a dict of the prompt's fields (for the agent:
            ``intent``, ``state``, ``history``, ``reasoning``, ``action``).
        model: The model it was optimised for.
        optimizer: How it was made (optimiser, budget, seed, ...).
        scores: What it scored (dream and real, before and after).
        version: File format version.
    """

    target: str
    family: str
    template: str
    instruction: str
    demos: list[dict[str, str]] = field(default_factory=list)
    model: str = ""
    optimizer: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, Any] = field(default_factory=dict)
    version: int = PROGRAM_VERSION

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(f"program target must be one of {', '.join(TARGETS)}, "
                              f"got {self.target!r}")
        if not self.instruction.strip():
            raise ConfigError("a prompt program needs a non-empty instruction")

    def check(self, target: str, family: str) -> PromptProgram:
        """This program, if it prompts ``target`` on ``family``.

        Raises:
            ConfigError: It was made for another target or family.
        """
        if (self.target, self.family) != (target, family):
            raise ConfigError(f"the program prompts the {self.target} of {self.family!r}, not "
                              f"the {target} of {family!r}")
        return self


def programs_dir() -> Path:
    """The folder of the named programs (inside the installed package)."""
    return Path(str(resources.files(__name__.rpartition(".")[0]) / PROGRAMS_DIR))


def program_names() -> list[str]:
    """The names of the saved programs."""
    folder = programs_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def program_path(name: str) -> Path:
    """Where the program ``name`` lives: a ``.json`` path as given, else a named program.

    Raises:
        ConfigError: Not a valid program name.
    """
    if name.endswith(".json") or "/" in name:
        return Path(name)
    if not _NAME.match(name):
        raise ConfigError(f"program name {name!r}: use letters, digits, '.', '_' and '-'")
    return programs_dir() / f"{name}.json"


def load_program(name: str) -> PromptProgram:
    """The program ``name`` (a named program, or a ``.json`` path).

    Raises:
        ConfigError: No such program, or the file is not one.
    """
    path = program_path(name)
    if not path.is_file():
        known = ", ".join(program_names()) or "none yet"
        raise ConfigError(f"no prompt program {name!r} (named programs: {known}; make one "
                          "with `dg-agents optimize`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != PROGRAM_VERSION:
            raise ConfigError(f"{path}: program version {data.get('version')!r}, this "
                              f"toolkit reads {PROGRAM_VERSION}")
        return PromptProgram(**data)
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is not a prompt program: {exc}") from None


def save_program(program: PromptProgram, name: str) -> Path:
    """Write ``program`` as ``name`` (a named program, or a ``.json`` path); returns the file.

    Raises:
        ConfigError: The place cannot be written.
    """
    path = program_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(program), indent=1, ensure_ascii=False) + "\n",
                       encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"cannot save the program to {path}: {exc.strerror}") from None
    return path
