"""Held-out tasks: recognised by instruction or by template and values, and kept out of the
warm start's data by the pipeline."""

from __future__ import annotations

from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.heldout import HeldOut, task_keys
from dreamgym_agents.pipeline.run import Pipeline, preset_config
from dreamgym_agents.types import Task, Trajectory, Transition, write_trajectories


def task(intent: str, template: str = "", **params: str) -> Task:
    return Task("t", "webarena", intent, template=template, params=params)


def test_a_held_out_task_is_recognised_by_intent_or_template_and_values():
    held = HeldOut.of([task("What is the price of Red Kettle?",
                            "What is the price of {{product}}?", product="Red Kettle")])
    assert held.matches(task("what is the  price of red kettle"))  # case, spaces, punctuation
    assert held.matches(task("Price of the Red Kettle, please",
                             "What is the price of {{product}}?", product=" red kettle"))
    assert not held.matches(task("What is the price of Blue Lamp?",
                                 "What is the price of {{product}}?", product="Blue Lamp"))
    assert not held.matches(task("How many reviews does Red Kettle have?",
                                 "How many reviews does {{product}} have?", product="Red Kettle"))
    kept = held.keep([task("What is the price of Red Kettle?"), task("Other")], "x")
    assert [t.intent for t in kept] == ["Other"] and held.rejected == {"x": 1}


def test_the_bundled_family_holds_out_validation_and_test_but_not_train():
    family = make_family("webarena")
    held = HeldOut.for_family(family)
    assert held.splits == ("validation", "test")
    assert not any(held.matches(t) for t in family.load_tasks("train"))
    assert all(held.matches(t) for t in family.load_tasks("test"))
    assert all(held.matches(t) for t in family.load_tasks("validation"))


def test_the_warm_start_never_sees_a_held_out_episode(tmp_path):
    family = make_family("webarena")
    train, test = family.load_tasks("train")[0], family.load_tasks("test")[0]

    def episode(t: Task, eid: str) -> Trajectory:
        step = Transition(eid, 0, t.task_id, "URL: x", "send_msg_to_user('1')", "URL: x",
                          reward=1.0, done=True, success=True)
        return Trajectory(eid, t, [step], success=True, reward=1.0, agent="noisy")

    folder = tmp_path / "collect"
    (folder / "noisy").mkdir(parents=True)
    write_trajectories(folder / "noisy" / "trajectories.jsonl",
                       [episode(train, "a"), episode(test, "b")])
    pipe = Pipeline(preset_config("quick", task="webarena"), tmp_path / "run")
    pipe.state["done"]["experience"] = {"offline": str(folder)}
    kept = pipe.offline_episodes()
    assert [t.episode_id for t in kept] == ["a"]
    assert pipe.held_out().rejected == {"offline_episodes": 1}


def test_a_family_says_what_makes_a_task_the_same_instance():
    """ALFWorld's instructions recur across games (train and test alike): its key is the game,
    so no train task is held out for sharing a test instruction, and a test game is."""
    family = make_family("alfworld")
    held_out = HeldOut.for_family(family)
    train, test = family.load_tasks("train"), family.load_tasks("test")
    shared = {t.intent for t in train} & {t.intent for t in test}
    assert shared, "the task set no longer shares instructions: this test checks nothing"
    assert not any(held_out.matches(t) for t in train)
    assert all(held_out.matches(t) for t in test)


def test_a_tasks_template_and_values_are_typed_fields_and_old_records_migrate():
    # a family of any kind: the core reads the typed fields, never a family's config keys
    mine = Task("t", "myfamily", "Buy a red hat", template="Buy a {{thing}}",
                params={"thing": " red hat ", "empty": ""},
                config={"intent_template": "unrelated", "instantiation_dict": {"thing": "x"}})
    assert mine.params == {"thing": "red hat"}
    assert "instance:buy a {{thing}}|[('thing', 'red hat')]" in task_keys(mine)
    assert Task.from_dict(mine.to_dict()) == mine
    # a record written before the typed fields carried them in WebArena's config keys
    old = {"task_id": "7", "family": "webarena", "intent": "Buy a red hat",
           "config": {"intent_template": "Buy a {{thing}}", "intent_template_id": 3,
                      "instantiation_dict": {"thing": "red hat"}}}
    migrated = Task.from_dict(old)
    assert (migrated.template, migrated.template_id, migrated.params) == (
        "Buy a {{thing}}", "3", {"thing": "red hat"})
