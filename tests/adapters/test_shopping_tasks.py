"""Tests of the bundled WebArena-format shopping task set and of its oracle check."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from dreamgym_agents.adapters.shopping import oraclecheck
from dreamgym_agents.adapters.shopping.taskgen import (
    TEMPLATES,
    dump_json,
    generate_splits,
    generate_tasks,
)

TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "webarena_shopping"
REQUIRED = {
    "sites", "task_id", "require_login", "storage_state", "start_url", "geolocation",
    "intent_template", "instantiation_dict", "intent", "require_reset", "intent_template_id",
    "eval",
}
EVAL_KEYS = {"eval_types", "reference_answers", "reference_url", "program_html",
             "reference_answer_raw_annotation"}
OPS = {"click", "fill", "press", "select", "goto", "stop"}


@pytest.fixture(scope="module")
def split():
    return generate_tasks(seed=0)


@pytest.fixture(scope="module")
def committed():
    return {name: (TASK_DIR / f"{name}.json").read_text(encoding="utf-8")
            for name in ("train", "validation", "test")}


def test_committed_files_are_regenerated_identically(split, committed):
    splits = generate_splits(seed=0)
    assert (splits["train"], splits["test"]) == split
    for name in ("train", "validation", "test"):
        assert committed[name] == dump_json(splits[name]), name
    assert (TASK_DIR / "README.md").is_file()


def test_the_three_splits_are_disjoint_by_instance_and_intent():
    import json

    splits = generate_splits(seed=0)
    keys = {name: {(t["intent_template_id"], json.dumps(t["instantiation_dict"],
                                                         sort_keys=True)) for t in tasks}
            for name, tasks in splits.items()}
    intents = {name: {" ".join(t["intent"].lower().split()) for t in tasks}
               for name, tasks in splits.items()}
    ids = {name: {t["task_id"] for t in tasks} for name, tasks in splits.items()}
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        assert not keys[a] & keys[b] and not intents[a] & intents[b] and not ids[a] & ids[b]
    assert len(splits["validation"]) >= 80
    # most templates have validation instances (some have no values left after train and test)
    assert len({t["intent_template_id"] for t in splits["validation"]}) >= 20


def test_counts_and_split(split):
    train, test = split
    tasks = train + test
    assert len(TEMPLATES) >= 15
    assert len({t["intent_template_id"] for t in tasks}) == len(TEMPLATES)
    assert len(tasks) >= 300 and len(test) >= 60
    ids = [t["task_id"] for t in tasks]
    assert len(ids) == len(set(ids))
    assert not {t["intent"] for t in train} & {t["intent"] for t in test}
    per_template = Counter(t["intent_template_id"] for t in test)
    assert set(per_template) == {t.template_id for t in TEMPLATES}  # every template is tested
    kinds = Counter(tpl.kind for tpl in TEMPLATES)
    assert kinds["info"] >= 5 and kinds["navigation"] >= 3 and kinds["action"] >= 5


def test_every_config_has_webarena_fields(split):
    for task in split[0] + split[1]:
        assert REQUIRED <= set(task), task["task_id"]
        assert task["sites"] == ["shopping"]
        assert task["storage_state"] is None and task["geolocation"] is None
        assert task["start_url"].startswith("__SHOPPING__")
        assert isinstance(task["task_id"], int) and isinstance(task["intent_template_id"], int)
        assert "{{" not in task["intent"]
        for key, value in task["instantiation_dict"].items():
            assert "{{" + key + "}}" in task["intent_template"] and value in task["intent"]
        ev = task["eval"]
        assert EVAL_KEYS <= set(ev) and ev["url_note"] == "GOLD in PRED"
        assert ev["eval_types"] and set(ev["eval_types"]) <= {
            "string_match", "url_match", "program_html"}
        answers = ev["reference_answers"]
        if "string_match" in ev["eval_types"]:
            assert set(answers) in ({"exact_match"}, {"must_include"})
        else:
            assert answers is None
        if "url_match" in ev["eval_types"]:
            assert ev["reference_url"].startswith("__SHOPPING__/")
        for target in ev["program_html"]:
            assert target["url"] == "last" or target["url"].startswith("__SHOPPING__/")
            assert target["locator"].startswith("document.")
            assert set(target["required_contents"]) <= {"exact_match", "must_include"}
        assert task["require_reset"] == ("program_html" in ev["eval_types"])


def test_oracles_are_well_formed(split):
    for task in split[0] + split[1]:
        steps = task["oracle"]
        assert steps[-1]["op"] == "stop" and all(s["op"] in OPS for s in steps)
        for step in steps[:-1]:
            if step["op"] in ("click", "fill", "press", "select"):
                assert step["role"] and step["name"]


def test_graders_follow_webarena_semantics():
    assert oraclecheck.string_match({"exact_match": "$1,299.00"}, ' "$1,299.00" ')
    assert not oraclecheck.string_match({"exact_match": "$1,299.00"}, "It costs $1,299.00")
    assert oraclecheck.string_match({"must_include": ["4.3"]}, "Rated 4.3 out of 5")
    assert not oraclecheck.string_match({"must_include": ["Alice", "Bob"]}, "alice")
    base = "http://127.0.0.1:9/i/abc"
    assert oraclecheck.url_match(f"{base}/search?q=usb+cable", f"{base}/search?q=usb%20cable")
    assert oraclecheck.url_match(f"{base}/category/laptops?sort=price_asc",
                                 f"{base}/category/laptops?sort=price_asc&page=2")
    assert not oraclecheck.url_match(f"{base}/category/laptops?sort=price_asc",
                                     f"{base}/category/laptops")
    assert not oraclecheck.url_match(f"{base}/product/A-1", f"{base}/product/B-1")
    assert oraclecheck.contents_match({"must_include": ["x |OR| y"]}, "only Y here")
    assert oraclecheck.contents_match({"exact_match": "0"}, "0")


def _sample(size: int = 40) -> list[dict]:
    """One task of every template, topped up to ``size`` with evenly spaced others."""
    tasks = oraclecheck.load_tasks(TASK_DIR)
    chosen = oraclecheck.sample_tasks(tasks, 1)
    rest = [t for t in tasks if t not in chosen]
    step = max(1, len(rest) // max(1, size - len(chosen)))
    chosen += rest[::step][: max(0, size - len(chosen))]
    return sorted(chosen, key=lambda t: t["task_id"])


@pytest.mark.browser
def test_oracles_solve_a_sample_in_chromium():
    if not os.path.exists(oraclecheck.CHROMIUM):
        pytest.skip(f"{oraclecheck.CHROMIUM} does not exist (apt-get install chromium)")
    sample = _sample()
    assert len({t["intent_template_id"] for t in sample}) == len(TEMPLATES)
    results = oraclecheck.check_tasks(sample)
    failures = [r for r in results if not r.passed]
    assert not failures, oraclecheck.summarize(results)


@pytest.mark.browser
def test_doing_nothing_with_a_wrong_answer_fails_every_sampled_task():
    if not os.path.exists(oraclecheck.CHROMIUM):
        pytest.skip(f"{oraclecheck.CHROMIUM} does not exist (apt-get install chromium)")
    results = oraclecheck.check_tasks(_sample(), negative=True)
    assert all(r.passed for r in results), oraclecheck.summarize(results)
