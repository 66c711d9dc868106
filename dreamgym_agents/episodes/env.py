"""The environment contract, task families and their registry.

An *environment* plays episodes of a task: ``reset(task) -> Observation`` and
``step(action_text) -> StepResult``. The action text is what the agent wrote; the environment's
action set parses it, and text it cannot parse or execute becomes an *invalid-action step*
(``valid=False``, reward 0, recorded), never an exception. Real environments (the browser) and the
dream (the experience model) implement the same contract, so the same episode graph runs on either.

A *task family* (``webarena``, ``alfworld``, a user's own) knows where its tasks come from, how
to build the environment that plays them, and everything else the core must not assume about an
environment: its actions, offline agents, evaluator kinds, state format, experience-model codec,
policy view and embedded recipe (:class:`TaskFamily`). Families are found by the
``dreamgym_agents.families`` entry point (or :func:`register_family`); the core never imports
one (``tests/test_architecture.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Task

if TYPE_CHECKING:
    from dreamgym_agents.episodes.agent import Agent
    from dreamgym_agents.experience.codec import ExperienceCodec
    from dreamgym_agents.policy.model import PolicyView

logger = logging.getLogger(__name__)


@dataclass
class Observation:
    """What the agent sees.

    Attributes:
        state: The abstract textual state, in the family's format (its ``StateFormat``).
        url: Current URL, for web environments.
        error: Error of the last action (``last_action_error`` in BrowserGym terms).
        info: Extra data for agents that need it (e.g. ``site_urls`` for the oracle).
    """

    state: str
    url: str = ""
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """Outcome of one ``step``.

    Attributes:
        observation: The next observation.
        reward: Reward of the step (outcome reward: 1.0 only at a successful final step).
        done: Whether the episode is over.
        success: Whether the task was accomplished (meaningful when ``done``).
        valid: False for an invalid-action step (unparseable or impossible action).
        error: Why the action was invalid, empty otherwise.
        info: Extra data (evaluator report, executed code, ...).
    """

    observation: Observation
    reward: float = 0.0
    done: bool = False
    success: bool = False
    valid: bool = True
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Action(Protocol):
    """One parsed action, whatever the family: its verb, whether it ends the episode by its
    type alone (an answer, a stop), and the final answer it gives (None: it gives none).
    Optional: ``typed``, the text it types into a field (None: it types none)."""

    @property
    def verb(self) -> str: ...

    @property
    def is_terminal(self) -> bool: ...

    @property
    def answer(self) -> str | None: ...


class ActionSet(Protocol):
    """Describes the actions for a prompt and parses an agent's action text.

    ``parse`` returns the actions the text holds (usually one; a family may allow several per
    turn) and raises ``ValueError`` (or a subclass) with a message saying what was expected.
    """

    def describe(self) -> str: ...

    def parse(self, text: str) -> Sequence[Action]: ...


def ends_by_type(action_set: ActionSet) -> Callable[[str], bool]:
    """``text`` → whether the action ends the episode by its type alone (an unparseable text
    does not): the "done from the action's type" baseline of fidelity, and the dream's rule."""

    def ends(text: str) -> bool:
        try:
            return any(action.is_terminal for action in action_set.parse(text))
        except ValueError:
            return False

    return ends


