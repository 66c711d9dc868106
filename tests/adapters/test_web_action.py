"""Tests of the web action grammars (BrowserGym calls and WebArena commands)."""

from __future__ import annotations

import pytest

from dreamgym_agents.adapters.webarena.actions import (
    ActionParseError,
    WebAction,
    WebActionSet,
    normalize_key_comb,
)

WEBARENA_SUBSET = [
    "noop",
    "scroll",
    "keyboard_press",
    "click",
    "fill",
    "hover",
    "tab_focus",
    "new_tab",
    "go_back",
    "go_forward",
    "goto",
    "tab_close",
    "select_option",
    "send_msg_to_user",
    "report_infeasible",
]


@pytest.fixture(scope="module")
def actions() -> WebActionSet:
    return WebActionSet()


def test_action_names_are_the_webarena_subset(actions: WebActionSet) -> None:
    assert actions.action_names == WEBARENA_SUBSET


# -- BrowserGym syntax ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("click('12')", [WebAction("click", ("12",))]),
        ('click("12")', [WebAction("click", ("12",))]),
        ("click(12)", [WebAction("click", ("12",))]),  # ids are strings
        ("click('12', button='left', modifiers=[])", [WebAction("click", ("12",))]),
        (
            "click('12', button='right', modifiers=['Shift'])",
            [WebAction("click", ("12", "right", ("Shift",)))],
        ),
        ("fill('15', \"usb cable\")", [WebAction("fill", ("15", "usb cable"))]),
        ("fill('15', 'x', enable_autocomplete_menu=True)", [WebAction("fill", ("15", "x", True))]),
        ("select_option('20', 'Name')", [WebAction("select_option", ("20", "Name"))]),
        ("select_option('20', ['a', 'b'])", [WebAction("select_option", ("20", ("a", "b")))]),
        ("scroll(0, 200)", [WebAction("scroll", (0, 200))]),
        ("scroll(-50.5, 100)", [WebAction("scroll", (-50.5, 100))]),
        ("keyboard_press('Enter')", [WebAction("keyboard_press", ("Enter",))]),
        ("tab_focus(1)", [WebAction("tab_focus", (1,))]),
        ("noop()", [WebAction("noop", ())]),
        ("noop(1000)", [WebAction("noop", ())]),
        ("noop(250)", [WebAction("noop", (250,))]),
        ("go_back()", [WebAction("go_back", ())]),
        ("goto('http://a.b/c?d=[1]')", [WebAction("goto", ("http://a.b/c?d=[1]",))]),
        ('send_msg_to_user("$12.99")', [WebAction("send_msg_to_user", ("$12.99",))]),
        ("report_infeasible('no such page')", [WebAction("report_infeasible", ("no such page",))]),
        (
            "click('3')\nfill('4', 'a')  # comment\n",
            [WebAction("click", ("3",)), WebAction("fill", ("4", "a"))],
        ),
    ],
)
def test_browsergym_syntax(actions: WebActionSet, text: str, expected: list[WebAction]) -> None:
    assert actions.parse(text) == expected


@pytest.mark.parametrize(
    "value",
    [
        "it's",
        'say "hi"',
        "both ' and \" quotes",
        "brackets [x] (y) {z}",
        "back\\slash",
        "line1\nline2\ttab",
        "ünïcödé — 中文 😀",
        "",
        "fill('1', 'nested')",
    ],
)
def test_quoting_round_trip(actions: WebActionSet, value: str) -> None:
    action = WebAction("fill", ("7", value))
    code = action.to_browsergym()
    assert actions.parse(code) == [action]
    stop = WebAction("send_msg_to_user", (value,))
    assert actions.parse(stop.to_browsergym()) == [stop]


def test_escaped_quotes_in_input(actions: WebActionSet) -> None:
    assert actions.parse(r"fill('1', 'it\'s')") == [WebAction("fill", ("1", "it's"))]
    assert actions.parse('fill("1", "say \\"hi\\"")') == [WebAction("fill", ("1", 'say "hi"'))]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("stop('x')", "unknown action 'stop'"),
        ("press('12', 'Enter')", "unknown action 'press'"),
        ("click()", "missing a required argument"),
        ("click('1', 'left', [], 4)", "too many positional arguments"),
        ("click('1', colour='red')", "unexpected keyword"),
        ("click('1', button='side')", "expected 'left' or 'middle' or 'right'"),
        ("fill('1', 3.5)", "expected str"),
        ("fill('1', True)", "expected str"),
        ("tab_focus('x')", "expected int"),
        ("tab_focus(1.5)", "expected int"),
        ("scroll('a', 1)", "expected float"),
        ("click('1'); click('2')", "could not parse"),
        ("click('1'", "could not parse"),
        ("fill('1', 'unterminated)", "could not parse"),
        ("click(bid='1', bid='2')", "given twice"),
    ],
)
def test_browsergym_syntax_errors(actions: WebActionSet, text: str, fragment: str) -> None:
    with pytest.raises(ActionParseError, match=None) as err:
        actions.parse(text)
    assert fragment in str(err.value)
    assert isinstance(err.value, ValueError)


