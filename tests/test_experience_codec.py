"""PlainCodec: the experience codec of short text states (ALFWorld's, and a new family's start)."""

from dataclasses import dataclass

import pytest

from dreamgym_agents.experience.codec import (
    PlainCodec,
    StateReferenceError,
    apply_edits,
    line_edits,
)
from dreamgym_agents.experience.data import completion_text, decision_spans
from dreamgym_agents.types import Transition

ROOM = ("Task: put a mug in cabinet.\nAt: the middle of the room\nHolding: nothing\n"
        "Seen: nothing yet\nFeedback: You are in the middle of a room.")
TABLE = ("Task: put a mug in cabinet.\nAt: table 1\nHolding: nothing\n"
         "Seen: table 1: mug 2\nFeedback: You arrive at table 1.")


@dataclass
class Cmd:
    verb: str
    is_terminal: bool = False
    answer: str | None = None


class Commands:
    """A text game's commands; ``say X`` answers X and ends the episode."""

    def describe(self) -> str:
        return "go to X, take X from Y, say X"

    def parse(self, text: str) -> list[Cmd]:
        words = text.split()
        if not words:
            raise ValueError("empty command")
        if words[0] == "say":
            return [Cmd("say", True, " ".join(words[1:]))]
        return [Cmd(words[0])]


CODEC = PlainCodec(Commands(), "a test game", head_prefixes=("At:", "Holding:"))


def step(state, action, nxt, *, reward=0.0, done=False, success=False, episode="e", i=0):
    return Transition(episode_id=episode, step=i, task_id="t", state=state, action=action,
                      next_state=nxt, reward=reward, done=done, success=success,
                      provenance="real")


def test_a_changed_state_is_written_as_edits_and_read_back_exactly():
    written = CODEC.encode_state(TABLE, ROOM, [], None, "go to table 1")
    assert written.splitlines()[0] == "@state" and "+ At: table 1" in written
    assert "Task:" not in written  # unchanged lines are not repeated
    assert CODEC.expand_state(written, ROOM, [], None, "go to table 1") == TABLE
    assert CODEC.encode_state(ROOM, ROOM, [], None, "look") == "@state"
    assert CODEC.expand_state("@state", ROOM, [], None, "look") == ROOM
    # a state with nothing in common is written in full
    assert CODEC.encode_state("You win.", ROOM, [], None, "x") == "You win."


def test_edits_replace_keyed_lines_in_place_and_remove_unkeyed_ones():
    edits = line_edits("A: 1\nfree text\nB: 2", "A: 3\nB: 2\nnew line")
    assert edits == ["- free text", "+ A: 3", "+ new line"]
    assert apply_edits("A: 1\nfree text\nB: 2", edits) == "A: 3\nB: 2\nnew line"


def test_an_unreadable_reference_is_a_state_reference_error():
    with pytest.raises(StateReferenceError, match="only @state"):
        CODEC.expand_state("@demo 1", ROOM, [], None, "x")
    with pytest.raises(StateReferenceError, match="not an edit"):
        CODEC.expand_state("@state\nAt: table 1", ROOM, [], None, "x")


def test_the_prompt_shows_demos_as_their_changes_and_the_state_in_full():
    demo = step(ROOM, "go to table 1", TABLE, episode="d")
    history = [step(ROOM, "look", ROOM)]
    text = CODEC.render("put a mug in cabinet", history, ROOM, "go to table 1", [demo],
                        history_steps=2, use_reasoning=True)[0]["content"]
    assert "demo 1: go to table 1 (in At: the middle of the room | Holding: nothing)" in text
    assert "+ At: table 1" in text and text.count("Task: put a mug") == 1
    assert "last steps: look → At: the middle of the room | Holding: nothing" in text
    assert text.rstrip().endswith("action: go to table 1\nanswer:")
    no_demos = CODEC.render("x", None, ROOM, "look", None, history_steps=2,
                            use_reasoning=False)[0]["content"]
    assert "demo" not in no_demos and "last steps" not in no_demos


def test_demos_rank_the_same_verb_and_words_first():
    take = step(TABLE, "take mug 2 from table 1", ROOM, episode="a")
    go = step(ROOM, "go to table 1", TABLE, episode="b")
    other_go = step(ROOM, "go to cabinet 1", TABLE, episode="c")
    ranked = CODEC.rank_step_demos(ROOM, "go to table 1", [take, other_go, go], 2)
    assert ranked == [go, other_go]


def test_answers_and_rationales_state_the_outcome_with_the_codecs_sentences():
    assert CODEC.answer_text("say mug 2") == "mug 2" and CODEC.answer_text("look") is None
    won = step(TABLE, "say mug 2", TABLE, reward=1.0, done=True, success=True)
    assert CODEC.rationale(won) == "The task is complete. Final answer."
    moved = step(ROOM, "go to table 1", TABLE)
    completion = completion_text(moved, [], CODEC, use_reasoning=True)
    assert completion.startswith("<reasoning>The state changes: At: table 1")
    spans = [completion[a:b] for a, b in decision_spans(completion, CODEC)]
    assert spans[0] == "The task is not finished."
    assert spans[1].startswith("The state changes")
    assert spans[-1].startswith("@state\n+ ")
