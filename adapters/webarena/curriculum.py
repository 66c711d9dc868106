"""The web family's task generator for the curriculum (its ``task_generator`` hook).

A curriculum's variant of a seed task is another instance of the seed's template. The generic
generator (:class:`~dreamgym_agents.rl.curriculum.TemplateTaskGenerator`) fills the template
with other values and leaves the variant without an evaluator: nobody knows the answer to
"what is the price of <another product>". On the bundled shop the template's own instantiation
does: each template of the shop's task set (:mod:`dreamgym_agents.adapters.shopping.taskgen`)
draws its instances from the site's seeded catalog with their reference answers, URLs and
checks. So a variant of a shop task is a new draft of its template, with the evaluator a real
task of that template would have; the dream then judges its stops by that evaluator
(:mod:`~dreamgym_agents.adapters.webarena.verdict`) as it does the train tasks', and a policy
cannot learn from variants what the real site would not pay for. Variants equal to a known
task (train, validation or test) are never proposed; tasks of real WebArena sites, and shop
tasks of templates the shop no longer has, get the generic generator's variants.
"""

from __future__ import annotations

import json
import random
from typing import Any

from dreamgym_agents.types import Task

CATALOG_SEED = 0
"""The catalog the shipped task set was drawn from (``tasks/webarena_shopping/README.md``)."""


class ShopTaskGenerator:
    """New drafts of a shop task's template, with their evaluators (see the module docstring).

    Args:
        tasks: The tasks the curriculum starts from.
        seed: Seed of the draws.
        avoid: More tasks never to propose (the held-out splits').
        fallback: The generator of tasks that are not the shop's.
    """

    def __init__(self, tasks: list[Task], seed: int = 0, avoid: list[Task] = (),
                 fallback: Any = None) -> None:
        from dreamgym_agents.adapters.shopping.data import generate_catalog
        from dreamgym_agents.adapters.shopping.taskgen import TEMPLATES

        self.rng = random.Random(seed)
        self.fallback = fallback
        self.templates = {t.template_id: t for t in TEMPLATES}
        self.catalog: Any = None
        self._catalog = lambda: generate_catalog(CATALOG_SEED)
        self.taken = {_key(t.config) for t in [*tasks, *avoid]}
        self.taken_intents = {_norm(t.intent) for t in [*tasks, *avoid]}

    def generate(self, seed: Task, n: int) -> tuple[list[Any], int | None]:
        from dreamgym_agents.adapters.shopping.taskgen import make_config

        template = self.templates.get(seed.config.get("intent_template_id"))
        if template is None or seed.config.get("sites") != ["shopping"] or \
                template.intent_template != seed.config.get("intent_template"):
            if self.fallback is None:
                return [None], None
            return self.fallback.generate(seed, n)
        if self.catalog is None:
            self.catalog = self._catalog()
        drafts = template.build(self.catalog, random.Random(self.rng.randrange(1 << 30)))
        self.rng.shuffle(drafts)
        out: list[Any] = []
        for draft in drafts:
            if len(out) >= n:
                break
            config = make_config(template, draft, 0)
            if _key(config) in self.taken or _norm(config["intent"]) in self.taken_intents:
                continue
            self.taken.add(_key(config))
            self.taken_intents.add(_norm(config["intent"]))
            out.append({"intent": config["intent"], "params": dict(draft.values),
                        "config": {"eval": config["eval"], "start_url": config["start_url"],
                                   "require_login": config["require_login"],
                                   "intent": config["intent"],
                                   "instantiation_dict": config["instantiation_dict"]}})
        if not out:
            return [None], None  # the template has no instance left
        return out, 0


def _key(config: dict[str, Any]) -> str:
    return json.dumps([config.get("intent_template_id"),
                       config.get("instantiation_dict") or {}], sort_keys=True)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())
