import pytest

from dreamgym_agents.adapters.webarena.state_delta import (
    StateReferenceError,
    demo_pages,
    diff_edits,
    encode_state,
    expand_state,
    fill_typed,
    is_reference,
    typed_text,
)

HOME = ("URL: __SHOPPING__\nTitle: Home\n[12] link 'Home'\n[30] link 'My Cart (4)'\n"
        "[37] searchbox 'Search'")
CART = ("URL: __SHOPPING__/cart\nTitle: Cart\n[12] link 'Home'\n[30] link 'My Cart (4)'\n"
        "StaticText 'Qty: 4'")


def test_full_state_passes_through():
    assert expand_state(CART, HOME, []) == CART
    assert not is_reference(CART)


def test_reference_with_edits_keeps_place():
    text = "@state\n- [37] searchbox 'Search'\n+ [37] searchbox 'Search' value='usb'"
    out = expand_state(text, HOME, [])
    assert out.splitlines()[-1] == "[37] searchbox 'Search' value='usb'"
    assert len(out.splitlines()) == len(HOME.splitlines())
    assert expand_state("@demo 1", HOME, [CART]) == CART


def test_bad_references_are_errors():
    with pytest.raises(StateReferenceError, match="demo"):
        expand_state("@demo 2", HOME, [CART])
    with pytest.raises(StateReferenceError, match="edit"):
        expand_state("@state\n* nonsense", HOME, [])
    with pytest.raises(StateReferenceError, match="edit"):
        expand_state("@state\nBasecamp+ [37C+ [3C+White", HOME, [])


def test_a_bare_state_line_is_read_as_an_insertion():
    # A small model sometimes drops the "+": the line is still a page line, put at the cursor.
    text = "@state\n- [37] searchbox 'Search'\n[37] searchbox 'Search' value='usb'\nheading 'x'"
    out = expand_state(text, HOME, []).splitlines()
    assert out[-2:] == ["[37] searchbox 'Search' value='usb'", "heading 'x'"]
    assert len(out) == len(HOME.splitlines()) + 1


@pytest.mark.parametrize("target,current,demos", [
    (CART, HOME, [CART]),
    (CART, HOME, []),
    (HOME.replace("(4)", "(5)"), HOME, [CART]),
    (HOME + "\nStaticText 'new'", HOME, []),
    ("StaticText 'first'\n" + HOME, HOME, []),
    (HOME.replace("[12] link 'Home'\n", ""), HOME, [CART, HOME]),
    ("URL: x\nTitle: y\nA\nA\nB", "URL: x\nTitle: y\nA\nB\nA", []),
])
def test_encode_is_lossless_and_short(target, current, demos):
    encoded = encode_state(target, current, demos)
    assert expand_state(encoded, current, demos) == target
    assert len(encoded.splitlines()) <= len(target.splitlines())


def test_encode_prefers_the_matching_demo():
    assert encode_state(CART, HOME, [HOME, CART]) == "@demo 2"
    assert diff_edits(CART, CART) == []


def test_going_back_is_written_as_the_previous_state():
    # On the cart page after coming from home, "go back" returns home: one reference line.
    assert encode_state(HOME, CART, [CART], previous=HOME) == "@previous"
    assert expand_state("@previous", CART, [CART], previous=HOME) == HOME
    assert encode_state(HOME, CART, [CART]) != "@previous"  # not offered: not used
    with pytest.raises(StateReferenceError, match="previous"):
        expand_state("@previous", CART, [])
    assert is_reference("@previous\n+ StaticText 'x'")


FILLED = HOME.replace("[37] searchbox 'Search'", "[37] searchbox 'Search' value='usb hub, 6 ft'")
RESULTS = ("URL: __SHOPPING__/search?q=usb+hub%2C+6+ft\nTitle: Search results for 'usb hub, 6 ft'"
           "\n[12] link 'Home'\n[37] searchbox 'Search' value='usb hub, 6 ft'\n"
           "heading 'Search results for \\'usb hub, 6 ft\\''\n[44] link 'usb hub, 6 ft'\n"
           "StaticText 'A usb hub, 6 ft long'")


