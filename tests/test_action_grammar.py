"""The policy's action grammar on a page, and decoding constrained to it."""

from __future__ import annotations

import random

import pytest

from dreamgym_agents.adapters.webarena.action_grammar import ActionGrammar
from dreamgym_agents.policy.grammar import ChoiceGrammar, Constraint, Vocabulary

PAGE = """URL: http://s/category/office
Title: Office | Shop
[12] link 'Home'
[37] searchbox 'Search'
[38] button 'Search'
[44] combobox 'Sort by' value='Name' options='Name|Price: Low to High|Top Rated'
[47] spinbutton 'Qty' value='1'
[84] link 'Ergonix Harbor Chair, Walnut'
StaticText '$546.99'
[90] link 'Bob\\'s Desk'"""
INTENT = "Add 2 units of Ergonix Harbor Chair, Walnut to my cart."


@pytest.fixture(scope="module")
def grammar() -> ActionGrammar:
    return ActionGrammar(PAGE, INTENT)


@pytest.mark.parametrize("action", [
    "click(link 'Ergonix Harbor Chair, Walnut')", "click(button 'Search')",
    "click(link 'Bob\\'s Desk')", "fill(spinbutton 'Qty', '2')",
    "fill(searchbox 'Search', 'Ergonix Harbor Chair, Walnut')",
    "select_option(combobox 'Sort by', 'Price: Low to High')", "keyboard_press('Enter')",
    "send_msg_to_user('$546.99')", "send_msg_to_user(\"it's done\")", "go_back()",
])
def test_the_grammar_accepts_what_the_page_and_task_allow(grammar, action):
    assert grammar.accepts(action)


def test_every_verb_the_grammar_writes_is_one_the_environment_runs(grammar):
    from dreamgym_agents.adapters.webarena.actions import WebActionSet

    runs = set(WebActionSet().action_names)
    assert {v.decode() for v in grammar.verbs} <= runs
    for action in ("dblclick(link 'Home')", "focus(button 'Search')", "clear(searchbox 'Search')"):
        assert not grammar.accepts(action)


@pytest.mark.parametrize("action", [
    "click(link 'Ergonix Harbor Chair, Oak')",  # not on the page
    "click(link 'Search')",  # wrong role
    "fill(searchbox 'Search', 'Deskwell Lamp')",  # not in the task
    "fill(link 'Home', '2')",  # a link is not a field
    "fill(spinbutton 'Qty', '')",  # types nothing
    "select_option(combobox 'Sort by', 'Price: High to Low')",  # not one of its options
    "keyboard_press('F13')", "click(link 'Home') ", "click(link 'Home')click",
    "send_msg_to_user('unterminated", "dance()", "click('12')",  # bids with name refs
])
def test_the_grammar_refuses_the_rest(grammar, action):
    assert not grammar.accepts(action)


@pytest.mark.parametrize(("intent", "typed", "ok"), [
    ("Price of Botanica Daily Cream, 16 fl oz?", "Botanica Daily Cream, 16 fl oz", True),
    ("Price of Botanica Daily Cream, 16 fl oz?", "Botanica Daily Cream", True),  # a part
    ("Price of Botanica Daily Cream, 16 fl oz?", "Botanica", False),  # the name goes on
    ("Price of Botanica Daily Cream, 16 fl oz?", "otanica Daily Cream", False),  # mid-word
    ("Search for 'coffee' please.", "coffee", True),
    ("Search for 'coffee' please.", "coff", False),
    ("Sign in as leo.fischer@example.com and pay.", "leo.fischer@example.com", True),
    ("Sign in as leo.fischer@example.com and pay.", "leo", False),
    ("Ship it to 12 Oak St, Raleigh, NC 27601.", "NC", True),
    ("Ship it to 12 Oak St, Raleigh, NC 27601.", "27601", True),
    ("Buy the USB-C Hub now", "USB", False),
])
def test_typed_text_starts_at_a_word_and_ends_at_a_phrase(intent, typed, ok):
    grammar = ActionGrammar(PAGE, intent)
    assert grammar.accepts(f"fill(searchbox 'Search', {typed!r})") is ok


