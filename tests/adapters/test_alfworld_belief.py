"""ALFWorld's belief state: one short line per receptacle, read back as rendered, and which
transitions reveal what no model can know."""

from __future__ import annotations

from dreamgym_agents.adapters.alfworld.belief import (
    AlfworldStateFormat,
    Belief,
    game_list,
    in_game_order,
)
from dreamgym_agents.experience.codec import apply_edits, line_edits

OPENING = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking "
           "quickly around you, you see a cabinet 1, a countertop 1, a fridge 1, and a toilet 1."
           "\n\nYour task is to: put a cool apple in countertop.")
STEPS = [
    ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a soapbar "
                           "4, and a spraybottle 1."),
    ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
    ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1, "
                      "and a egg 2."),
    ("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1."),
    ("cool apple 1 with fridge 1", "You cool the apple 1 using the fridge 1."),
    ("heat apple 1 with fridge 1", "Nothing happens."),
    ("close fridge 1", "You close the fridge 1."),
    ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a soapbar "
                           "4, and a spraybottle 1."),
    ("move apple 1 to countertop 1", "You move the apple 1 to the countertop 1."),
]


def states() -> list[str]:
    belief = Belief.start(OPENING)
    out = [belief.render()]
    for command, feedback in STEPS:
        belief.update(command, feedback)
        if command.startswith("cool"):
            belief.properties["apple 1"] = ["cool", "clean"]  # two properties: a comma inside
        out.append(belief.render())
    return out


def test_each_receptacle_has_its_own_line_in_the_order_first_seen():
    last = states()[-1].splitlines()
    assert last[-2:] == ["Seen countertop 1: apple 1 (cool, clean), soapbar 4, spraybottle 1",
                         "Seen fridge 1: (closed)"]
    assert "Room: cabinet 1, countertop 1, fridge 1, toilet 1" in last
    assert "At: countertop 1" in last


def test_a_rendered_state_reads_back_as_itself():
    for state in states():
        assert Belief.parse(state).render() == state
        assert Belief.parse(state).admissible(_rules()) == \
            AlfworldStateFormat.admissible(state)


def test_a_step_is_a_few_short_edits_that_rebuild_the_next_state_exactly():
    seq = states()
    for before, after in zip(seq, seq[1:], strict=False):
        edits = line_edits(before, after)
        assert apply_edits(before, edits) == after
        assert len(edits) <= 3 and all(len(e) < 120 for e in edits), edits
        assert not any(e.startswith("+ Room:") for e in edits)  # the room never changes


def test_contents_seen_for_the_first_time_are_revealed_and_nothing_else():
    seq = states()
    revealed = [AlfworldStateFormat.reveals(a, b) for a, b in zip(seq, seq[1:], strict=False)]
    # arriving at the countertop and opening the fridge show what was unknown; coming back to
    # the countertop shows nothing new, nor does arriving at the closed fridge
    assert revealed == [True, False, True, False, False, False, False, False, False]


def _rules():
    from dreamgym_agents.adapters.alfworld.belief import _rules

    return _rules()


def test_objects_are_listed_in_the_games_order():
    belief = Belief.start(OPENING)
    belief.update("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you "
                  "see a apple 2, a apple 1, and a egg 3.")  # the game's: kind, number down
    belief.update("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.")
    belief.update("x", "You pick up the apple 1 from the countertop 1.")
    belief.update("x", "You move the apple 1 to the countertop 1.")
    assert "Seen countertop 1: apple 2, apple 1, egg 3" in belief.render().splitlines()
    assert game_list(["apple 2", "apple 1", "egg 3"]) == "a apple 2, a apple 1, and a egg 3"
    assert game_list(["egg 3"]) == "a egg 3" and game_list([]) == "nothing"
    assert in_game_order("On the desk 1, you see a tomato 1, and a egg 2.") == \
        "On the desk 1, you see a egg 2, and a tomato 1."
    assert in_game_order("On the desk 1, you see a egg 2, a tomato 1, and a egg 2.") == \
        "On the desk 1, you see a egg 2, and a tomato 1."  # an object is listed once
    assert in_game_order("You arrive at desk 1. On the desk 1, you see nothing.") == \
        "You arrive at desk 1. On the desk 1, you see nothing."
