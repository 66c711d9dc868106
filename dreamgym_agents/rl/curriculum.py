"""Curriculum task generation (DreamGym, Sec. 4.2).

Every task the policy plays in a GRPO group gets a *reward variance* over the group's rollouts:
a task it always solves or always fails teaches nothing (all advantages are zero), one it solves
half the time teaches most. After each batch, the ``seeds_per_round`` seed tasks of highest
variance go to the *task generator*, which proposes ``candidates`` variants of each and selects
one; the variants join a pool of synthetic tasks, and later batches replace at most a share ``λ``
(``synthetic_share``) of their groups with tasks from that pool. Malformed variants (unreadable,
placeholders left, no intent) and infeasible ones are discarded and counted. A variant is
infeasible when it names what no recorded page shows, duplicates a known task, or matches a
held-out validation or test task (:class:`~dreamgym_agents.heldout.HeldOut`).

Synthetic tasks have no evaluator: they are played in the dream only, where the experience model
judges the outcome. They start where their seed starts (``config["synthetic_of"]``).

Generators (plain callables behind :class:`TaskGenerator`):

- :class:`LLMTaskGenerator`: the experience model's gateway (or any model) with its own prompt,
  ``prompts/task_generator.md``; it answers JSON with its candidates and its choice.
- :class:`TemplateTaskGenerator`: for the embedded default, whose small experience model was
  trained to predict transitions only: candidates fill the seed's WebArena intent template with
  other values of its parameters, taken from the task set, and the generator selects the one
  whose values the task set uses least (the least familiar to the policy).
- A family's own (``TaskFamily.task_generator``, which the pipeline prefers): ALFWorld's
  variants of a game are new games of its task type in its room.

Duplicates are told apart by the family's ``task_keys`` when it has them (an ALFWorld
instruction recurs across games), else by the instruction.

**Grouping** (``grouping``): GRPO plays each task as a group, so a task's variance is its
group's. PPO needs no groups (the paper's PPO plays each task once), so the paper groups tasks
by meaning instead: ``cluster`` embeds the stage's tasks (``embedding``, the buffer's
embedding specs; the offline ``hash`` by default), splits them into ``clusters`` by k-means,
takes each cluster's value as the variance of all the latest rewards of its tasks, and sends one
task of each high-variance cluster (its own most varied, ties drawn) to the generator. ``auto``
(the default) is ``cluster`` for PPO stages, ``task`` for GRPO's.
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.gateway.llm import Gateway, LLMConfig, check_model_string
from dreamgym_agents.prompts import load_prompt
from dreamgym_agents.types import Task

if TYPE_CHECKING:
    from dreamgym_agents.heldout import HeldOut

logger = logging.getLogger(__name__)

PROMPT_FILE = "task_generator.md"
GROUPINGS = ("auto", "task", "cluster")
_PLACEHOLDER = re.compile(r"\{\{\s*\w+\s*\}\}")


@dataclass
class CurriculumConfig:
    """Settings of the curriculum.

    Attributes:
        enabled: Generate task variants (False: the ``no task generation`` ablation; seed
            tasks only).
        synthetic_share: λ, the most a batch's groups may be synthetic tasks (paper §4.2).
        seeds_per_round: Highest-variance seed tasks sent to the generator after each batch.
        candidates: Variants the generator proposes per seed (it selects one).
        min_variance: A task is a seed only if its group's reward variance exceeds this.
        pool_size: Synthetic tasks kept (the oldest leave first).
        generator: Who proposes the variants: ``family`` (the family's own generator, else
            the seed's template filled with other values) or a LiteLLM model string, the
            paper's LLM generator (:class:`LLMTaskGenerator`) through the gateway. The family's
            feasibility check still applies.
        generator_llm: Gateway settings of that model (``LLMConfig`` fields: ``api_base``,
            ``api_key_env``, ``temperature`` …).
        generator_program: A saved prompt program (``dg-agents optimize --target
            task-generator``) whose instruction that model is prompted with (None: the
            template's).
        grouping: Whose reward variance picks the seeds: ``task`` (each task's group),
            ``cluster`` (clusters of tasks by meaning: PPO's, whose tasks need not be played
            in groups) or ``auto`` (``cluster`` on PPO stages, ``task`` on GRPO's).
        clusters: How many clusters ``cluster`` grouping makes (at most one per task).
        embedding: What embeds a task's instruction for the clusters: a buffer embedding
            spec (``hash``, ``st:<model>``, ``litellm:<model>``).
    """

    enabled: bool = True
    synthetic_share: float = 0.25
    seeds_per_round: int = 2
    candidates: int = 4
    min_variance: float = 0.0
    pool_size: int = 64
    generator: str = "family"
    generator_llm: dict[str, Any] = field(default_factory=dict)
    generator_program: str | None = None
    grouping: str = "auto"
    clusters: int = 8
    embedding: str = "hash"

    def __post_init__(self) -> None:
        if self.grouping not in GROUPINGS:
            raise ConfigError(f"curriculum.grouping must be one of {', '.join(GROUPINGS)}, "
                              f"got {self.grouping!r}")
        if self.clusters < 1:
            raise ConfigError(f"curriculum.clusters must be at least 1, got {self.clusters}")
        kind, sep, arg = self.embedding.partition(":")
        if not (self.embedding == "hash" or (sep and kind in ("st", "litellm") and arg.strip())):
            raise ConfigError(f"curriculum.embedding {self.embedding!r}: use 'hash', "
                              "'st:<model>' or 'litellm:<model>' (the buffer's forms)")
        if not 0.0 <= self.synthetic_share <= 1.0:
            raise ConfigError(f"curriculum.synthetic_share (λ) must be in [0, 1], got "
                              f"{self.synthetic_share}")
        if self.seeds_per_round < 1 or self.candidates < 1 or self.pool_size < 1:
            raise ConfigError("curriculum.seeds_per_round, candidates and pool_size must be at "
                              "least 1")
        if self.min_variance < 0:
            raise ConfigError(f"curriculum.min_variance must be >= 0, got {self.min_variance}")
        if self.generator != "family":
            check_model_string(self.generator)
        unknown = sorted(set(self.generator_llm) - set(LLMConfig.__dataclass_fields__) - {"model"})
        if unknown or "model" in self.generator_llm:
            raise ConfigError(f"curriculum.generator_llm: unknown key(s) "
                              f"{', '.join(unknown or ['model'])} (the model is "
                              "curriculum.generator; the others are llm settings)")

    def llm_generator(self, start_key: Callable[[Task], str] | None = None) -> Any:
        """The LLM task generator :attr:`generator` names (None for ``family``)."""
        if self.generator == "family":
            return None
        instruction = None
        if self.generator_program:
            from dreamgym_agents.prompts.programs import load_program

            program = load_program(self.generator_program)
            if program.target != "task-generator":
                raise ConfigError(f"curriculum.generator_program {self.generator_program!r} "
                                  f"prompts the {program.target}, not the task generator")
            instruction = program.instruction
        cfg = LLMConfig(model=self.generator, **self.generator_llm)
        return LLMTaskGenerator(Gateway(cfg), start_key=start_key, instruction=instruction)


def reward_variance(rewards: list[float]) -> float:
    """Population variance of one group's rewards (0 for fewer than two)."""
    if len(rewards) < 2:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return sum((r - mean) ** 2 for r in rewards) / len(rewards)


def select_seeds(variances: dict[str, float], k: int, min_variance: float = 0.0) -> list[str]:
    """The ``k`` task ids of highest variance above ``min_variance`` (ties: by id)."""
    eligible = [(v, tid) for tid, v in variances.items() if v > min_variance]
    eligible.sort(key=lambda item: (-item[0], item[1]))
    return [tid for _, tid in eligible[:k]]


def kmeans(vectors: Any, k: int, seed: int = 0, iterations: int = 50) -> list[int]:
    """Each row's cluster among ``k`` (k-means on unit vectors, k-means++ seeding; the same
    clusters for the same vectors and seed)."""
    import numpy as np

    x = np.asarray(vectors, dtype=np.float64)
    n = len(x)
    k = max(1, min(k, n))
    rng = np.random.default_rng(seed)
    centres = [x[rng.integers(n)]]
    for _ in range(1, k):
        d = np.min([((x - c) ** 2).sum(1) for c in centres], axis=0)
        if d.sum() <= 0:
            break
        centres.append(x[rng.choice(n, p=d / d.sum())])
    c = np.array(centres)
    labels = np.zeros(n, dtype=int)
    norms = (x * x).sum(1)[:, None]
    for it in range(iterations):  # squared distances without an n × k × width array
        new = (norms - 2 * x @ c.T + (c * c).sum(1)[None]).argmin(1)
        if it and (new == labels).all():
            break
        labels = new
        for j in range(len(c)):
            if (labels == j).any():
                c[j] = x[labels == j].mean(0)
    return [int(v) for v in labels]


def task_clusters(tasks: list[Task], k: int, embedding: str = "hash", seed: int = 0,
                  family: str = "") -> dict[str, int]:
    """Each task's cluster (by id) among ``k`` clusters of their instructions' embeddings."""
    from dreamgym_agents.buffer.embedding import make_embedding_function

    if not tasks:
        return {}
    embed = make_embedding_function(embedding, family=family)
    vectors = embed([t.intent for t in tasks])
    return dict(zip((t.task_id for t in tasks), kmeans(vectors, k, seed), strict=True))


def synthetic_slots(groups: int, share: float, available: int) -> int:
    """How many of ``groups`` may be synthetic: ``floor(share × groups)``, at most
    ``available``."""
    return max(0, min(int(share * groups + 1e-9), available))


class TaskGenerator(Protocol):
    """Proposes variants of a seed task and selects one.

    ``generate(seed, n)`` returns the raw candidates and the index of the selected one (None:
    the first feasible). A candidate is a dict with ``intent`` and ``params``, and optionally
    ``config``, the family's fields of the new task's config (e.g. an ALFWorld variant's game);
    anything else is malformed. Model failures to answer in the format are malformed
    candidates, never exceptions.
    """

    def generate(self, seed: Task, n: int) -> tuple[list[Any], int | None]: ...


Feasible = Callable[[Task], str | None]
"""Says why a candidate task cannot be played (None: it can), e.g. it names a product no
recorded page shows."""


@dataclass
class CurriculumStats:
    """Counts of the curriculum's work (logged as ``curriculum/*``)."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    malformed: int = 0
    infeasible: int = 0
    synthetic_groups: int = 0
    held_out: int = 0
    """Candidates rejected because they are validation or test tasks (also in ``infeasible``)."""
    reasons: dict[str, int] = field(default_factory=dict)


class Curriculum:
    """Tracks reward variance, asks the generator for variants, and mixes batches (λ).

    Args:
        cfg: Settings.
        generator: The task generator (None: seed tasks only).
        known: The seed tasks (a candidate repeating one is a duplicate).
        feasible: Extra feasibility check of a candidate (None: only the built-in ones).
        seed: Seed of the batch mixing.
        held_out: The family's validation and test tasks: a candidate matching one (by
            instruction, or template and parameters) is rejected and counted, whatever the
            generator (the template generator fills templates with values that test tasks
            use too).
        keys: What makes two tasks the same instance, for duplicates (the family's
            ``task_keys``: an ALFWorld instruction recurs across games); None: the instruction.
        algorithm: The stage's (``grpo`` or ``ppo``): what ``grouping: auto`` means.
        family: The tasks' family (its features embed them for ``cluster`` grouping).
    """

    def __init__(self, cfg: CurriculumConfig, generator: TaskGenerator | None,
                 known: list[Task], feasible: Feasible | None = None, seed: int = 0,
                 held_out: HeldOut | None = None,
                 keys: Callable[[Task], set[str]] | None = None,
                 algorithm: str = "grpo", family: str = "") -> None:
        self.cfg = cfg
        self.held_out = held_out
        self.generator = generator if cfg.enabled else None
        self.feasible = feasible
        self.rng = random.Random(seed)
        self.variance: dict[str, float] = {}
        self.pool: list[Task] = []
        self.stats = CurriculumStats()
        self.keys = keys or (lambda task: {_norm(task.intent)})
        self._known: set[str] = set().union(*(self.keys(t) for t in known))
        self._by_id = {t.task_id: t for t in known}
        self._made = 0
        self.grouping = cfg.grouping if cfg.grouping != "auto" else \
            ("cluster" if algorithm == "ppo" else "task")
        self.cluster: dict[str, int] = {}
        self._rewards: dict[str, list[float]] = {}
        if self.grouping == "cluster" and self.generator is not None:
            self.cluster = task_clusters(known, cfg.clusters, cfg.embedding, seed, family)
            sizes = sorted(collections.Counter(self.cluster.values()).values(), reverse=True)
            logger.info("curriculum: %d task(s) in %d cluster(s) of sizes %s", len(known),
                        len(sizes), sizes)

    def observe(self, tasks: list[Task], rewards: list[list[float]]) -> None:
        """Record each task's group variance (the latest group of a task counts)."""
        for task, group in zip(tasks, rewards, strict=True):
            self.variance[task.task_id] = reward_variance(group)
            self._rewards[task.task_id] = list(group)
            self._by_id.setdefault(task.task_id, task)

    STATE = ("variance", "pool", "stats", "_known", "_by_id", "_made", "_rewards")

    def state(self) -> dict[str, Any]:
        """What the curriculum has learnt and made so far (a stage's resume point keeps it:
        :meth:`restore`); its generator, checks and clusters are rebuilt from the settings."""
        return {**{k: copy.deepcopy(getattr(self, k)) for k in self.STATE},
                "rng": self.rng.getstate()}

    def restore(self, state: dict[str, Any]) -> None:
        for k in self.STATE:
            setattr(self, k, state[k])
        self.rng.setstate(state["rng"])

    def cluster_variance(self) -> dict[int, float]:
        """Each cluster's variance: of all the latest rewards of its tasks played so far
        (a synthetic task counts in its seed's cluster)."""
        pooled: dict[int, list[float]] = {}
        for tid, rewards in self._rewards.items():
            root = self._by_id[tid].config.get("synthetic_of") or tid
            if root in self.cluster:
                pooled.setdefault(self.cluster[root], []).extend(rewards)
        return {c: reward_variance(r) for c, r in pooled.items()}

    def seeds(self) -> list[str]:
        """The seed tasks of this round: the highest-variance tasks (``task`` grouping), or
        one task of each highest-variance cluster, its own most varied, ties drawn."""
        played = {tid: v for tid, v in self.variance.items()
                  if not self._by_id[tid].config.get("synthetic_of")}
        if self.grouping == "task":
            return select_seeds(played, self.cfg.seeds_per_round, self.cfg.min_variance)
        top = select_seeds({str(c): v for c, v in self.cluster_variance().items()},
                           self.cfg.seeds_per_round, self.cfg.min_variance)
        seeds = []
        for c in top:
            members = sorted(t for t in played if self.cluster.get(t) == int(c))
            if members:
                best = max(played[t] for t in members)
                seeds.append(self.rng.choice([t for t in members if played[t] == best]))
        return seeds

    def refresh(self) -> list[Task]:
        """Ask the generator for variants of the highest-variance seeds; return the accepted."""
        if self.generator is None:
            return []
        self.stats.rounds += 1
        accepted = []
        for tid in self.seeds():
            task = self.variant(self._by_id[tid])
            if task is not None:
                accepted.append(task)
        self.pool = [*self.pool, *accepted][-self.cfg.pool_size:]
        return accepted

    def mix(self, seed_tasks: list[Task]) -> list[Task]:
        """The batch's tasks: at most λ of the groups replaced by synthetic tasks."""
        slots = synthetic_slots(len(seed_tasks), self.cfg.synthetic_share, len(self.pool))
        if not slots or self.generator is None:
            return list(seed_tasks)
        where = sorted(self.rng.sample(range(len(seed_tasks)), slots))
        chosen = self.rng.sample(self.pool, slots)
        out = list(seed_tasks)
        for i, task in zip(where, chosen, strict=True):
            out[i] = task
        self.stats.synthetic_groups += slots
        return out

    def variant(self, seed: Task) -> Task | None:
        """One accepted variant of ``seed``, or None. It is the generator's choice among its
        ``candidates``, else the first that passes :meth:`check`; counted in :attr:`stats`."""
        assert self.generator is not None
        candidates, choice = self.generator.generate(seed, self.cfg.candidates)
        self.stats.proposed += len(candidates)
        valid: list[Task] = []
        for raw in candidates:
            task, why = self.check(seed, raw)
            if task is None:
                kind = "malformed" if why.startswith("malformed") else "infeasible"
                setattr(self.stats, kind, getattr(self.stats, kind) + 1)
                self.stats.reasons[why] = self.stats.reasons.get(why, 0) + 1
                valid.append(None)  # type: ignore[arg-type]  # keeps the choice's index
                continue
            valid.append(task)
        picked = valid[choice] if choice is not None and 0 <= choice < len(valid) else None
        picked = picked or next((t for t in valid if t is not None), None)
        if picked is None:
            return None
        self.stats.accepted += 1
        self._known |= self.keys(picked)
        self._by_id[picked.task_id] = picked
        return picked

    def check(self, seed: Task, raw: Any) -> tuple[Task | None, str]:
        """A raw candidate variant of ``seed`` as a task, or None and why it is rejected
        (``malformed: …`` or ``infeasible: …``; the reason counts are the caller's)."""
        if not isinstance(raw, dict):
            return None, "malformed: not an object"
        intent = str(raw.get("intent") or "").strip()
        params = raw.get("params") or {}
        if not intent or len(intent) < 8:
            return None, "malformed: no intent"
        if _PLACEHOLDER.search(intent):
            return None, "malformed: placeholder left"
        if not isinstance(params, dict):
            return None, "malformed: params not a mapping"
        extra = raw.get("config") or {}
        if not isinstance(extra, dict):
            return None, "malformed: config not a mapping"
        config = {k: v for k, v in seed.config.items() if k not in ("eval", "oracle")}
        config.update(extra)  # the generator's own (an ALFWorld variant's game)
        config["synthetic_of"] = seed.config.get("synthetic_of") or seed.task_id
        task = replace(seed, task_id=f"{seed.task_id}~v", intent=intent, split="synthetic",
                       config=config, oracle=None, params=params)
        if not self._known.isdisjoint(self.keys(task)):
            return None, "infeasible: duplicates a known task"
        self._made += 1
        task = replace(task, task_id=f"{seed.task_id}~v{self._made}")
        if self.held_out is not None and self.held_out.matches(task):
            self.held_out.count("curriculum")
            self.stats.held_out += 1
            return None, "infeasible: a held-out (validation or test) task"
        if self.feasible is not None and (why := self.feasible(task)):
            return None, f"infeasible: {why}"
        return task, ""


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------


class LLMTaskGenerator:
    """A model proposes variants with ``prompts/task_generator.md`` and selects one.

    The answer is JSON: ``{"candidates": [{"intent": …, "params": {…}}, …], "choice": i}``
    (a fenced block or surrounding text is tolerated). An unreadable answer yields no
    candidates (counted as one malformed proposal by the curriculum).

    Args:
        gateway: The model.
        prompt: The prompt file (``{intent}``, ``{template}``, ``{params}``, ``{start}``, ``{n}``).
        start_key: Where a task starts, to show the model (the family's
            ``StateFormat.start_key``: a web task's start URL); None shows nothing.
    """

    def __init__(self, gateway: Gateway, prompt: str = PROMPT_FILE,
                 start_key: Callable[[Task], str] | None = None,
                 instruction: str | None = None) -> None:
        self.gateway = gateway
        self.template = load_prompt(prompt)
        self.start_key = start_key
        self.instruction = instruction

    def messages(self, seed: Task, n: int, instruction: str | None = None
                 ) -> list[dict[str, str]]:
        """The prompt for ``seed``; its instruction (what precedes ``# Seed task``) is
        ``instruction``, else the generator's, else the template's own."""
        params = json.dumps(seed.params, ensure_ascii=False) if seed.params else "{}"
        template = seed.template or "(none)"
        start = (self.start_key(seed) if self.start_key else "") or "(not given)"
        head, rest = split_generator_template(self.template)
        chosen = instruction or self.instruction
        content = ((chosen.strip() + "\n" if chosen else head.format(n=n)) + rest.format(
            intent=seed.intent, template=template, params=params, start=start, n=n))
        return [{"role": "user", "content": content}]

    def generate(self, seed: Task, n: int, instruction: str | None = None
                 ) -> tuple[list[Any], int | None]:
        completion = self.gateway.complete(self.messages(seed, n, instruction))
        return parse_candidates(completion.text)


def split_generator_template(template: str) -> tuple[str, str]:
    """A task-generator template as (its instruction, the rest from ``# Seed task``), both
    still to format (the instruction with ``{n}`` only)."""
    head, sep, rest = template.partition("\n# Seed task")
    if not sep:
        raise ConfigError("the task-generator template has no '# Seed task' section")
    return head, sep + rest


def parse_candidates(text: str) -> tuple[list[Any], int | None]:
    """Read a generator's JSON answer: (candidates, choice). Unreadable: ([None], None)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return [None], None
    try:
        data = json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return [None], None
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
        return [None], None
    choice = data.get("choice")
    return list(data["candidates"]), choice if isinstance(choice, int) else None


class TemplateTaskGenerator:
    """Variants of a seed from its ``template`` (``{{name}}`` placeholders) and other values.

    Each parameter takes a value used for a parameter of that name anywhere in ``tasks``
    (another product, month, order number …) — several at once for a multi-parameter template.
    Among the candidates, the selected one uses values the task set uses least.
    """

    def __init__(self, tasks: list[Task], seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.values: dict[str, list[str]] = {}
        self.uses: dict[str, int] = {}
        for task in tasks:
            for key, value in task.params.items():
                if value not in self.values.setdefault(key, []):
                    self.values[key].append(value)
                self.uses[value] = self.uses.get(value, 0) + 1

    def generate(self, seed: Task, n: int) -> tuple[list[Any], int | None]:
        template, params = seed.template, seed.params
        if not template or not params:
            return [None], None  # nothing to vary: one malformed proposal
        out: list[dict[str, Any]] = []
        for _ in range(n):
            new = dict(params)
            for key in self.rng.sample(sorted(params), k=self.rng.randint(1, len(params))):
                others = [v for v in self.values.get(key, []) if v != params[key]]
                if others:
                    new[key] = self.rng.choice(others)
            intent = template
            for key, value in new.items():
                intent = re.sub(r"\{\{\s*" + re.escape(key) + r"\s*\}\}", value, intent)
            out.append({"intent": intent, "params": new})
        cost = [sum(self.uses.get(v, 0) for v in c["params"].values()) for c in out]
        return out, min(range(len(out)), key=lambda i: cost[i])


def grounded_in(text: str, tasks: list[Task] = ()) -> Feasible:  # type: ignore[assignment]
    """A feasibility check: every parameter value of a candidate is grounded, i.e. a real task
    uses it or ``text`` (the recorded pages) shows it, so the dream has real pages to ground
    it on. (A model can invent a product the site does not sell.)"""
    haystack = text.lower()
    known = {v.lower() for t in tasks for v in t.params.values()}

    def check(task: Task) -> str | None:
        for key, value in task.params.items():
            if value.lower() not in known and value.lower() not in haystack:
                return f"no real task or recorded page has its {key}"
        return None

    return check
