"""ALFWorld's experience codec: a next state written as the game's sentence, the action's names
as references, applied back exactly; a bad reference is an unreadable answer."""

from __future__ import annotations

import pytest
from test_alfworld_belief import STEPS, states

from dreamgym_agents.adapters.alfworld.codec import (
    FEEDBACK_REF,
    SEEN_REF,
    AlfworldCodec,
    with_references,
    without_references,
)
from dreamgym_agents.adapters.alfworld.family import AlfworldFamily
from dreamgym_agents.experience.codec import StateReferenceError
from dreamgym_agents.experience.data import decision_spans
from dreamgym_agents.types import Transition


def codec() -> AlfworldCodec:
    return AlfworldFamily().experience_codec(3)  # version 4: test_version_4_references


def test_names_become_references_and_back():
    action = "take egg 1 from countertop 10"
    sentence = "You pick up the egg 1 from the countertop 10. Not countertop 1 or egg 12."
    written = with_references(sentence, action)
    assert written == "You pick up the @1 from the @2. Not countertop 1 or egg 12."
    assert without_references(written, action) == sentence
    with pytest.raises(StateReferenceError, match="@3"):
        without_references("You see the @3.", action)


def test_every_step_is_written_as_its_sentence_and_read_back_exactly():
    rendered, c = states(), codec()
    for i, (command, _) in enumerate(STEPS):
        if command.startswith("cool"):
            continue  # the test's states add a property the sentence does not say
        written = c.encode_state(rendered[i + 1], rendered[i], [], None, command)
        assert written.splitlines()[0] == FEEDBACK_REF, command
        assert " 1" not in written.splitlines()[1] or "you see" in written  # names referenced
        assert c.expand_state(written, rendered[i], [], None, command) == rendered[i + 1]
    # the arrival's sentence is the same in every game but for what it reveals
    arrive = c.encode_state(rendered[1], rendered[0], [], None, "go to countertop 1")
    assert arrive.splitlines()[1].startswith("You arrive at @1. On the @1, you see a soapbar 4")


def test_a_state_the_sentence_does_not_give_is_written_with_edits():
    rendered, c = states(), codec()
    odd = rendered[1].replace("Holding: nothing", "Holding: soapbar 4")
    written = c.encode_state(odd, rendered[0], [], None, "go to countertop 1")
    assert written.splitlines()[0] == "@state"
    assert c.expand_state(written, rendered[0], [], None, "go to countertop 1") == odd


def test_demonstrations_show_their_sentence_and_it_is_a_decision():
    rendered, c = states(), codec()
    demo = Transition(episode_id="d", step=0, task_id="t", state=rendered[3],
                      action="take apple 1 from fridge 1", next_state=rendered[4])
    assert c.demo_change(demo) == f"{FEEDBACK_REF}\nYou pick up the @1 from the @2."
    prompt = c.render("put a cool apple in countertop", [], rendered[3],
                      "take apple 1 from fridge 1", [demo], history_steps=2,
                      use_reasoning=True)[0]["content"]
    assert "You pick up the @1 from the @2." in prompt
    completion = ("<reasoning>The game answers the command. The task is not finished."
                  "</reasoning>\n<reward>0</reward>\n<done>false</done>\n<success>false"
                  f"</success>\n<next_state>\n{FEEDBACK_REF}\nYou pick up the @1 from the @2.\n"
                  "</next_state>")
    spans = [completion[a:b] for a, b in decision_spans(completion, c)]
    assert any("You pick up the @1 from the @2." in s for s in spans)
    assert any(s.startswith("The game answers") for s in spans)


def test_a_list_the_state_knows_is_written_as_seen():
    rendered, c = states(), codec()
    back = "go to countertop 1"  # step 7: the countertop again, its objects known
    written = c.encode_state(rendered[8], rendered[7], [], None, back)
    assert written.splitlines()[1] == f"You arrive at @1. On the @1, you see {SEEN_REF}."
    assert c.expand_state(written, rendered[7], [], None, back) == rendered[8]
    # a first visit shows what no state knows: written out, and @seen there is unreadable
    first = c.encode_state(rendered[1], rendered[0], [], None, back)
    assert SEEN_REF not in first and "a soapbar 4, and a spraybottle 1" in first
    with pytest.raises(StateReferenceError, match=SEEN_REF):
        c.expand_state(f"{FEEDBACK_REF}\nYou arrive at @1. On the @1, you see {SEEN_REF}.",
                       rendered[0], [], None, back)


