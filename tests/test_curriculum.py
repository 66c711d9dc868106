"""The curriculum (paper §4.2): reward variance, seed selection, the λ mix, and the task
generators' candidates: accepted, malformed and infeasible ones counted."""

from __future__ import annotations

import json

import pytest

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.gateway.llm import Gateway, LLMConfig
from dreamgym_agents.rl.curriculum import (
    Curriculum,
    CurriculumConfig,
    LLMTaskGenerator,
    TemplateTaskGenerator,
    grounded_in,
    parse_candidates,
    reward_variance,
    select_seeds,
    synthetic_slots,
)
from dreamgym_agents.types import Task

TEMPLATE = "What is the price of {{product}}?"


def price_task(i: int, product: str) -> Task:
    return Task(task_id=str(i), family="webarena", intent=TEMPLATE.replace("{{product}}", product),
                split="train",
                template=TEMPLATE, params={"product": product},
                config={"start_url": "__SHOPPING__", "eval": {"eval_types": ["string_match"]}},
                oracle=[{"op": "stop", "answer": "$1"}])


PRODUCTS = ["Red Kettle", "Blue Lamp", "Green Chair", "Black Desk"]
TASKS = [price_task(i, p) for i, p in enumerate(PRODUCTS)]


def test_reward_variance_of_groups():
    assert reward_variance([1, 0, 1, 0]) == pytest.approx(0.25)
    assert reward_variance([1, 1, 1, 1]) == 0.0
    assert reward_variance([0, 0, 0, 1]) == pytest.approx(0.1875)
    assert reward_variance([1.0]) == 0.0


def test_seeds_are_the_highest_variance_tasks():
    variances = {"a": 0.25, "b": 0.0, "c": 0.1875, "d": 0.25, "e": 0.01}
    assert select_seeds(variances, 2) == ["a", "d"]  # ties broken by id
    assert select_seeds(variances, 10) == ["a", "d", "c", "e"]  # zero variance never a seed
    assert select_seeds(variances, 10, min_variance=0.1) == ["a", "d", "c"]


def test_lambda_bounds_the_synthetic_share():
    assert synthetic_slots(8, 0.25, available=10) == 2
    assert synthetic_slots(8, 0.25, available=1) == 1
    assert synthetic_slots(3, 0.25, available=5) == 0
    assert synthetic_slots(4, 1.0, available=9) == 4
    with pytest.raises(ConfigError, match="λ"):
        CurriculumConfig(synthetic_share=1.5)


class Scripted:
    """A generator that proposes fixed candidates and picks one."""

    def __init__(self, candidates, choice=None):
        self.candidates, self.choice, self.seeds = candidates, choice, []

    def generate(self, seed, n):
        self.seeds.append(seed.task_id)
        return list(self.candidates), self.choice


def test_variants_of_high_variance_seeds_join_the_mix():
    gen = Scripted([
        "not a dict",
        {"intent": "What is the price of {{product}}?", "params": {}},  # placeholder left
        {"intent": "What is the price of Red Kettle?", "params": {"product": "Red Kettle"}},
        {"intent": "What is the price of Purple Sofa?", "params": {"product": "Purple Sofa"}},
        {"intent": "What is the price of Blue Lamp and Black Desk together?",
         "params": {"product": "Blue Lamp"}},
    ], choice=3)
    cur = Curriculum(CurriculumConfig(seeds_per_round=1, synthetic_share=0.5), gen, TASKS,
                     feasible=grounded_in("[3] link 'Blue Lamp'", TASKS), seed=0)
    cur.observe(TASKS[:3], [[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 1, 0]])
    accepted = cur.refresh()
    assert gen.seeds == ["2"]  # the highest variance: [1, 0, 1, 0]
    s = cur.stats
    assert (s.proposed, s.malformed, s.infeasible, s.accepted) == (5, 2, 2, 1)
    assert s.reasons["infeasible: duplicates a known task"] == 1
    assert any("Purple Sofa" not in k and "product" in k for k in s.reasons)  # not grounded
    (variant,) = accepted
    assert variant.intent.endswith("Blue Lamp and Black Desk together?")  # the choice was
    assert variant.split == "synthetic" and variant.oracle is None  # infeasible: the first
    assert "eval" not in variant.config and variant.config["synthetic_of"] == "2"
    batch = cur.mix(TASKS)
    assert sum(t.split == "synthetic" for t in batch) == 1  # the pool holds one
    cur.pool = cur.pool * 5
    assert sum(t.split == "synthetic" for t in cur.mix(TASKS)) == 2  # λ = 0.5 of 4 groups