# -- WebArena syntax --------------------------------------------------------------------------

ENTER = WebAction("keyboard_press", ("Enter",))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("click [12]", [WebAction("click", ("12",))]),
        ("click[12]", [WebAction("click", ("12",))]),
        ("click [ a51 ]", [WebAction("click", ("a51",))]),
        ("hover [8]", [WebAction("hover", ("8",))]),
        ("type [15] [usb cable] [1]", [WebAction("fill", ("15", "usb cable")), ENTER]),
        ("type [15] [usb cable]", [WebAction("fill", ("15", "usb cable")), ENTER]),
        ("type [15] [usb cable] [0]", [WebAction("fill", ("15", "usb cable"))]),
        ("type [15] [a [b] c] [0]", [WebAction("fill", ("15", "a [b] c"))]),
        ('type [15] [it\'s "quoted" ünï] [0]', [WebAction("fill", ("15", 'it\'s "quoted" ünï'))]),
        ("type [15] [] [0]", [WebAction("fill", ("15", ""))]),
        ("press [Enter]", [ENTER]),
        ("press [Ctrl+a]", [WebAction("keyboard_press", ("Control+a",))]),
        ("press [meta+shift+t]", [WebAction("keyboard_press", ("ControlOrMeta+Shift+t",))]),
        ("scroll [down]", [WebAction("scroll", (0, 600))]),
        ("scroll [up]", [WebAction("scroll", (0, -600))]),
        ("new_tab", [WebAction("new_tab", ())]),
        ("close_tab", [WebAction("tab_close", ())]),
        ("go_back", [WebAction("go_back", ())]),
        ("go_forward []", [WebAction("go_forward", ())]),
        ("tab_focus [2]", [WebAction("tab_focus", (2,))]),
        ("goto [http://x.org/a?b=1&c=[2]]", [WebAction("goto", ("http://x.org/a?b=1&c=[2]",))]),
        ("stop [$12.99]", [WebAction("send_msg_to_user", ("$12.99",))]),
        ("stop []", [WebAction("send_msg_to_user", ("",))]),
        ("stop", [WebAction("send_msg_to_user", ("",))]),
        ("stop [N/A]", [WebAction("send_msg_to_user", ("N/A",))]),
        ("stop [[1, 2] and 'x']", [WebAction("send_msg_to_user", ("[1, 2] and 'x'",))]),
        ("stop [line one\nline two]", [WebAction("send_msg_to_user", ("line one\nline two",))]),
        ("click [3]\nclick [4]", [WebAction("click", ("3",)), WebAction("click", ("4",))]),
        ("Click [3]", [WebAction("click", ("3",))]),
    ],
)
def test_webarena_syntax(actions: WebActionSet, text: str, expected: list[WebAction]) -> None:
    assert actions.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("click", "expected click [id]"),
        ("click []", "expected click [id]"),
        ("click [1] now", "expected click [id]"),
        ("type [15]", "expected type [id] [text] [1]"),
        ("press []", "expected press [key_comb]"),
        ("scroll [sideways]", "expected scroll [down] or scroll [up]"),
        ("tab_focus [x]", "expected tab_focus [index]"),
        ("goto []", "goto"),
        ("stop the task", "expected stop [answer]"),
        ("new_tab [3]", "expected new_tab"),
        ("jump [3]", "expected a call such as click('12')"),
        ("I think I should click [3]", "expected a call such as click('12')"),
        ("", "empty action"),
        ("   \n ", "empty action"),
        ("```\n```", "empty action"),
    ],
)
def test_webarena_syntax_errors(actions: WebActionSet, text: str, fragment: str) -> None:
    with pytest.raises(ActionParseError) as err:
        actions.parse(text)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "text",
    [
        "  click [12]  ",
        "```\nclick [12]\n```",
        "```python\nclick('12')\n```",
        "Action: click [12]",
        "action: ```click('12')```",
        "`click [12]`",
        "```\nAction: click('12')\n```",
    ],
)
def test_wrappers_are_tolerated(actions: WebActionSet, text: str) -> None:
    assert actions.parse(text) == [WebAction("click", ("12",))]


