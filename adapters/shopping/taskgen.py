"""Generate the bundled WebArena-format task set for the shopping site from its seeded catalog.

``python -m dreamgym_agents.adapters.shopping.taskgen --seed 0 --out tasks/webarena_shopping``
writes ``train.json``, ``validation.json``, ``test.json`` and ``README.md``; the output depends
only on the seed (sorted keys, fixed split), so regenerating yields byte-identical files.

The validation split is drawn after train and test, from new instances of every template (other
draws of the template's values) that neither train nor test holds: tuning reads it, test is kept
for reported figures, and nothing trained on train (the shipped bundle included) has seen it.
Templates are shared by the three splits: the bundled site has one template per kind of
question or action, and holding whole templates out would leave the policy no demonstration of
them.

Each task is a WebArena task config plus ``oracle``, a list of steps that solves it (see
:mod:`~dreamgym_agents.adapters.shopping.taskkit`). The config's keys are WebArena's: ``sites``,
``task_id``, ``require_login``, ``storage_state``, ``start_url``, ``geolocation``,
``intent_template``, ``instantiation_dict``, ``intent``, ``require_reset``,
``intent_template_id`` and ``eval``. ``__SHOPPING__`` in URLs is replaced at run time by the
base URL of a fresh site instance.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from dreamgym_agents.adapters.shopping import task_actions, task_catalog, task_orders
from dreamgym_agents.adapters.shopping.data import Catalog, generate_catalog
from dreamgym_agents.adapters.shopping.taskkit import SITE, Draft, Template

TEMPLATES: list[Template] = sorted(
    task_catalog.TEMPLATES + task_orders.TEMPLATES + task_actions.TEMPLATES,
    key=lambda t: t.template_id,
)
TEST_FRACTION = 0.22
"""Share of each template's instances that go to the test split (at least one)."""
VALIDATION_FIRST_ID = 1000
"""Task ids of the validation split start here (train and test use 0 to 515)."""
SPLIT_NAMES = ("train", "validation", "test")


def make_config(template: Template, draft: Draft, task_id: int) -> dict[str, Any]:
    """Build one WebArena task config (plus ``oracle``) from a template instantiation."""
    intent = template.intent_template
    for key, value in draft.values.items():
        intent = intent.replace("{{" + key + "}}", value)
    if "{{" in intent:
        raise ValueError(f"template {template.template_id}: unfilled placeholder in {intent!r}")
    eval_types = [name for name, used in (("string_match", draft.answers is not None),
                                          ("url_match", bool(draft.reference_url)),
                                          ("program_html", bool(draft.program_html))) if used]
    if not draft.oracle or draft.oracle[-1]["op"] != "stop":
        raise ValueError(f"template {template.template_id}: the oracle must end with stop")
    return {
        "sites": ["shopping"],
        "task_id": task_id,
        "require_login": draft.require_login,
        "storage_state": None,
        "start_url": SITE + draft.start_path,
        "geolocation": None,
        "intent_template": template.intent_template,
        "instantiation_dict": draft.values,
        "intent": intent,
        "require_reset": template.kind == "action",
        "intent_template_id": template.template_id,
        "eval": {
            "eval_types": eval_types,
            "reference_answers": draft.answers,
            "reference_url": draft.reference_url,
            "program_html": draft.program_html,
            "url_note": "GOLD in PRED",
            "string_note": "",
            "reference_answer_raw_annotation": draft.raw,
        },
        "oracle": draft.oracle,
    }