_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Collapse runs of whitespace to one space and strip the ends (how state lines compare)."""
    return _WHITESPACE.sub(" ", text).strip()


class StateFormat(Protocol):
    """How a family's abstract states read, for the core (the dream, fidelity).

    ``initial_state`` is the state an episode of a task starts from when none was recorded;
    ``start_key`` names where a task starts (tasks with the same key start in the same state;
    "" when unknown); ``location`` is where the agent is in a state (a web page's URL; ""
    for a family without one); ``strip_ids`` removes from a state line the ids a model cannot
    know (a web element's ``[bid]``). Optional: ``for_task(state, task)``, a recorded start
    state of another task in the same place made ``task``'s own: a family whose states name
    the task rewrites that line, so a curriculum variant starts where its seed started, with
    its own goal; without it the state is used as it is (a web page does not name the task).
    Optional: ``admissible(state)``, the commands a state accepts, when the state alone says
    (the dream then offers them in ``Observation.info["admissible"]`` as a real game does).
    Optional: ``reveals(state, next_state)``, whether a real next state shows what the state
    could not say (a receptacle's contents seen for the first time): fidelity then reports the
    exact-match rate of the other transitions apart (``state_exact_determined``).
    """

    def initial_state(self, task: Task) -> str: ...

    def start_key(self, task: Task) -> str: ...

    def location(self, state: str) -> str: ...

    def strip_ids(self, line: str) -> str: ...


@runtime_checkable
class Environment(Protocol):
    """The contract every environment (real or dream) implements."""

    provenance: str
    """``real`` for live environments, ``synthetic`` for the dream."""

    action_set: ActionSet

    def reset(self, task: Task) -> Observation: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


@dataclass
class EnvConfig:
    """Settings shared by environments.

    Attributes:
        max_steps: Episode length limit; an episode that reaches it ends with termination
            ``max_steps`` and no success.
        seed: Seed of the family's own randomness (the bundled site's data, generated games).
        judge_model: Model string of the LLM judge a family's evaluators may call (WebArena's
            ``fuzzy_match``).
        options: The family's own settings (a browser's timeouts, a game's expert …): any other
            key of the ``env`` section lands here, and the family reads them as its
            ``env_options`` dataclass (:func:`env_options`), which names the valid keys.
    """

    __extra_keys__ = "options"

    max_steps: int = 15
    seed: int = 0
    judge_model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be at least 1, got {self.max_steps}")


def env_options(family: Any, cfg: EnvConfig) -> Any:
    """The ``family``'s settings from ``cfg.options``: an instance of its ``env_options``
    dataclass (None when it has none and none are given).

    Raises:
        ConfigError: A key the family does not take (the message lists the valid ones), or a
            value its dataclass refuses.
    """
    from dreamgym_agents.config import apply_mapping

    cls = getattr(family, "env_options", None)
    if cls is None:
        if cfg.options:
            raise ConfigError(f"unknown config key(s) {', '.join(f'env.{k}' for k in cfg.options)}"
                              f": the {family.name} family takes none beyond env.max_steps, "
                              "env.seed, env.judge_model")
        return None
    options = cls()
    try:
        apply_mapping(options, dict(cfg.options), "env.")
    except ConfigError as exc:
        if "unknown config key" not in str(exc):
            raise
        valid = ", ".join(f"env.{f.name}" for f in fields(EnvConfig) if f.name != "options")
        raise ConfigError(f"{exc}, {valid}") from None
    return options


def env_config_for_agent(family: Any, cfg: EnvConfig, agent: Any) -> EnvConfig:
    """``cfg`` with the family's settings for ``agent`` (its ``agent_env_options``) where the
    user set none: what the environments of a run played by ``agent`` are made with."""
    for_agent = getattr(family, "agent_env_options", None)
    if for_agent is None:
        return cfg
    defaults = {k: v for k, v in for_agent(agent).items() if k not in cfg.options}
    return replace(cfg, options={**cfg.options, **defaults}) if defaults else cfg


@dataclass(frozen=True)
class Requirement:
    """One line of ``dg-agents doctor`` about what a family needs: ``ok`` True (there), False
    (missing: the family cannot run; ``detail`` says how to get it) or None (information, such as
    an optional setting left unset)."""

    name: str
    ok: bool | None
    detail: str


@runtime_checkable
class FamilyCore(Protocol):
    """The part of :class:`TaskFamily` a family writes itself (:class:`~.family_base.FamilyBase`
    leaves all but ``close`` to it): its name, tasks and splits, environment, actions and the
    offline agents that need no model."""

    name: str

    def load_tasks(self, split: str) -> list[Task]: ...

    def make_env(self, cfg: EnvConfig) -> Environment: ...

    def action_set(self) -> ActionSet: ...

    def offline_agents(self, seed: int = 0, noise: float = 0.3) -> dict[str, Agent]: ...

    def close(self) -> None: ...


@runtime_checkable
class FamilySetup(Protocol):
    """Setting up and reporting (defaults: nothing to prepare or report, no task files)."""

    def load_task_file(self, path: str) -> list[Task]: ...

    def prepare(self, cfg: EnvConfig, tasks: list[Task] | None = None) -> str: ...

    def requirements(self) -> list[Requirement]: ...


@runtime_checkable
class DreamParts(Protocol):
    """What the dream, the experience model and the policy read of a family (defaults: one
    evaluator kind, judged by the dream on every task; the plain-text codec, policy view and
    state format)."""

    eval_types: tuple[str, ...]
    dream_eval_types: tuple[str, ...] | None

    def task_eval_types(self, task: Task) -> list[str]: ...

    def experience_codec(self, version: int | None = None) -> ExperienceCodec: ...

    def policy_view(self) -> PolicyView: ...

    def state_format(self) -> StateFormat: ...


@runtime_checkable
class RecipeParts(Protocol):
    """The embedded recipe's hooks (defaults: the oracle, noisy and random collectors on the
    recipe's counts, no recipe fields of the family's, no relabelled endings)."""

    collectors: tuple[str, ...]

    def collection_plan(self, recipe: Any, tasks: list[Task]) -> list[tuple[str, Any, list, int]]:
        ...

    def embedded_recipe_defaults(self) -> dict[str, Any]: ...

    def relabel(self, trajectories: list[Any], *, answers: int, stops: int,
                seed: int) -> tuple[list[Any], list[Any]]: ...


@runtime_checkable
class TaskFamily(FamilyCore, FamilySetup, DreamParts, RecipeParts, Protocol):
    """A source of tasks plus the environment that plays them (one per adapter package, found by
    the ``dreamgym_agents.families`` entry point).

    Its members come in four typed parts: :class:`FamilyCore`, what a family writes itself;
    :class:`FamilySetup`, :class:`DreamParts` and :class:`RecipeParts`, which
    :class:`~.family_base.FamilyBase` supplies with defaults; then the optional hooks below,
    read where present.

    ``prepare`` is called once before a run with the tasks it will play (None: not known yet):
    it checks that what the family needs is there (browser, sites, game files) and raises a
    typed error saying what to fix; it returns a one-line description of the setup (e.g.
    "bundled shopping site at http://127.0.0.1:41234") that the CLI shows first.
    ``action_set`` describes and parses the family's actions; ``offline_agents`` are the agents
    that need no model (``oracle``, ``random``, … by name; ``noisy`` explores at rate
    ``noise``), for evaluation and collection; an agent with ``assign(tasks)`` is given its
    tasks first, one with ``min_steps`` gets episodes that long. ``requirements`` is what
    ``dg-agents doctor`` reports for the family (cheap: no browser, no game is started).

    The embedded experience model's data (:mod:`dreamgym_agents.pipeline.embedded`):
    ``embedded_recipe_defaults`` are the family's recipe fields, ``collection_plan``
    says which offline agent plays which train tasks for a recipe, ``collectors`` names them in
    the order their episodes are read, and ``relabel`` makes counterfactual endings of recorded
    episodes labelled by the task's own evaluator (none where that is not exact); the optional
    ``renamed(trajectories, copies, seed)`` makes copies of them with their entities renamed
    consistently (the recipe's ``entity_swaps``: experience-model examples only).

    ``eval_types`` are the kinds of evaluator the family's tasks have, ``task_eval_types`` a
    task's, and ``dream_eval_types`` those the dream trains on by default (None: every task):
    the kinds the experience model can judge from what the state shows. ``experience_codec``
    is the family's part of the experience model's prompt and answer
    (:mod:`dreamgym_agents.experience.codec`), ``state_format`` how its states read
    (:class:`StateFormat`), ``policy_view`` the policy's part
    (:class:`~dreamgym_agents.policy.model.PolicyView`): how a state reads to it, how actions
    are written, the grammar of a turn.

    Optional: ``task_keys(task) -> set[str]``, what makes a task the same instance for
    :class:`~dreamgym_agents.heldout.HeldOut` (default: its instruction, or its template and
    parameters); ``hash_features(version)``, the features the replay buffer retrieves by
    (:class:`~dreamgym_agents.buffer.embedding.HashFeatures`; default: the words of each line);
    ``agent_prompt``, the LLM agent's prompt template (default ``agent.md``);
    ``opening(task) -> str | None``, a task's real first state read without playing a step
    (the dream starts a task the buffer has no start for there);
    ``read_openings(tasks) -> int``, where one read of an opening is costly: those of the
    dream's tasks read at once before it plays
    (:func:`~dreamgym_agents.experience.dream.read_openings_ahead`);
    ``task_generator(tasks, seed) -> (generator, feasible)``, the curriculum's
    :class:`~dreamgym_agents.rl.curriculum.TaskGenerator` of variants and its extra
    feasibility check (default: the template generator, its values grounded in real tasks);
    ``rl_episode_steps``, an RL episode's step limit in the presets (default
    :data:`~dreamgym_agents.pipeline.run.RL_EPISODE_STEPS`);
    ``state_success(task, state) -> bool | None``, whether a state satisfies the task when the
    state alone tells (ALFWorld's goals; None: it cannot): the dream's rewards are measured
    against it (:func:`~dreamgym_agents.experience.fidelity.reward_check`), replaced by it only
    in the declared variant ``DreamConfig.reward = "state"``;
    ``dream_verdict(task, state, action) -> bool | None``, the task's own verdict of a dream
    step where the action and the state tell (the web's answers and stop URLs, by the task's
    evaluators; None: they do not), which replaces the experience model's
    (:class:`~dreamgym_agents.experience.dream.DreamConfig`'s ``verdicts``);
    ``experience_only``, the collectors whose episodes teach the experience model only, never
    a policy's warm start (ALFWorld's ``decoy``: its near miss is not to be imitated);
    ``env_options``, the dataclass of the family's own environment settings (a browser's
    timeouts, a game's expert), read from ``EnvConfig.options`` by :func:`env_options`
    (``--set env.<name>=…``; none: the family takes no other ``env`` keys);
    ``view_options``, the dataclass of its policy view's own settings, read from
    ``PolicyConfig.options`` by :func:`~dreamgym_agents.policy.model.view_options`
    (``--set policy_view.<name>=…``: the web's element references, marks and extractive
    answers; none: the view takes no settings of its own);
    ``recipe_options``, the frozen dataclass of its own embedded recipe options, its
    collectors' counts and settings (a subclass of
    :class:`~dreamgym_agents.pipeline.embedded.NoRecipeOptions`, read as ``recipe.options``;
    ``--set experience_recipe.<name>=…``; none: the shared fields only);
    ``agent_env_options(agent) -> dict``, those settings as an agent needs them, applied where
    the user set none by :func:`env_config_for_agent` (ALFWorld plans with its expert only for
    an agent that follows the plan).
    """


def task_template(task: Task) -> str:
    """What a task is grouped by: its template's id, else its template, else its intent."""
    return task.template_id or task.template or task.intent


