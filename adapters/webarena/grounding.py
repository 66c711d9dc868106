"""Element references by role and name: the action form of a policy that does not see bids.

BrowserGym actions name their element by bid (``click('84')``); writing the right bid means
finding the element's line on the page and copying the number in front of it — two hops a small
model trained from scratch learns slowly. The embedded policy instead writes the element as the
page shows it, without the bid::

    click('84')                        ⇄  click(link 'Ergonix Harbor Office Chair, Walnut')
    fill('37', 'usb hub')              ⇄  fill(searchbox 'Search', 'usb hub')
    select_option('44', 'Top Rated')   ⇄  select_option(combobox 'Sort by', 'Top Rated')
    keyboard_press('Enter')            ⇄  keyboard_press('Enter')          (no element: unchanged)

A product's link is then a copy of its name from the task, and a button's (``button 'Add to
Cart'``) the same few tokens on every page. :func:`refer` turns a recorded action into this form
(with the page it was taken on); :func:`resolve` turns a written one back into the environment's
form on the current page, so environments, trajectories and the experience model only ever see
bids. Names are matched exactly as the page renders them (quoted, cut names with their ``…``).
Where several elements share a role and name, the first on the page is meant, as
:meth:`~dreamgym_agents.adapters.webarena.state.AbstractState.find` resolves the oracle's
programs.
"""

from __future__ import annotations

import re

from dreamgym_agents.adapters.webarena.state import AbstractState, parse_state, quote

ELEMENT_VERBS = ("click", "dblclick", "hover", "focus", "clear", "fill", "select_option", "press",
                 "check", "uncheck", "upload_file", "drag_and_drop")
"""BrowserGym actions whose first argument is an element (``send_msg_to_user('14')`` is not)."""

_VERB = "(?P<verb>\\s*(?:" + "|".join(ELEMENT_VERBS) + ")\\(\\s*)"
_BID_CALL = re.compile(_VERB + r"""(?P<q>['"])(?P<bid>[^'"]+)(?P=q)""")
_REF_CALL = re.compile(_VERB + r"(?P<role>[A-Za-z][\w-]*) '(?P<name>(?:[^'\\]|\\.)*)'")
_UNESCAPE = re.compile(r"\\(.)")


def refer(action: str, state: str | AbstractState) -> str:
    """``action`` with its element's bid replaced by ``role 'name'`` of that element on
    ``state`` (the page the action was taken on); unchanged when it names no element or the bid
    is not on the page."""
    match = _BID_CALL.match(action)
    if not match:
        return action
    page = state if isinstance(state, AbstractState) else parse_state(state)
    element = next((e for e in page.lines if e.bid == match.group("bid")), None)
    if element is None:
        return action
    return f"{match.group('verb')}{element.role} {quote(element.name)}{action[match.end():]}"


def resolve(text: str, state: str | AbstractState) -> str | None:
    """A written action back in the environment's form: ``role 'name'`` replaced by the bid
    of the first such element on ``state``. Text that names no element this way is returned
    unchanged; None when the element is not on the page."""
    match = _REF_CALL.match(text)
    if not match:
        return text
    page = state if isinstance(state, AbstractState) else parse_state(state)
    name = _UNESCAPE.sub(r"\1", match.group("name"))
    element = page.find(match.group("role"), name)
    if element is None or element.bid is None:
        return None
    return f"{match.group('verb')}{quote(element.bid)}{text[match.end():]}"