def generate_tasks(
    seed: int = 0, catalog: Catalog | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return ``(train, test)`` task configs for the catalog of ``seed``.

    Task ids run over all templates in template-id order; each template's test share is drawn
    with its own ``random.Random``, so adding a template never reshuffles the others.
    """
    catalog = catalog or generate_catalog(seed)
    train: list[dict[str, Any]] = []
    test: list[dict[str, Any]] = []
    task_id = 0
    for template in TEMPLATES:
        drafts = template.build(catalog, random.Random(seed * 1000 + template.template_id))
        if not drafts:
            raise ValueError(f"template {template.template_id} produced no tasks")
        n_test = max(1, round(TEST_FRACTION * len(drafts)))
        split_rng = random.Random(seed * 1000 + 500 + template.template_id)
        test_index = set(split_rng.sample(range(len(drafts)), n_test))
        for index, draft in enumerate(drafts):
            config = make_config(template, draft, task_id)
            (test if index in test_index else train).append(config)
            task_id += 1
    return train, test


def generate_validation(seed: int, train: list[dict[str, Any]], test: list[dict[str, Any]],
                        catalog: Catalog | None = None) -> list[dict[str, Any]]:
    """The validation split: per template, as many new instances as its test share (fewer
    where the template has run out of values), none equal to a train or test task by
    parameters or by intent. Each template draws with its own ``random.Random``."""
    catalog = catalog or generate_catalog(seed)
    taken_params = {(c["intent_template_id"], json.dumps(c["instantiation_dict"],
                                                         sort_keys=True))
                    for c in (*train, *test)}
    taken_intents = {_norm(c["intent"]) for c in (*train, *test)}
    wanted = {}
    for config in test:
        wanted[config["intent_template_id"]] = wanted.get(config["intent_template_id"], 0) + 1
    out: list[dict[str, Any]] = []
    task_id = VALIDATION_FIRST_ID
    for template in TEMPLATES:
        drafts = template.build(catalog, random.Random(seed * 1000 + 700 + template.template_id))
        kept = 0
        for draft in drafts:
            if kept >= wanted.get(template.template_id, 0):
                break
            config = make_config(template, draft, task_id)
            key = (template.template_id, json.dumps(config["instantiation_dict"],
                                                    sort_keys=True))
            if key in taken_params or _norm(config["intent"]) in taken_intents:
                continue
            taken_params.add(key)
            taken_intents.add(_norm(config["intent"]))
            out.append(config)
            task_id += 1
            kept += 1
    return out


def generate_splits(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``{"train", "validation", "test"}`` task configs for the catalog of ``seed``."""
    catalog = generate_catalog(seed)
    train, test = generate_tasks(seed, catalog)
    return {"train": train, "validation": generate_validation(seed, train, test, catalog),
            "test": test}


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def dump_json(tasks: list[dict[str, Any]]) -> str:
    """Commit-stable JSON text (sorted keys, indent 1, trailing newline)."""
    return json.dumps(tasks, indent=1, sort_keys=True) + "\n"


def readme(splits: dict[str, list[dict[str, Any]]], seed: int) -> str:
    """The task set's README: what it is, how to regenerate, and the template table."""
    train, validation, test = (splits[n] for n in SPLIT_NAMES)
    counts: dict[int, list[int]] = {t.template_id: [0, 0, 0] for t in TEMPLATES}
    for split, tasks in enumerate((train, validation, test)):
        for task in tasks:
            counts[task["intent_template_id"]][split] += 1
    rows = []
    for t in TEMPLATES:
        example = next(c for c in train + test if c["intent_template_id"] == t.template_id)
        evaluator = ", ".join(example["eval"]["eval_types"])
        answers = example["eval"]["reference_answers"] or {}
        if answers:
            evaluator += f" ({next(iter(answers))})"
        intent = t.intent_template.replace("|", "\\|")
        c = counts[t.template_id]
        rows.append(f"| {t.template_id} | {t.name} | {t.kind} | {evaluator} | "
                    f"{c[0]} | {c[1]} | {c[2]} | {intent} |")
    return f"""# webarena_shopping — the bundled shopping task set

WebArena-format tasks for the bundled shopping site ("One Stop Market",
`dreamgym_agents.adapters.shopping`), generated from the catalog of seed {seed}:
{len(train)} train, {len(validation)} validation and {len(test)} test tasks from
{len(TEMPLATES)} intent templates.
Every task config has WebArena's fields plus `oracle`, a list of steps that solves it.
`__SHOPPING__` stands for the base URL of a fresh site instance (one per episode);
`require_login: true` means the episode starts signed in as Emma Lopez.

The splits are disjoint by task instance (parameters and intent). Validation tasks are new
instances drawn after train and test (task ids from {VALIDATION_FIRST_ID}): tuning (recipes,
presets, design choices) reads validation, reported figures read test, and nothing trained on
train has seen either. Templates are shared by the three splits (one template per kind of
question or action: holding templates out would leave no demonstration of them).

Regenerate (byte-identical for the same seed) and replay every oracle in Chromium:

    python -m dreamgym_agents.adapters.shopping.taskgen --seed {seed} --out tasks/webarena_shopping
    python -m dreamgym_agents.adapters.shopping.oraclecheck

Answers follow the site's formats: prices `$1,234.56`, dates `Mar 5, 2025`, statuses as shown
(`Complete`). `exact_match` is used for values copied from a page, `must_include` where the
answer may be phrased freely (a rating, a date, a name, a computed sum). State-changing tasks
(`require_reset: true`) are graded by `program_html` targets that read the cart, the next order's
page (`/account/orders/<next id>`), the account page or the product's newest review.

| id | template | kind | evaluator | train | validation | test | intent template |
|---:|---|---|---|---:|---:|---:|---|
{chr(10).join(rows)}
"""


def write_tasks(out_dir: str | Path, seed: int = 0) -> dict[str, int]:
    """Write ``train.json``, ``validation.json``, ``test.json`` and ``README.md``; return the
    counts."""
    splits = generate_splits(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, tasks in splits.items():
        (out / f"{name}.json").write_text(dump_json(tasks), encoding="utf-8")
    (out / "README.md").write_text(readme(splits, seed), encoding="utf-8")
    return {name: len(tasks) for name, tasks in splits.items()}


def main(argv: list[str] | None = None) -> int:
    """CLI: write the task set, or with ``--check`` compare it with the files on disk."""
    parser = argparse.ArgumentParser(description="Generate the bundled shopping task set.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="tasks/webarena_shopping")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when the files on disk differ")
    args = parser.parse_args(argv)
    if args.check:
        splits = generate_splits(args.seed)
        stale = [f"{name}.json" for name, tasks in splits.items()
                 if not (Path(args.out) / f"{name}.json").is_file()
                 or (Path(args.out) / f"{name}.json").read_text(encoding="utf-8")
                 != dump_json(tasks)]
        print("up to date" if not stale else f"stale: {', '.join(stale)}")
        return 1 if stale else 0
    counts = write_tasks(args.out, args.seed)
    print("wrote " + ", ".join(f"{n} {name}" for name, n in counts.items())
          + f" tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
