"""Renamed copies of recorded ALFWorld episodes (the experience model's extra examples): the same
game under other names, consistent everywhere, and traceable to the episode they copy."""

from __future__ import annotations

import pytest

from dreamgym_agents.types import Task, Trajectory, Transition

pytest.importorskip("alfworld")

from test_alfworld_belief import OPENING, STEPS, states  # noqa: E402

from dreamgym_agents.adapters.alfworld.belief import (  # noqa: E402
    Belief,
    Rules,
    kind_of,
    rename_words,
    renamed_state,
)
from dreamgym_agents.adapters.alfworld.rename import RENAMED_FROM, RENAMES, renamed  # noqa: E402


def episode() -> Trajectory:
    rendered = states()
    task = Task(task_id="alfworld.train.7", family="alfworld",
                intent="put a cool apple in countertop", split="train",
                config={"intent": "put a cool apple in countertop"})
    steps = [Transition(episode_id="ep", step=i, task_id=task.task_id, state=rendered[i],
                        action=command, next_state=rendered[i + 1],
                        reward=float(i == len(STEPS) - 1), done=i == len(STEPS) - 1,
                        success=i == len(STEPS) - 1, info={"feedback": feedback})
             for i, (command, feedback) in enumerate(STEPS)]
    return Trajectory(episode_id="ep", task=task, transitions=steps, success=True)


def test_rename_words_swaps_whole_words_at_once():
    names = {"apple": "egg", "egg": "apple"}
    assert rename_words("take apple 1; an egg 2; applesliced 1", names) == \
        "take egg 1; an apple 2; applesliced 1"


def test_a_renamed_state_keeps_its_lists_in_the_games_order():
    state = states()[3]  # the fridge open: apple 1, egg 2
    out = renamed_state(state, {"apple": "tomato"})
    assert "Seen fridge 1: (open) egg 2, tomato 1" in out.splitlines()
    assert Belief.parse(out).feedback.endswith("you see a egg 2, and a tomato 1.")  # the game's
    assert renamed_state(out, {"tomato": "apple"}) == state  # and back


def test_copies_rename_consistently_and_keep_what_decides_the_commands():
    original = episode()
    copies = renamed([original], copies=3, seed=1)
    assert len(copies) == 3
    rules = Rules.alfred()
    for copy in copies:
        assert copy.info[RENAMED_FROM] == "ep" and copy.task.task_id == original.task.task_id
        assert copy.episode_id != original.episode_id
        names = copy.info[RENAMES]
        assert names and len(set(names.values())) == len(names)  # one to one
        back = {new: old for old, new in names.items()}
        # one map, the same in the task, the states, the actions and the feedback
        assert copy.task.intent == rename_words(original.task.intent, names) != \
            original.task.intent
        for old, new in zip(original.transitions, copy.transitions, strict=True):
            assert new.action == rename_words(old.action, names)
            assert new.info["feedback"] == rename_words(old.info["feedback"], names)
            assert new.state == renamed_state(old.state, names)
            assert renamed_state(new.next_state, back) == old.next_state
            assert Belief.parse(new.next_state).render() == new.next_state
        # the tool that cools keeps its name; the renamed apple can still be cooled, the
        # renamed cabinet still opens
        assert "fridge" not in names and "apple" in names
        assert names["apple"] in rules.abilities["cool"]
        assert names.get("cabinet", "cabinet") in rules.openable
        assert not {kind_of(r) for r in Belief.parse(new.state).receptacles} & set(back) - \
            set(names.values())
    assert renamed([original], copies=3, seed=1) == copies  # seeded
    assert OPENING  # the game the states come from
