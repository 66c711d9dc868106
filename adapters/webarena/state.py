"""Abstract states: the compact text a model sees instead of a raw web page.

The same format serves the real environment (BrowserGym observations, mapped by
:mod:`dreamgym_agents.adapters.webarena.axtree`) and the dream (the experience model writes
states in this format,
:func:`parse_state` reads them back), so agents see one format in both worlds (DreamGym,
Sec. 4.1: the experience model reasons in an abstract textual state space).

Rendered format, one item per line, in document order::

    URL: http://127.0.0.1:8000/product/3
    Title: Acme Laptop - Acme Shop
    [12] link 'Laptops'
    heading 'Acme Laptop'
    StaticText 'Price: $12.99'
    [15] textbox 'Search' value='usb'
    [17] combobox 'Sort by' value='Name' options='Name|Price: Low to High|Price: High to Low'
    [22] checkbox 'Remember me' checked
    [30] button 'Add to Cart'

- Actionable elements carry their BrowserGym id (``bid``) in brackets; headings, images and text
  lines carry none (they are context, not targets).
- Names are single-quoted with ``\\'`` and ``\\\\`` escaped, whitespace collapsed, and cut at
  ``max_name_chars`` with ``…``.
- ``value='…'`` is the current value of a textbox, searchbox, combobox, spinbutton or slider.
- A closed drop-down (``combobox`` whose options sit in a collapsed popup, i.e. an HTML
  ``<select>``) is one line: its options are listed in ``options='a|b|c'`` (``|`` and ``\\``
  inside an option are escaped with ``\\``); at most ``max_options`` are listed, then
  ``+N more``. Use ``select_option(bid, 'b')`` on the combobox. Options of open lists
  (``listbox``, expanded menus) are separate ``option`` lines with their own bids.
- Trailing bare words are states: ``checked``, ``mixed``, ``selected``, ``pressed``,
  ``expanded``, ``disabled``.
- Text: consecutive pieces of text within the same text-only run (e.g. ``Price: <b>$12.99</b>``)
  are joined into one ``StaticText`` line; table cells of one row are joined with `` | ``. Text
  inside an actionable element or a heading is part of that line, text equal to an actionable
  element's name (its label) is dropped, repeated text lines are dropped, and at most
  ``max_text_lines`` text lines are kept.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Literal

from dreamgym_agents.episodes.env import normalize_text

logger = logging.getLogger(__name__)

ACTIONABLE_ROLES: frozenset[str] = frozenset(
    {
        "link",
        "button",
        "textbox",
        "searchbox",
        "combobox",
        "listbox",
        "option",
        "checkbox",
        "radio",
        "spinbutton",
        "slider",
        "menuitem",
        "menuitemcheckbox",
        "menuitemradio",
        "tab",
        "switch",
        "treeitem",
        "DisclosureTriangle",
        "ColorWell",
        "date",
        "DateTime",
        "InputTime",
    }
)
"""Roles an agent can act on; elements with one of these roles and a bid are targets."""

VALUE_ROLES: frozenset[str] = frozenset(
    {"textbox", "searchbox", "combobox", "spinbutton", "slider", "date", "DateTime", "InputTime"}
)
"""Roles whose current value is rendered as ``value='…'``."""

STATE_FLAGS: tuple[str, ...] = ("checked", "mixed", "selected", "pressed", "expanded", "disabled")
"""Boolean states rendered as trailing bare words, in this order."""

TEXT_ROLE = "StaticText"



_ACTION_BID = re.compile(r"""^\s*(?:[a-z_]+\(\s*['"]([^'"]+)['"]|[a-z_]+ \[(\d+)\])""")


def action_bid(action: str) -> str | None:
    """The bid an action targets: ``12`` of ``click('12')``, ``fill("12", …)`` or WebArena's
    ``click [12]``; None for an action without one (``go_back()``, an answer)."""
    match = _ACTION_BID.match(action)
    return (match.group(1) or match.group(2)) if match else None


def target_line(state: str, action: str) -> str:
    """The state line of the element an action targets (``[12] link 'Laptops'``), or ''."""
    bid = action_bid(action)
    if not bid:
        return ""
    prefix = f"[{bid}] "
    return next((ln.strip() for ln in state.splitlines() if ln.strip().startswith(prefix)), "")


def quote(text: str) -> str:
    """``text`` as a state line quotes it: in single quotes, ``\\`` and ``'`` escaped."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _quote_options(options: tuple[str, ...]) -> str:
    """One quoted string: options joined by ``|``, with ``\\``, ``'`` and ``|`` escaped."""
    escaped = (o.replace("\\", "\\\\").replace("'", "\\'").replace("|", "\\|") for o in options)
    return "'" + "|".join(escaped) + "'"


@dataclass(frozen=True)
class Element:
    """One line of an abstract state.

    Attributes:
        bid: BrowserGym element id, or None for context lines (text, headings, images).
        role: Accessibility role (``link``, ``button``, ``StaticText``, ``heading`` …).
        name: Accessible name (for text lines: the text).
        value: Current value (textboxes, comboboxes …), empty if none.
        options: For a closed drop-down: the option names.
        flags: States among :data:`STATE_FLAGS` (``checked``, ``disabled`` …).
    """

    bid: str | None
    role: str
    name: str
    value: str = ""
    options: tuple[str, ...] = ()
    flags: tuple[str, ...] = field(default=())

    @property
    def is_actionable(self) -> bool:
        """True if the element has a bid and an actionable role."""
        return bool(self.bid) and self.role in ACTIONABLE_ROLES

    def line(self) -> str:
        """Render the element as one line, e.g. ``[12] link 'Laptops'``."""
        parts = [f"[{self.bid}] {self.role}" if self.bid else self.role, quote(self.name)]
        if self.value:
            parts.append(f"value={quote(self.value)}")
        if self.options:
            parts.append(f"options={_quote_options(self.options)}")
        parts.extend(self.flags)
        return " ".join(parts)


MatchMode = Literal["exact", "contains"]


@dataclass
class AbstractState:
    """A page as the models see it.

    Attributes:
        url: URL of the page.
        title: Title of the page.
        lines: Elements and text lines in document order.
    """

    url: str
    title: str
    lines: list[Element] = field(default_factory=list)

    def render(self) -> str:
        """Render the state: ``URL: …``, ``Title: …``, then one line per element."""
        head = [f"URL: {normalize_text(self.url)}", f"Title: {normalize_text(self.title)}"]
        return "\n".join(head + [e.line() for e in self.lines])

    @property
    def elements(self) -> list[Element]:
        """The actionable elements (those with a bid and an actionable role)."""
        return [e for e in self.lines if e.is_actionable]

    def find(self, role: str | None, name: str, *, match: MatchMode = "exact") -> Element | None:
        """Find the first line with this role and name.

        Elements with a bid are preferred over context lines of the same role and name.

        Args:
            role: Role to match (case-insensitive); None matches any role.
            name: Name to match.
            match: ``"exact"`` compares whitespace-normalised names exactly; ``"contains"``
                looks for ``name`` as a case-insensitive substring of the element's name.

        Returns:
            The element, or None.
        """
        if match not in ("exact", "contains"):
            raise ValueError(f"match must be 'exact' or 'contains', got {match!r}")
        wanted = normalize_text(name)
        role_lc = role.lower() if role else None

        def matches(e: Element) -> bool:
            if role_lc is not None and e.role.lower() != role_lc:
                return False
            if match == "exact":
                return normalize_text(e.name) == wanted
            return wanted.lower() in normalize_text(e.name).lower()

        candidates = [e for e in self.lines if matches(e)]
        with_bid = [e for e in candidates if e.bid]
        return (with_bid or candidates or [None])[0]


# --------------------------------------------------------------------------------------------
# Parsing a rendered state
# --------------------------------------------------------------------------------------------

_QUOTED = r"'((?:[^'\\]|\\.)*)'"
_LINE = re.compile(
    r"^(?:\[(?P<bid>[^\]\s]+)\]\s+)?(?P<role>[A-Za-z][\w-]*)\s+" + _QUOTED + r"(?P<rest>.*)$"
)
_ATTR = re.compile(r"\s+(?P<key>value|options)=" + _QUOTED)
_FLAG = re.compile(r"\s+(?P<flag>[a-z]+)")
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(text: str) -> str:
    return _UNESCAPE.sub(r"\1", text)


def _split_options(raw: str) -> tuple[str, ...]:
    """Split an ``options='a|b'`` payload (already unquoted) on unescaped ``|``."""
    items: list[str] = []
    current: list[str] = []
    chars = iter(raw)
    for ch in chars:
        if ch == "\\":
            current.append(next(chars, ""))
        elif ch == "|":
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return tuple(items)


def parse_line(line: str) -> Element:
    """Parse one rendered line; a line in no known shape becomes a text line."""
    stripped = line.strip()
    m = _LINE.match(stripped)
    if m:
        name = _unescape(m.group(3))
        value, options, flags = "", (), []
        rest = m.group("rest")
        pos = 0
        ok = True
        while pos < len(rest):
            am = _ATTR.match(rest, pos)
            if am:
                # Options are split on unescaped "|" and unescaped in one pass.
                raw = am.group(2)
                if am.group("key") == "value":
                    value = _unescape(raw)
                else:
                    options = _split_options(raw)
                pos = am.end()
                continue
            fm = _FLAG.match(rest, pos)
            if fm and fm.group("flag") in STATE_FLAGS:
                flags.append(fm.group("flag"))
                pos = fm.end()
                continue
            ok = False
            break
        if ok:
            return Element(m.group("bid"), m.group("role"), name, value, options, tuple(flags))
    return Element(None, TEXT_ROLE, normalize_text(stripped))


def parse_state(text: str) -> AbstractState:
    """Read a rendered state back (``parse_state(s.render()) == s``).

    Tolerant: ``URL:``/``Title:`` lines may be missing, blank lines are skipped, and a line in no
    known shape is kept as a ``StaticText`` line. Used by agents acting on textual states and to
    read the experience model's predicted states. The same text is parsed once (the dream
    ranks the same recorded pages at many steps); each call gets a state of its own.
    """
    url, title, lines = _parsed(text)
    return AbstractState(url=url, title=title, lines=list(lines))


@functools.lru_cache(maxsize=8192)
def _parsed(text: str) -> tuple[str, str, tuple[Element, ...]]:
    url, title = "", ""
    lines: list[Element] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped:
            continue
        if not lines and not url and stripped.startswith("URL:"):
            url = stripped[4:].strip()
            continue
        if not lines and not title and stripped.startswith("Title:"):
            title = stripped[6:].strip()
            continue
        lines.append(parse_line(stripped))
    return url, title, tuple(lines)