def test_extractive_answers_are_spans_of_the_page_or_task_or_done():
    grammar = ActionGrammar(PAGE, INTENT, extractive_answers=True)
    for answer in ("$546.99", "Ergonix Harbor Chair, Walnut", "done", "Bob's Desk", "2", "17"):
        assert grammar.accepts(f"send_msg_to_user({answer!r})"), answer
    for answer in ("$546", "$999.00", "Ergonix", "it's done", "4.5"):
        assert not grammar.accepts(f"send_msg_to_user({answer!r})"), answer


def test_bid_references():
    grammar = ActionGrammar(PAGE, INTENT, refs="bid")
    assert grammar.accepts("click('84')") and grammar.accepts("fill('47', '2')")
    assert not grammar.accepts("click('85')") and not grammar.accepts("fill('84', '2')")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    import transformers

    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    path = tmp_path_factory.mktemp("tok")
    make_tiny_checkpoint(path, [PAGE, INTENT, "click(link 'Home') fill(searchbox 'Search', "
                                "'x') select_option(combobox 'Sort by', 'Top Rated')"] * 20,
                         vocab_size=400)
    return transformers.AutoTokenizer.from_pretrained(str(path))


def random_walk(constraint, eos, rng, max_tokens, tokenizer):
    """A uniformly random "model" under the constraint: token ids until an end token or
    ``max_tokens``; every step must leave some token allowed."""
    ids = []
    while len(ids) < max_tokens:
        allowed = constraint.allowed(ids)
        assert allowed, tokenizer.decode(ids)
        ids.append(rng.choice(allowed))
        if ids[-1] in eos:
            break
    return ids


@pytest.mark.parametrize("extractive", [False, True])
def test_constrained_sampling_only_writes_grammatical_actions(tokenizer, extractive):
    grammar = ActionGrammar(PAGE, INTENT, extractive_answers=extractive)
    vocab = Vocabulary(tokenizer)
    assert vocab.ok
    eos = {tokenizer.eos_token_id}
    rng = random.Random(0)
    written = set()
    for _ in range(200):
        ids = random_walk(Constraint(grammar, vocab, eos), eos, rng, 200, tokenizer)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if ids[-1] in eos:
            assert grammar.accepts(text), text
            written.add(text.split("(")[0])
    assert {"click", "fill", "select_option"} <= written


def test_every_token_of_a_grammatical_action_is_allowed(grammar, tokenizer):
    vocab = Vocabulary(tokenizer)
    eos = tokenizer.eos_token_id
    for action in ("fill(searchbox 'Search', 'Ergonix Harbor Chair, Walnut')",
                   "click(link 'Bob\\'s Desk')", "send_msg_to_user('$546.99')"):
        ids = [*tokenizer(action, add_special_tokens=False)["input_ids"], eos]
        constraint = Constraint(grammar, vocab, {eos})
        for k in range(len(ids)):
            assert ids[k] in constraint.allowed(ids[:k]), (action, k)


COMMANDS = ["go to drawer 1", "go to drawer 10", "take mug 2 from drawer 1", "look"]


def test_a_choice_grammar_writes_exactly_one_of_its_options(tokenizer):
    grammar = ChoiceGrammar(COMMANDS)
    assert grammar.accepts("go to drawer 10") and not grammar.accepts("go to drawer")
    vocab = Vocabulary(tokenizer)
    eos = {tokenizer.eos_token_id}
    rng = random.Random(1)
    written = set()
    for _ in range(300):
        ids = random_walk(Constraint(grammar, vocab, eos), eos, rng, 60, tokenizer)
        assert ids[-1] in eos
        written.add(tokenizer.decode(ids, skip_special_tokens=True))
    # every option, the one that is a prefix of another included, and nothing else
    assert written == set(COMMANDS)
    with pytest.raises(ValueError, match="at least one option"):
        ChoiceGrammar([])