def test_typed_text_is_written_as_placeholders_where_it_stands_whole():
    assert typed_text(FILLED) == ("usb hub, 6 ft", "usb+hub%2C+6+ft")
    assert typed_text(HOME) is None
    encoded = encode_state(RESULTS, FILLED, [])
    assert "URL: __SHOPPING__/search?q={typed+}" in encoded
    assert "heading 'Search results for \\'{typed}\\''" in encoded
    assert "[44] link '{typed}'" in encoded
    assert "StaticText 'A usb hub, 6 ft long'" in encoded  # inside a longer text: as is
    assert expand_state(encoded, FILLED, []) == RESULTS
    # in edit lines too
    ref = "@state\n- [37] searchbox 'Search' value='usb hub, 6 ft'\n+ [37] searchbox 'Search'"
    assert expand_state(ref, FILLED, []).endswith("[37] searchbox 'Search'")
    # nothing typed: the placeholder is left as written, and encoding uses none
    assert fill_typed("[44] link '{typed}'", HOME) == "[44] link '{typed}'"
    assert "{typed" not in encode_state(RESULTS, HOME, [])

    # a fill's own text
    action = "fill('37', \"Bob's usb hub\")"
    assert typed_text(HOME, action) == ("Bob\\'s usb hub", "Bob%27s+usb+hub")
    target = HOME.replace("[37] searchbox 'Search'",
                          "[37] searchbox 'Search' value='Bob\\'s usb hub'")
    encoded = encode_state(target, HOME, [], action=action)
    assert "value='{typed}'" in encoded
    assert expand_state(encoded, HOME, [], action=action) == target


def test_a_demo_search_reads_as_this_steps_search():
    class Step:
        def __init__(self, state, action, next_state):
            self.state, self.action, self.next_state = state, action, next_state

    other = FILLED.replace("usb hub, 6 ft", "lamp")
    demo = Step(other, "click('38')", RESULTS.replace("usb hub, 6 ft", "lamp")
                .replace("usb+hub%2C+6+ft", "lamp"))
    pages = demo_pages([demo], FILLED, "click('38')")
    assert "URL: __SHOPPING__/search?q={typed+}" in pages[0]
    # the demo's page, with this step's query: URL, title, heading, box and the result named
    # as the query need no edit; only text that merely contains the query does
    encoded = encode_state(RESULTS, FILLED, pages, action="click('38')")
    assert encoded == ("@demo 1\n- StaticText 'A lamp long'\n"
                       "+ StaticText 'A usb hub, 6 ft long'")
    assert expand_state(encoded, FILLED, pages, action="click('38')") == RESULTS
    # nothing typed in this step: demos are shown as they were
    assert demo_pages([demo], HOME, "click('12')") == [demo.next_state]


def test_a_line_whose_element_is_on_the_page_replaces_it_in_place():
    text = "@state\n+ [30] link 'My Cart (5)'\n+ StaticText 'Added'"
    out = expand_state(text, HOME, []).splitlines()
    # [30] changes where it stands; the cursor follows it, so the new text comes right after
    assert out[3:5] == ["[30] link 'My Cart (5)'", "StaticText 'Added'"]
    assert len(out) == len(HOME.splitlines()) + 1
    assert diff_edits(HOME, HOME.replace("(4)", "(5)")) == ["+ [30] link 'My Cart (5)'"]


def test_a_fill_is_written_as_the_current_page_and_its_field_even_when_a_demo_matches():
    action = "fill('37', 'usb hub, 6 ft')"
    demo = type("T", (), {"state": HOME, "action": "fill('37', 'lamp')",
                          "next_state": HOME.replace("'Search'", "'Search' value='lamp'")})()
    pages = demo_pages([demo], HOME, action)
    assert expand_state("@demo 1", HOME, pages, action=action) == FILLED  # the demo matches
    encoded = encode_state(FILLED, HOME, pages, action=action)
    assert encoded == "@state\n+ @target value='{typed}'"
    assert expand_state(encoded, HOME, pages, action=action) == FILLED


def test_a_selected_option_is_typed_text():
    sorting = HOME + "\n[44] combobox 'Sort by' value='Name' options='Name|Price'"
    action = "select_option('44', 'Price')"
    assert typed_text(sorting, action) == ("Price", "Price")
    target = sorting.replace("value='Name'", "value='Price'")
    encoded = encode_state(target, sorting, [], action=action)
    assert encoded == "@state\n+ @target value='{typed}'"
    assert expand_state(encoded, sorting, [], action=action) == target


def test_target_names_the_element_the_action_acts_on():
    box = "URL: x\nTitle: y\n[5] checkbox 'Gift wrap'\n[7] spinbutton 'Qty' value='1'"
    out = expand_state("@state\n+ @target value='3'", box, [], action="fill('7', '3')")
    assert out.splitlines()[-1] == "[7] spinbutton 'Qty' value='3'"
    out = expand_state("@state\n+ @target checked", box, [], action="click('5')")
    assert out.splitlines()[2] == "[5] checkbox 'Gift wrap' checked"
    assert encode_state(out, box, [], action="click('5')") == "@state\n+ @target checked"
    # a renamed element is not the target with a new value: written out
    renamed = box.replace("'Qty' value='1'", "'Quantity' value='1'")
    assert "@target" not in encode_state(renamed, box, [], action="fill('7', '3')")
    with pytest.raises(StateReferenceError, match="targets no element"):
        expand_state("@state\n+ @target value='3'", box, [], action="go_back()")
    with pytest.raises(StateReferenceError, match="targets no element"):
        expand_state("@state\n+ @target value='3'", box, [], action="fill('99', '3')")