def test_only_a_step_that_may_reveal_is_sampled():
    rendered, c = states(), codec()
    first = c.sampling(rendered[0], "go to countertop 1")  # never visited
    assert first["temperature"] > 0 and 0 < first["top_p"] < 1
    assert "temperature" not in c.sampling(rendered[7], "go to countertop 1")  # seen before
    assert c.sampling(rendered[2], "open fridge 1") == first  # closed, never opened
    assert c.sampling(rendered[7], "open fridge 1") == first  # closed again: a closed line
    assert "temperature" not in c.sampling(rendered[3], "take apple 1 from fridge 1")


def test_what_cannot_be_read_back_is_a_bad_word_of_the_step():
    rendered, c = states(), codec()
    assert c.sampling(rendered[0], "go to countertop 1")["bad_words"] == ["@2", "@3", SEEN_REF]
    assert c.sampling(rendered[0], "inventory") == {  # greedy still; it names nothing
        "bad_words": ["@1", "@2", "@3", SEEN_REF]}
    assert c.sampling(rendered[7], "go to countertop 1")["bad_words"] == ["@2", "@3"]
    assert c.sampling(rendered[3], "take apple 1 from fridge 1") == {"bad_words": ["@3"]}


def test_a_written_list_is_read_in_the_game_order_each_object_once():
    rendered, c = states(), codec()
    back = "go to countertop 1"
    sampled = (f"{FEEDBACK_REF}\nYou arrive at @1. On the @1, you see a spraybottle 1, "
               "a soapbar 4, and a spraybottle 1.")
    state = c.expand_state(sampled, rendered[0], [], None, back)
    assert state == rendered[1]  # the game's sentence: a soapbar 4, and a spraybottle 1


def test_version_4_references_read_back_every_recorded_step():
    """From version 4 the answer writes the held object, the place and the help text as
    references; every recorded step of the shipped episodes is written and read back exactly,
    and a reference the state cannot fill is unreadable and a bad word of the step."""
    from pathlib import Path

    from dreamgym_agents.adapters.alfworld.codec import AT_REF, HELD_REF, HELP_REF
    from dreamgym_agents.pipeline.bundle import read_episodes

    c = AlfworldFamily().experience_codec(4)
    episodes = Path(__file__).resolve().parents[2] / "bundles" / "alfworld" / "episodes"
    used = {HELD_REF: 0, AT_REF: 0, HELP_REF: 0}
    steps = 0
    for path in sorted(episodes.glob("*.jsonl.gz")):
        for traj in read_episodes(path):
            for t in traj.transitions:
                written = c.encode_state(t.next_state, t.state, [], None, t.action)
                assert c.expand_state(written, t.state, [], None, t.action) == t.next_state.strip()
                for ref in used:
                    used[ref] += ref in written
                steps += 1
    assert steps > 3000 and all(n > 20 for n in used.values()), used
    rendered = states()
    assert c.encode_state(rendered[1], rendered[0], [], None, "go to countertop 1") == \
        codec().encode_state(rendered[1], rendered[0], [], None, "go to countertop 1")
    with pytest.raises(StateReferenceError, match=HELD_REF):  # holds nothing at the start
        c.expand_state(f"{FEEDBACK_REF}\nYou are carrying: a {HELD_REF}.", rendered[0], [], None,
                       "inventory")
    assert {"@0", HELD_REF, HELP_REF} <= set(c.sampling(rendered[0], "inventory")["bad_words"])
    assert HELP_REF not in c.sampling(rendered[0], "help").get("bad_words", [])


LAYOUT = {"cabinet 1": [], "countertop 1": ["spraybottle 1", "soapbar 4"],
          "fridge 1": ["egg 2", "apple 1"], "toilet 1": []}
"""The hidden layout of the room :func:`states` plays (what each receptacle holds at the start)."""


def codec_6(monkeypatch: pytest.MonkeyPatch, layout: dict | None = LAYOUT) -> AlfworldCodec:
    from dreamgym_agents.types import Task

    family = AlfworldFamily()
    monkeypatch.setattr(family, "layout", lambda task: layout)
    task = Task(task_id="t", family="alfworld", intent="put a cool apple in countertop")
    return family.experience_codec(6).for_task(task)


