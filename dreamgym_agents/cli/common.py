"""What the ``dg-agents`` commands share: option types, config sections, the split choice.

``--config FILE`` holds one mapping per section and ``--set section.key=value`` overrides one
field. Each command names its sections: ``env`` and ``llm`` for ``eval``; ``llm``, ``agent``,
``experience``, ``buffer`` and ``dream`` for ``dream``; and so on. Values apply in order: file,
explicit flags, ``--set``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from dreamgym_agents.errors import ConfigError

DEFAULT_BUFFER_PATH = ".dreamgym/buffer"
BUFFER_URL_ENV = "DG_BUFFER_URL"


class Split(StrEnum):
    train = "train"
    validation = "validation"
    test = "test"
    valid_seen = "valid_seen"  # ALFWorld's official splits (ALFWORLD_DATA)
    valid_unseen = "valid_unseen"
    valid_train = "valid_train"  # ALFWorld's official training games
    official_train = "official_train"


OutOpt = Annotated[Path, typer.Option("--out", help="Output folder (resumes if it exists).")]
TaskOpt = Annotated[str, typer.Option("--task", help="Task family, e.g. webarena.")]
AgentOpt = Annotated[
    str, typer.Option("--agent", help="oracle, random, or a LiteLLM model string.")
]
ProgramOpt = Annotated[
    str | None, typer.Option("--program", help="A saved prompt program for a model agent "
                             "(a name from `dg-agents optimize`, or a .json file).")
]
SplitOpt = Annotated[Split, typer.Option("--split", help="Task split.")]
TasksFileOpt = Annotated[
    Path | None, typer.Option("--tasks", help="A WebArena-format JSON file of task configs.")
]
LimitOpt = Annotated[
    int | None, typer.Option("--limit", min=1, help="Run only the first N tasks.")
]
ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", min=1, max=64, help="Episodes at once.")
]
MaxStepsOpt = Annotated[int, typer.Option("--max-steps", min=1, help="Steps per episode.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed (site data, random agent).")]
ExperienceModelOpt = Annotated[
    str | None,
    typer.Option("--experience-model",
                 help="Experience model: a LiteLLM model string, or embedded (the default)."),
]
BufferPathOpt = Annotated[
    Path | None, typer.Option("--buffer-path", help=f"Buffer directory [{DEFAULT_BUFFER_PATH}].")
]
BufferUrlOpt = Annotated[
    str | None, typer.Option("--buffer-url", envvar=BUFFER_URL_ENV, help="Chroma server URL.")
]
NoHistoryOpt = Annotated[
    bool, typer.Option("--no-history", help="Ablation: show the model no previous steps.")
]
NoRetrievalOpt = Annotated[
    bool, typer.Option("--no-retrieval", help="Ablation: retrieve no similar transitions.")
]
NoReasoningOpt = Annotated[
    bool, typer.Option("--no-reasoning", help="Ablation: no step-by-step reasoning.")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML file with the --set sections.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: experience.top_k=5, llm.temperature=0.2"),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log more.")]


def read_sections(path: Path | None, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The sections of a YAML config file (only ``names`` allowed)."""
    if path is None:
        return {}
    from dreamgym_agents.config import read_yaml_mapping

    data = read_yaml_mapping(path)
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(unknown)}; use "
                          f"{', '.join(names)}")
    return {k: v or {} for k, v in data.items()}


def group_overrides(overrides: list[str] | None, names: tuple[str, ...]) -> dict[str, list[str]]:
    """Group ``--set section.key=value`` by section."""
    groups: dict[str, list[str]] = {name: [] for name in names}
    for text in overrides or []:
        section, _, rest = text.partition(".")
        if section not in groups or not rest:
            raise ConfigError(f"--set {text!r}: keys start with one of {', '.join(names)} "
                              "(e.g. experience.top_k=5)")
        groups[section].append(rest)
    return groups


class Sections:
    """Config-file data and ``--set`` overrides of each section of one command."""

    def __init__(self, config: Path | None, overrides: list[str] | None,
                 names: tuple[str, ...]) -> None:
        self.data = read_sections(config, names)
        self.overrides = group_overrides(overrides, names)

    def configure(self, obj: Any, section: str, flags: dict[str, Any] | None = None) -> Any:
        """Apply, in order, the file's section, the explicit flags and the ``--set`` overrides."""
        from dreamgym_agents.config import apply_mapping, load_config

        prefix = f"{section}."
        apply_mapping(obj, self.data.get(section) or {}, prefix)
        if flags:
            apply_mapping(obj, flags, prefix)
        return load_config(obj, None, self.overrides[section], prefix=prefix)

    def gateway(self, model: str, section: str, concurrency: int | None = None) -> Any:
        """A gateway for ``model`` configured by ``section`` (``llm``, ``agent``, ``judge``).

        ``concurrency``: the run's episodes at once; the gateway's requests in flight follow it
        (each episode waits on one answer at a time) unless the section sets
        ``max_concurrency``.
        """
        from dreamgym_agents.gateway.llm import Gateway, LLMConfig, check_model_string

        flags: dict[str, Any] = {"model": model}
        if concurrency is not None and "max_concurrency" not in (self.data.get(section) or {}):
            flags["max_concurrency"] = max(1, concurrency)
        cfg = self.configure(LLMConfig(model=model), section, flags)
        check_model_string(cfg.model)
        gateway = Gateway(cfg)
        gateway.prepare()  # a hosted model's first requests of a run do not wait on set-up
        return gateway


def build_agent(agent: str, *, seed: int, family: Any, sections: Sections,
                section: str = "llm", concurrency: int | None = None,
                program: str | None = None) -> Any:
    """The agent ``agent`` names (:func:`~dreamgym_agents.episodes.agent.make_agent`): one of
    the family's offline agents (``oracle``, ``random`` …), a policy this toolkit trained
    (``hf/<checkpoint>`` with its settings beside it) or a model string.

    A trained policy plays in the layout, view and decoding it was trained with, greedily unless
    the ``section`` sets ``temperature``. A model string's gateway is configured by the
    ``section`` section, its requests in flight following the run's ``concurrency`` unless the
    section sets ``max_concurrency``; it is prompted by the saved prompt ``program`` when
    given."""
    from dreamgym_agents.episodes.agent import make_agent
    from dreamgym_agents.policy.model import (
        PolicyAgent,
        PolicyModel,
        trained_policy_settings,
        typed_view_options,
    )

    if agent in family.offline_agents(seed):
        return make_agent(agent, family, seed=seed, program=program)
    trained = trained_policy_settings(agent[3:]) if agent.startswith("hf/") else None
    if trained is not None:
        if program:
            raise ConfigError("--program prompts a model through a template; a trained policy "
                              "plays in its own layout")
        # its own settings, then the section's (``--set agent.temperature=1`` samples it)
        cfg = sections.configure(trained, section)
        cfg.options = typed_view_options(getattr(family, "view_options", None), cfg,
                                         f"{section}.")
        return PolicyAgent(PolicyModel.load(agent[3:], cfg, family.policy_view()),
                           keep_tokens=False)
    if program:
        from dreamgym_agents.prompts.programs import load_program

        load_program(program).check("agent", family.name)  # before a gateway is made
    return make_agent(agent, family, seed=seed, program=program,
                      gateway=sections.gateway(agent, section, concurrency))