def every_nth(tasks: list[Task], count: int) -> list[Task]:
    """``count`` of ``tasks`` taken at an even stride from the first (all of them when there
    are fewer): the embedded collection's choice of a collector's tasks, deterministic."""
    return tasks[:: max(1, len(tasks) // max(count, 1))][:count]


def spread_tasks(tasks: list[Task], limit: int | None = None) -> list[Task]:
    """``limit`` of ``tasks`` spread over their templates (all of them without a limit).

    One task of each template in turn (in order of first appearance), as many rounds as it
    takes, kept in their original order. Task files list a template's tasks together, and the
    first N of the bundled test split are all questions: a short run would measure no
    navigation or action task at all.
    """
    if limit is None or limit >= len(tasks):
        return list(tasks)
    # a task's turn: (how many tasks of its template come before it, its template's rank)
    counts: dict[str, int] = {}
    rank: dict[str, int] = {}
    turns = []
    for task in tasks:
        key = task_template(task)
        rank.setdefault(key, len(rank))
        turns.append((counts.get(key, 0), rank[key]))
        counts[key] = counts.get(key, 0) + 1
    picked = sorted(range(len(tasks)), key=turns.__getitem__)[:limit]
    return [tasks[i] for i in sorted(picked)]


FamilyFactory = Callable[[], TaskFamily]
"""Builds a task family; registered by name and called lazily (imports stay cheap)."""

ENTRY_POINT_GROUP = "dreamgym_agents.families"
"""Packages add task families under this entry-point group (``name = "module:Factory"``): this
package declares ``webarena`` and ``alfworld`` there, and a user's package can add its own
without editing ours."""

_FAMILIES: dict[str, FamilyFactory] = {}


def register_family(name: str, factory: FamilyFactory) -> None:
    """Register a task family under ``name`` (``--task name`` or ``--task name.<subset>``) from
    code (a family of an installed package is found by its entry point instead)."""
    _FAMILIES[name] = factory


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def family_names() -> list[str]:
    """Names of the task families: registered in code and declared by entry points."""
    return sorted(set(_FAMILIES) | set(_entry_points()))


def family_root(task: str) -> str:
    """The family name of a task family's id: ``tau2`` of ``tau2.retail``."""
    return task.split(".", 1)[0]


def family_part(task: str, part: Callable[[TaskFamily], Any]) -> Any:
    """``part(family)`` of the family named by ``task``, the family closed afterwards (for what
    outlives it: its action set, a state format's function, its hash features).

    Raises:
        ConfigError: No family has that name.
    """
    made = make_family(task)
    try:
        return part(made)
    finally:
        made.close()


def make_family(task: str) -> TaskFamily:
    """Build the task family named by ``task``'s prefix before the first dot.

    A family with a ``select(subset)`` hook is then narrowed to the subset after the dot
    (τ²'s ``tau2.retail``).

    Raises:
        ConfigError: No family has that name; the message lists the known ones.
    """
    prefix = family_root(task)
    factory = _FAMILIES.get(prefix)
    if factory is None:
        found = _entry_points().get(prefix)
        if found is None:
            known = ", ".join(family_names()) or "none"
            raise ConfigError(f"unknown task family {task!r}; known families: {known}")
        factory = found.load()
    made = factory()
    subset = task.split(".", 1)[1] if "." in task else ""
    select = getattr(made, "select", None)
    return select(subset) if subset and select is not None else made
