"""The web family's verdict of a dream step (the task's own evaluator on what the dream knows)
and its curriculum variants with evaluators of their own."""

from __future__ import annotations

import pytest

from dreamgym_agents.adapters.webarena.family import WebArenaFamily
from dreamgym_agents.heldout import HeldOut
from dreamgym_agents.rl.curriculum import Curriculum, CurriculumConfig


@pytest.fixture(scope="module")
def family():
    made = WebArenaFamily(environ={})
    yield made
    made.close()


def answer_of(task) -> str:
    return task.config["oracle"][-1]["answer"]


def test_a_stop_is_judged_by_the_tasks_own_evaluator(family):
    train = family.load_tasks("train")
    answers = [t for t in train if t.config["eval"]["eval_types"] == ["string_match"]][:10]
    page = "URL: __SHOPPING__/product/x\nTitle: A product"
    for task in answers:
        right = f"send_msg_to_user({answer_of(task)!r})"
        assert family.dream_verdict(task, page, right) is True
        assert family.dream_verdict(task, page, "send_msg_to_user('no idea')") is False
        assert family.dream_verdict(task, page, "click('12')") is False  # no stop: no success
    urls = [t for t in train if t.config["eval"]["eval_types"] == ["url_match"]][:5]
    for task in urls:
        there = f"URL: {task.config['eval']['reference_url']}\nTitle: the page"
        assert family.dream_verdict(task, there, "send_msg_to_user('done')") is True
        assert family.dream_verdict(task, page, "send_msg_to_user('done')") is False
    edits = [t for t in train if "program_html" in t.config["eval"]["eval_types"]][:5]
    assert edits and all(family.dream_verdict(t, page, "send_msg_to_user('done')") is None
                         for t in edits)  # the site's hidden state: the model's verdict stands


def test_shop_variants_have_evaluators_and_are_never_held_out_tasks(family):
    train = family.load_tasks("train")
    generator, feasible = family.task_generator(train, seed=0)
    curriculum = Curriculum(CurriculumConfig(), generator, train, feasible=feasible, seed=0,
                            held_out=HeldOut.for_family(family))
    held = {(t.config["intent_template_id"], tuple(sorted(t.params.items())))
            for s in ("validation", "test") for t in family.load_tasks(s)}
    made = []
    for seed in train[::7]:
        candidates, _ = generator.generate(seed, 3)
        for raw in candidates:
            task, _ = curriculum.check(seed, raw)
            if task is not None:
                made.append(task)
    assert len(made) >= 10
    for task in made:
        assert task.split == "synthetic" and task.config["eval"]["eval_types"]
        key = (task.config["intent_template_id"], tuple(sorted(task.params.items())))
        assert key not in held
        kinds = task.config["eval"]["eval_types"]
        if kinds == ["string_match"]:  # its own reference judges its stops in the dream
            reference = task.config["eval"]["reference_answers"]
            value = next(iter(reference.values()))
            value = value[0] if isinstance(value, list) else value
            assert family.dream_verdict(task, "URL: x\nTitle: y",
                                        f"send_msg_to_user({value!r})") is True