# -- canonical actions ------------------------------------------------------------------------


def test_terminal_and_answer(actions: WebActionSet) -> None:
    (stop,) = actions.parse("stop [$12.99]")
    assert stop.is_terminal and stop.answer == "$12.99"
    (msg,) = actions.parse('send_msg_to_user("done")')
    assert msg.is_terminal and msg.answer == "done"
    (infeasible,) = actions.parse("report_infeasible('no such product')")
    assert infeasible.is_terminal and infeasible.answer == "N/A"
    (click,) = actions.parse("click [1]")
    assert not click.is_terminal and click.answer is None
    assert WebAction("stop", ("x",)).is_terminal


@pytest.mark.parametrize(
    "text",
    [
        "click [12]",
        'type [5] [it\'s "q" [x] ünï 😀] [1]',
        "scroll [up]",
        "press [Ctrl+Shift+k]",
        "goto [http://example.com/?q=a b]",
        "stop [answer with 'quotes' and \\ backslash]",
        "select_option('9', ['x', \"y'z\"])",
        "click('1', button='middle', modifiers=['Alt', 'Shift'])",
        "tab_focus [0]",
        "noop(10.5)",
    ],
)
def test_canonical_round_trip(actions: WebActionSet, text: str) -> None:
    for action in actions.parse(text):
        assert actions.parse(action.to_browsergym()) == [action]
        assert str(action) == action.to_browsergym()
        hash(action)  # canonical actions are hashable


def test_to_python(actions: WebActionSet) -> None:
    code = actions.to_python(actions.parse("type [15] [usb 'cable'] [1]"))
    assert code.rstrip().endswith("fill('15', \"usb 'cable'\")\nkeyboard_press('Enter')")
    assert "def fill(" in code and "def keyboard_press(" in code
    compile(code, "<action>", "exec")
    with pytest.raises(ValueError):
        actions.to_python([])
    with pytest.raises(ValueError):
        actions.to_python([WebAction("stop", ("x",))])


def test_single_action_mode() -> None:
    single = WebActionSet(multiaction=False, scroll_px=300)
    assert len(single.parse("type [1] [x]")) == 2  # one WebArena action, two calls
    assert single.parse("scroll [down]") == [WebAction("scroll", (0, 300))]
    with pytest.raises(ActionParseError, match="exactly one action"):
        single.parse("click('1')\nclick('2')")
    assert single.parse_one("click [3]") == WebAction("click", ("3",))
    with pytest.raises(ActionParseError):
        single.parse_one("type [1] [x]")


def test_describe_mentions_both_grammars(actions: WebActionSet) -> None:
    text = actions.describe()
    for name in WEBARENA_SUBSET:
        assert f"{name}(" in text
    for form in ["click [id]", "type [id] [text] [1]", "stop [answer]", "scroll [down]"]:
        assert form in text
    assert "send_msg_to_user" in text


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("Enter", "Enter"),
        ("enter", "Enter"),
        ("ctrl+c", "Control+c"),
        ("Cmd+Shift+T", "ControlOrMeta+Shift+T"),
        ("f5", "F5"),
        ("PageDown", "PageDown"),
        ("+", "+"),
        ("Shift++", "Shift++"),
    ],
)
def test_normalize_key_comb(given: str, expected: str) -> None:
    assert normalize_key_comb(given) == expected


def test_a_fill_says_what_it_types():
    from dreamgym_agents.adapters.webarena.actions import WebActionSet

    actions = WebActionSet()
    assert actions.parse("fill('12', \"Women's shoes\")")[0].typed == "Women's shoes"
    assert actions.parse("click('12')")[0].typed is None




def test_the_call_grammar_parses_one_text_at_a_time_across_threads():
    """pyparsing's parse actions learn their arity on first use in state shared unguarded
    across threads (two threads learning at once fail with a TypeError): a set of web actions
    parsed from 8 threads at once never runs two parses together, and each gets its action."""
    import threading
    import time

    actions = WebActionSet()
    real = actions._parser
    inside, most = 0, 0
    guard = threading.Lock()

    class Watched:
        def parse_string(self, text, parse_all):
            nonlocal inside, most
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)
            try:
                return real.parse_string(text, parse_all=parse_all)
            finally:
                with guard:
                    inside -= 1

    actions._parser = Watched()
    got: dict[int, list] = {}

    def play(i: int) -> None:
        got[i] = actions.parse(f"click('{i}')")

    threads = [threading.Thread(target=play, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1
    assert [got[i][0].args for i in range(8)] == [(str(i),) for i in range(8)]