def test_disabled_curriculum_never_mixes():
    gen = Scripted([{"intent": "What is the price of Blue Lamp now?", "params": {}}])
    cur = Curriculum(CurriculumConfig(enabled=False), gen, TASKS)
    cur.observe(TASKS[:1], [[1, 0]])
    assert cur.refresh() == [] and cur.mix(TASKS) == TASKS and not gen.seeds


def test_template_generator_fills_the_seed_template_with_other_values():
    gen = TemplateTaskGenerator(TASKS, seed=1)
    candidates, choice = gen.generate(TASKS[0], 3)
    assert len(candidates) == 3 and choice is not None
    for c in candidates:
        assert c["intent"].startswith("What is the price of ") and "{{" not in c["intent"]
        assert c["params"]["product"] in PRODUCTS and c["params"]["product"] != "Red Kettle"
    untemplated = Task(task_id="x", family="webarena", intent="Do something")
    assert gen.generate(untemplated, 3) == ([None], None)


def test_llm_generator_reads_json_and_counts_unreadable_answers():
    answer = json.dumps({"candidates": [
        {"intent": "What is the price of Green Chair?", "params": {"product": "Green Chair"}},
        {"intent": "What is the price of Black Desk?", "params": {"product": "Black Desk"}}],
        "choice": 1})
    gateway = Gateway(LLMConfig(model="openai/gpt-4o-mini", mock_response=f"Sure:\n{answer}"))
    gen = LLMTaskGenerator(gateway)
    assert "Red Kettle" in gen.messages(TASKS[0], 2)[0]["content"]
    from dreamgym_agents.episodes.env import make_family

    located = LLMTaskGenerator(gateway, start_key=make_family("webarena").state_format().start_key)
    assert "it starts at: __SHOPPING__" in located.messages(TASKS[0], 2)[0]["content"]
    known = [t for t in TASKS if t.task_id in ("0", "1")]
    cur = Curriculum(CurriculumConfig(seeds_per_round=1), gen, known)
    cur.observe(known, [[1, 0], [0, 0]])
    (variant,) = cur.refresh()
    assert variant.intent == "What is the price of Black Desk?"
    gateway.close()
    assert parse_candidates("no json here") == ([None], None)
    assert parse_candidates('{"candidates": "x"}') == ([None], None)


def test_held_out_tasks_never_join_the_curriculum():
    """A generator that proposes the family's validation and test questions (what the template
    generator did: 21% of its accepted variants were exact test questions) gets every one of
    them rejected and counted; a new variant still gets through."""
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.heldout import HeldOut

    family = make_family("webarena")
    train = family.load_tasks("train")
    test, validation = family.load_tasks("test"), family.load_tasks("validation")
    held_out = HeldOut.for_family(family)
    assert held_out.splits == ("validation", "test")
    seed = next(t for t in train if t.config["intent_template_id"] == 1)  # product price
    same_template = [t for t in test + validation
                     if t.config["intent_template_id"] == 1]

    class Leaky:
        """Proposes held-out tasks: verbatim, re-spaced and re-cased, then one new variant."""

        def generate(self, seed_task, n):
            out = [{"intent": t.intent, "params": t.params} for t in same_template[:2]]
            out.append({"intent": "  " + same_template[2].intent.upper() + "  ",
                        "params": same_template[2].params})
            # same template and values, other wording: still the held-out instance
            out.append({"intent": f"Tell me the price of {same_template[3].params['product']}",
                        "params": same_template[3].params})
            out.append({"intent": "What is the price of Nimbus Test Kettle, 1.7 L?",
                        "params": {"product": "Nimbus Test Kettle, 1.7 L"}})
            return out, 0

    curriculum = Curriculum(CurriculumConfig(seeds_per_round=1), Leaky(), train, seed=0,
                            held_out=held_out)
    curriculum.observe([seed], [[0.0, 1.0]])
    accepted = curriculum.refresh()
    assert [t.intent for t in accepted] == ["What is the price of Nimbus Test Kettle, 1.7 L?"]
    assert curriculum.stats.held_out == 4 and held_out.rejected["curriculum"] == 4
    assert curriculum.stats.reasons["infeasible: a held-out (validation or test) task"] == 4
    assert not any(held_out.matches(t) for t in curriculum.pool)


