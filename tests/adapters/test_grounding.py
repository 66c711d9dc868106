"""Element references by role and name (the embedded policy's action form)."""

from __future__ import annotations

from dreamgym_agents.adapters.webarena.grounding import refer, resolve

PAGE = """URL: http://s/category/office
Title: Office | Shop
[37] searchbox 'Search'
[38] button 'Search'
[44] combobox 'Sort by' value='Name' options='Name|Price: Low to High'
[84] link 'Ergonix Harbor Chair, Walnut'
StaticText '$546.99'
[90] link 'Bob\\'s Desk'
[91] link 'Next page'
[95] link 'Next page'"""


def test_refer_names_the_element_the_bid_points_to():
    assert refer("click('84')", PAGE) == "click(link 'Ergonix Harbor Chair, Walnut')"
    assert refer("fill('37', 'usb hub')", PAGE) == "fill(searchbox 'Search', 'usb hub')"
    assert refer('select_option("44", "Price: Low to High")', PAGE) == \
        "select_option(combobox 'Sort by', \"Price: Low to High\")"
    assert refer("click('90')", PAGE) == "click(link 'Bob\\'s Desk')"  # quoted as on the page


def test_refer_leaves_actions_without_an_element_alone():
    for action in ("keyboard_press('Enter')", "send_msg_to_user('$546.99')", "go_back()"):
        assert refer(action, PAGE) == action
    assert refer("click('999')", PAGE) == "click('999')"  # not on the page: kept as recorded


def test_resolve_is_the_inverse_on_the_page():
    for action in ("click('84')", "fill('37', 'usb hub')", "click('38')", "click('90')",
                   "select_option('44', 'Price: Low to High')"):
        assert resolve(refer(action, PAGE), PAGE) == action
    assert resolve("keyboard_press('Enter')", PAGE) == "keyboard_press('Enter')"


def test_resolve_takes_the_first_of_equal_names_and_refuses_what_is_not_there():
    assert resolve("click(link 'Next page')", PAGE) == "click('91')"
    assert resolve("click(link 'Ergonix Harbor Chair, Oak')", PAGE) is None
    assert resolve("click(button 'Ergonix Harbor Chair, Walnut')", PAGE) is None  # wrong role
    # the searchbox and the button share a name; the role tells them apart
    assert resolve("click(button 'Search')", PAGE) == "click('38')"


def test_only_element_arguments_are_references():
    # an answer that happens to be a bid on the page stays an answer
    assert refer("send_msg_to_user('84')", PAGE) == "send_msg_to_user('84')"
    assert resolve("send_msg_to_user(link 'Next page')", PAGE) == \
        "send_msg_to_user(link 'Next page')"
