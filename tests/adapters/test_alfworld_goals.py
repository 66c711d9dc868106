"""ALFWorld's goals read from a task's wording and checked on the abstract state, against the
game's own reward on every recorded real transition the shipped bundle holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_alfworld_belief import states

from dreamgym_agents.adapters.alfworld.belief import Belief
from dreamgym_agents.adapters.alfworld.goals import Goal, goal_met

EPISODES = Path(__file__).resolve().parents[2] / "bundles" / "alfworld" / "episodes"


@pytest.mark.parametrize(("intent", "goal"), [
    ("put a watch in shelf", Goal("watch", "shelf")),
    ("put some keychain on sidetable", Goal("keychain", "sidetable")),
    ("find two keychain and put them in armchair", Goal("keychain", "armchair", count=2)),
    ("put two cd in desk.", Goal("cd", "desk", count=2)),
    ("clean some cloth and put it in cabinet", Goal("cloth", "cabinet", needs="clean")),
    ("put a hot egg in fridge", Goal("egg", "fridge", needs="hot")),
    ("cool some mug and put it in cabinet", Goal("mug", "cabinet", needs="cool")),
    ("examine the statue with the floorlamp", Goal("statue", lamp="floorlamp")),
    ("look at pencil under the desklamp", Goal("pencil", lamp="desklamp")),
])
def test_each_task_type_s_wording_gives_its_goal(intent, goal):
    assert Goal.parse(intent) == goal


def test_a_wording_of_no_task_type_has_no_goal():
    assert Goal.parse("make me a sandwich") is None and goal_met("sing", states()[0]) is None


def test_the_goal_needs_the_object_its_property_and_the_receptacle():
    rendered = states()  # put a cool apple in countertop; the last step moves it there
    assert [goal_met("put a cool apple in countertop", s) for s in rendered] == \
        [False] * (len(rendered) - 1) + [True]
    last = rendered[-1]
    assert goal_met("put a apple in countertop", last)
    assert not goal_met("put a hot apple in countertop", last)  # cool, not hot
    assert not goal_met("put a apple in fridge", last)
    assert not goal_met("find two apple and put them in countertop", last)  # one apple


def test_examine_in_light_needs_the_object_held_where_a_lamp_is_on():
    belief = Belief.parse("Task: examine the statue with the desklamp\nRoom: desk 1\nAt: desk 1\n"
                          "Holding: statue 2\nFeedback: x\nSeen desk 1: desklamp 1, pen 1")
    assert not goal_met(belief.task, belief)
    belief.update("use desklamp 1", "You turn on the desklamp 1.")
    assert goal_met(belief.task, belief)
    belief.update("go to shelf 1", "You arrive at shelf 1. On the shelf 1, you see nothing.")
    assert not goal_met(belief.task, belief)  # the lamp is on where the player is not
    belief.update("go to desk 1", "You arrive at desk 1. On the desk 1, you see a desklamp 1, "
                                  "and a pen 1.")
    assert goal_met(belief.task, belief)
    belief.holding = "pen 1"
    assert not goal_met(belief.task, belief)


def test_the_goal_agrees_with_the_game_on_every_recorded_transition():
    from dreamgym_agents.pipeline.bundle import read_episodes

    files = sorted(EPISODES.glob("*.jsonl.gz"))
    assert files, f"no recorded episodes in {EPISODES}"
    checked = rewarded = 0
    for path in files:
        for traj in read_episodes(path):
            for t in traj.transitions:
                met = goal_met(traj.task.intent, t.next_state)
                assert met is not None, traj.task.intent
                assert met == (t.reward > 0), (traj.task.intent, t.action, t.next_state)
                checked += 1
                rewarded += t.reward > 0
    assert checked > 3000 and rewarded > 300  # the shipped collection, demos and test episodes


def test_the_dream_s_rewards_are_checked_against_the_goal_of_the_state_it_predicts():
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily
    from dreamgym_agents.experience.fidelity import reward_check
    from dreamgym_agents.types import Task, Trajectory, Transition

    rendered = states()
    task = Task(task_id="t", family="alfworld", intent="put a cool apple in countertop")

    def step(i: int, reward: float, **kw) -> Transition:
        return Transition(episode_id="e", step=i, task_id="t", state=rendered[i],
                          action="x", next_state=rendered[i + 1], reward=reward,
                          provenance="synthetic", **kw)

    # rewarded too early (step 3: the apple only taken), the goal state left unrewarded, a
    # failed prediction and an invalid step left out
    steps = [step(0, 0.0), step(3, 1.0), step(8, 0.0), step(1, 1.0, valid=False),
             step(2, 1.0, info={"em_failure": True})]
    dream = Trajectory(episode_id="e", task=task, agent="a", transitions=steps)
    check = AlfworldFamily().state_success
    assert reward_check([dream], check) == {"checked": 3, "rewarded": 1, "rewarded_unmet": 1,
                                            "met_unrewarded": 1}
    assert reward_check([dream], None) is None


def test_goal_checks_say_what_the_task_asks_where_it_stands_and_what_each_name_is():
    from dreamgym_agents.adapters.alfworld.goals import goal_checks

    state = ("Task: put two soapbar in bathtubbasin.\nRoom: bathtubbasin 1, cabinet 1\n"
             "At: bathtubbasin 1\nHolding: soapbar 3 (clean)\nFeedback: x\n"
             "Seen bathtubbasin 1: soapbar 1\nSeen cabinet 1: (open) soapbar 4")
    move = "move soapbar 3 to bathtubbasin 1"
    assert goal_checks("put two soapbar in bathtubbasin", state, move) == (
        "goal 2 soapbar in bathtubbasin; 1 to go; holding fits; @1 fits; "
        "@2 the goal's place")
    # the one soapbar in place is not clean, the held one is: not done yet, this move does it
    assert goal_checks("put a clean soapbar in bathtubbasin", state, move) == (
        "goal 1 clean soapbar in bathtubbasin; 1 to go; holding fits; @1 fits; "
        "@2 the goal's place")
    assert goal_checks("heat some soapbar and put it in cabinet", state, move) == (
        "goal 1 hot soapbar in cabinet; 1 to go; holding the goal's kind, not hot; "
        "@1 the goal's kind, not hot; @2 other")
    assert goal_checks("examine the soapbar with the desklamp", state, "use desklamp 1") == (
        "goal a soapbar held where a desklamp is on; desklamp on here: no; holding fits; "
        "@1 the goal's lamp")
    assert goal_checks("put two soapbar in cabinet", state, move).startswith(
        "goal 2 soapbar in cabinet; 1 to go;")  # the open cabinet 1 holds one
    assert goal_checks("put two soapbar in toilet", state, move).startswith(
        "goal 2 soapbar in toilet; 2 to go;")
    lit = ("Task: examine the pen with the desklamp\nRoom: desk 1, shelf 1\nAt: shelf 1\n"
           "Holding: pen 1\nFeedback: x\nSeen desk 1: desklamp 1 (on)\nSeen shelf 1: nothing")
    assert goal_checks("examine the pen with the desklamp", lit, "go to desk 1") == (
        "goal a pen held where a desklamp is on; desklamp on here: no; holding fits; "
        "@1 where a desklamp is on")
    assert goal_checks("make me a sandwich", state, move) is None


def test_the_codec_shows_the_checks_from_version_3_only():
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily

    state = states()[-2]
    family = AlfworldFamily()

    def prompt(version):
        codec = family.experience_codec(version)
        (message,) = codec.render("put a cool apple in countertop", [], state,
                                  "move apple 1 to countertop 1", [], history_steps=2,
                                  use_reasoning=True)
        return message["content"]

    latest, old, unrecorded, four = prompt(None), prompt(2), prompt(0), prompt(4)
    assert latest.splitlines()[-2].startswith("checks: goal 1 cool apple in countertop; 1 to go")
    assert latest.splitlines()[-2].endswith("; if it works: done")  # version 5
    assert four.splitlines()[-2] == latest.splitlines()[-2].removesuffix("; if it works: done")
    assert latest.splitlines()[-1] == "answer:"
    assert "checks:" not in old and old == unrecorded  # the shipped model's prompt, unchanged
    assert latest.replace("\n" + latest.splitlines()[-2], "") == old


def test_if_it_works_says_whether_the_command_would_meet_the_goal():
    from dreamgym_agents.adapters.alfworld.goals import goal_checks

    state = ("Task: put two soapbar in bathtubbasin.\nRoom: bathtubbasin 1, cabinet 1\n"
             "At: bathtubbasin 1\nHolding: soapbar 3 (clean)\nFeedback: x\n"
             "Seen bathtubbasin 1: soapbar 1\nSeen cabinet 1: (open) soapbar 4")
    move = "move soapbar 3 to bathtubbasin 1"
    assert goal_checks("put two soapbar in bathtubbasin", state, move,
                       if_it_works=True).endswith("; if it works: done")
    assert goal_checks("put two soapbar in cabinet", state, "move soapbar 3 to cabinet 1",
                       if_it_works=True).endswith("; if it works: done")
    for task, command in (("put two soapbar in bathtubbasin", "look"),  # changes nothing
                          ("put two soapbar in toilet", move),  # the wrong place
                          ("heat some soapbar and put it in bathtubbasin", move),  # not hot
                          ("examine the soapbar with the desklamp", "use desklamp 1")):
        assert goal_checks(task, state, command, if_it_works=True).endswith(
            "; if it works: not done"), (task, command)
    assert goal_checks("put two soapbar in bathtubbasin", state, move) == (
        "goal 2 soapbar in bathtubbasin; 1 to go; holding fits; @1 fits; "
        "@2 the goal's place")  # codec versions before 5: no verdict
    lit = ("Task: examine the pen with the desklamp\nRoom: desk 1, shelf 1\nAt: shelf 1\n"
           "Holding: pen 1\nFeedback: x\nSeen desk 1: desklamp 1 (on)\nSeen shelf 1: nothing")
    assert goal_checks("examine the pen with the desklamp", lit, "go to desk 1",
                       if_it_works=True).endswith("; if it works: done")


def test_a_command_that_met_the_goal_was_one_the_verdict_said_would():
    """On every recorded transition the game rewards exactly the commands that worked and
    whose verdict was ``done``: the verdict is the reward's whole reading of the goal."""
    from dreamgym_agents.adapters.alfworld.belief import Belief
    from dreamgym_agents.adapters.alfworld.goals import met_if_it_works
    from dreamgym_agents.pipeline.bundle import read_episodes

    checked = rewarded = 0
    for path in sorted(EPISODES.glob("*.jsonl.gz")):
        for traj in read_episodes(path):
            goal = Goal.parse(traj.task.intent)
            for t in traj.transitions:
                done = met_if_it_works(goal, Belief.parse(t.state), t.action)
                worked = Belief.parse(t.next_state).feedback != "Nothing happens."
                assert (t.reward > 0) == (done and worked), (traj.task.intent, t.action)
                checked += 1
                rewarded += t.reward > 0
    assert checked > 3000 and rewarded > 300