def test_the_template_generator_alone_would_propose_test_questions():
    """Why the guard exists: filling train templates with train values reproduces test
    instances (their values are shared), so without the guard they reach training."""
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.heldout import HeldOut

    family = make_family("webarena")
    train = family.load_tasks("train")
    held_out = HeldOut.for_family(family)
    generator = TemplateTaskGenerator(train, seed=0)
    proposed = [c for t in train[:120] for c in generator.generate(t, 4)[0] if c]
    leaks = [c for c in proposed if held_out.matches(Task("x", "webarena", c["intent"]))]
    assert len(leaks) >= 5  # verbatim held-out questions among the proposals


def test_a_model_named_as_the_generator_proposes_through_its_gateway():
    assert CurriculumConfig().llm_generator() is None  # the family's generator
    cfg = CurriculumConfig(generator="openai/some-model",
                           generator_llm={"api_base": "http://127.0.0.1:9/v1",
                                          "temperature": 0.7})
    gen = cfg.llm_generator()
    assert isinstance(gen, LLMTaskGenerator)
    assert gen.gateway.cfg.model == "openai/some-model" and gen.gateway.cfg.temperature == 0.7
    assert gen.gateway.cfg.api_base == "http://127.0.0.1:9/v1"
    with pytest.raises(ConfigError, match="unknown key.s. tempo"):
        CurriculumConfig(generator="openai/some-model", generator_llm={"tempo": 1})
    with pytest.raises(ConfigError, match="the model is curriculum.generator"):
        CurriculumConfig(generator="openai/m", generator_llm={"model": "openai/other"})
    with pytest.raises(ConfigError, match="empty model string"):
        CurriculumConfig(generator=" ")



def cart_task(i: int, product: str) -> Task:
    intent = f"Add the {product} to my shopping cart and check out"
    return Task(task_id=f"c{i}", family="webarena", intent=intent, split="train",
                config={"start_url": "__SHOPPING__"})


def test_kmeans_splits_clear_groups_the_same_way_each_time():
    from dreamgym_agents.rl.curriculum import kmeans

    points = [[1, 0], [0.99, 0.1], [0.98, -0.1], [0, 1], [0.1, 0.99], [-0.1, 0.98]]
    labels = kmeans(points, 2, seed=3)
    assert labels[:3] == [labels[0]] * 3 and labels[3:] == [labels[3]] * 3
    assert labels[0] != labels[3] and kmeans(points, 2, seed=3) == labels
    assert kmeans(points, 10) and len(set(kmeans(points, 10))) <= 6  # at most one per point


def test_ppo_groups_tasks_by_meaning_and_seeds_from_the_varied_cluster():
    """PPO plays each task once: no task has a variance of its own, so the clusters' do."""
    carts = [cart_task(i, p) for i, p in enumerate(PRODUCTS)]
    tasks = TASKS + carts
    gen = Scripted([{"intent": "What is the price of Purple Sofa?",
                     "params": {"product": "Purple Sofa"}}])
    cur = Curriculum(CurriculumConfig(seeds_per_round=1, clusters=2), gen, tasks, seed=0,
                     algorithm="ppo")
    assert cur.grouping == "cluster"
    assert len({cur.cluster[t.task_id] for t in TASKS}) == 1  # the price questions together
    assert len({cur.cluster[t.task_id] for t in carts}) == 1
    assert cur.cluster["0"] != cur.cluster["c0"]
    cur.observe(tasks, [[1], [0], [1], [0], [0], [0], [0], [0]])  # one episode each
    assert cur.cluster_variance() == {cur.cluster["0"]: 0.25, cur.cluster["c0"]: 0.0}
    (variant,) = cur.refresh()
    assert gen.seeds[0] in {t.task_id for t in TASKS}  # a price question: its cluster varied
    # a variant counts in its seed's cluster
    cur.observe([variant], [[1]])
    assert cur.cluster_variance()[cur.cluster["0"]] == pytest.approx(0.24)
    # GRPO's grouping on the same single rewards has no seed at all
    plain = Curriculum(CurriculumConfig(seeds_per_round=1), Scripted([]), tasks, seed=0)
    plain.observe(tasks, [[1], [0], [1], [0], [0], [0], [0], [0]])
    assert plain.grouping == "task" and plain.seeds() == []
    with pytest.raises(ConfigError, match="grouping"):
        CurriculumConfig(grouping="embedding")
    with pytest.raises(ConfigError, match="curriculum.embedding"):
        CurriculumConfig(embedding="bert")