def test_version_6_shows_the_layout_where_a_step_may_reveal_and_writes_it_as_here(monkeypatch):
    from dreamgym_agents.adapters.alfworld.codec import LAYOUT_REF

    rendered, c = states(), codec_6(monkeypatch)
    first = "go to countertop 1"
    prompt = c.render("put a cool apple in countertop", [], rendered[0], first, [],
                      history_steps=2, use_reasoning=True)[-1]["content"]
    assert "\nhere: a soapbar 4, and a spraybottle 1\nchecks: " in prompt  # the game's order
    written = c.encode_state(rendered[1], rendered[0], [], None, first)
    assert written.splitlines()[1] == f"You arrive at @1. On the @1, you see {LAYOUT_REF}."
    assert c.expand_state(written, rendered[0], [], None, first) == rendered[1]
    assert "temperature" not in c.sampling(rendered[0], first)  # it follows from the prompt
    assert LAYOUT_REF not in c.sampling(rendered[0], first)["bad_words"]
    # a closed fridge is shown its layout, and the answer says it is closed
    closed = c.encode_state(rendered[2], rendered[1], [], None, "go to fridge 1")
    assert LAYOUT_REF not in closed and c.here(rendered[1], "go to fridge 1") is not None
    opened = c.encode_state(rendered[3], rendered[2], [], None, "open fridge 1")
    assert c.expand_state(opened, rendered[2], [], None, "open fridge 1") == rendered[3]
    assert LAYOUT_REF in opened
    # a revisit shows no layout: its list is @seen, and @here there is unreadable and banned
    back = "go to countertop 1"
    assert c.here(rendered[7], back) is None and "here:" not in c.render(
        "put a cool apple in countertop", [], rendered[7], back, [], history_steps=2,
        use_reasoning=True)[-1]["content"]
    assert LAYOUT_REF in c.sampling(rendered[7], back)["bad_words"]
    with pytest.raises(StateReferenceError, match=LAYOUT_REF):
        c.expand_state(f"{FEEDBACK_REF}\nYou arrive at @1. On the @1, you see {LAYOUT_REF}.",
                       rendered[7], [], None, back)
    # a demonstration (another game) is never written with this task's layout
    demo = Transition(episode_id="d", task_id="d", step=0, state=rendered[0], action=first,
                      next_state=rendered[1])
    assert LAYOUT_REF not in c.demo_change(demo)


def test_without_a_layout_or_before_version_6_nothing_is_shown(monkeypatch):
    from dreamgym_agents.adapters.alfworld.codec import LAYOUT_REF
    from dreamgym_agents.types import Task

    rendered = states()
    no_layout = codec_6(monkeypatch, None)
    assert no_layout.here(rendered[0], "go to countertop 1") is None
    assert no_layout.sampling(rendered[0], "go to countertop 1")["temperature"] > 0
    five = AlfworldFamily().experience_codec(5)
    assert five.for_task(Task(task_id="t", family="alfworld", intent="x")) is five
    assert LAYOUT_REF not in five.sampling(rendered[0], "go to countertop 1")["bad_words"]


@pytest.mark.slow
def test_the_layout_is_what_every_recorded_first_visit_showed_renamed_copies_too():
    """The family's layout of a game, read without playing it, lists exactly what each recorded
    step that revealed a receptacle for the first time showed (the shipped collection's first 40
    episodes and their renamed copies), and every step is written and read back exactly in
    version 6. (A receptacle shown, closed and opened again may hold what the player put there:
    the state forgets a closed receptacle's contents and the layout is the start's; such a
    list is written out, 1 of the collection's 829 reveals.)"""
    from pathlib import Path

    from dreamgym_agents.adapters.alfworld.belief import Belief, in_game_order, listed
    from dreamgym_agents.adapters.alfworld.codec import LAYOUT_REF, may_reveal
    from dreamgym_agents.adapters.alfworld.rename import renamed
    from dreamgym_agents.pipeline.bundle import read_episodes

    family = AlfworldFamily()
    c = family.experience_codec(6)
    path = Path(__file__).resolve().parents[2] / "bundles" / "alfworld" / "episodes" / \
        "collect.jsonl.gz"
    episodes = read_episodes(path)[:40]
    shown = used = steps = 0
    for traj in [*episodes, *renamed(episodes, 1, seed=0)]:
        bound, before = c.for_task(traj.task), set()
        for t in traj.transitions:
            sentence = Belief.parse(t.next_state).feedback or ""
            if t.valid and may_reveal(t.state, t.action) and listed(sentence) is not None:
                place = t.action.split(" ", 1)[1].removeprefix("to ")
                if place not in before:
                    assert listed(in_game_order(sentence)) == bound.here(t.state, t.action), \
                        (traj.episode_id, t.action)
                    shown += 1
                before.add(place)
            written = bound.encode_state(t.next_state, t.state, [], None, t.action)
            assert bound.expand_state(written, t.state, [], None, t.action) == \
                t.next_state.strip()
            used += LAYOUT_REF in written
            steps += 1
    assert shown > 100 and used >= shown and steps > 400, (shown, used, steps)
