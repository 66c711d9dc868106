"""Abstract states: the compact text a model sees instead of a raw web page.

The same mapper serves the real environment (BrowserGym observations) and the dream (the
experience model writes states in this format, :func:`parse_state` reads them back), so agents
see one format in both worlds (DreamGym, Sec. 4.1: the experience model reasons in an abstract
textual state space).

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

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
_IMAGE_ROLES = frozenset({"image", "img"})
_CELL_ROLES = frozenset({"cell", "gridcell", "columnheader", "rowheader"})
# Nodes never rendered and whose subtree holds nothing more (their text is in a StaticText).
_DROP_SUBTREE_ROLES = frozenset({"InlineTextBox", "ListMarker"})
# Nodes that are never rendered but whose children are.
_TRANSPARENT_ROLES = frozenset({"none", "generic", "presentation", "LabelText", "ignored"})
# Roles that do not break a text run (inline formatting).
_INLINE_ROLES = frozenset(
    {
        "strong",
        "emphasis",
        "mark",
        "code",
        "time",
        "subscript",
        "superscript",
        "Abbr",
        "insertion",
        "deletion",
        "LabelText",
    }
)

_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Collapse runs of whitespace to one space and strip the ends."""
    return _WS.sub(" ", text).strip()


def _truncate(text: str, max_chars: int) -> str:
    if max_chars > 0 and len(text) > max_chars:
        return text[: max_chars - 1].rstrip() + "…"
    return text


def _quote(text: str) -> str:
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
        parts = [f"[{self.bid}] {self.role}" if self.bid else self.role, _quote(self.name)]
        if self.value:
            parts.append(f"value={_quote(self.value)}")
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
# Mapping a BrowserGym accessibility tree
# --------------------------------------------------------------------------------------------


def _ax_value(node: Mapping[str, Any], key: str) -> Any:
    item = node.get(key)
    if isinstance(item, Mapping):
        return item.get("value")
    return None


def _properties(node: Mapping[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for prop in node.get("properties") or []:
        value = prop.get("value")
        if isinstance(value, Mapping) and "value" in value:
            props[prop.get("name", "")] = value["value"]
    return props


def _flags(role: str, props: Mapping[str, Any]) -> tuple[str, ...]:
    found: set[str] = set()
    checked = props.get("checked")
    if checked in (True, "true"):
        found.add("checked")
    elif checked == "mixed":
        found.add("mixed")
    if props.get("selected") is True:
        found.add("selected")
    if props.get("pressed") in (True, "true"):
        found.add("pressed")
    elif props.get("pressed") == "mixed":
        found.add("mixed")
    if props.get("expanded") is True and role != "combobox":
        found.add("expanded")
    if props.get("disabled") is True:
        found.add("disabled")
    return tuple(f for f in STATE_FLAGS if f in found)


def _is_rendered(bid: str | None, extra: Mapping[str, Any] | None, viewport_only: bool) -> bool:
    """False if BrowserGym's extra properties say the element cannot be seen or clicked.

    BrowserGym's ``visibility`` is the fraction of the element inside the *viewport*, so an
    element below the fold has visibility 0: by default only elements without a layout box, with
    an (almost) empty box, or placed entirely left of the page (skip links) are dropped.
    """
    if not bid or not extra or bid not in extra:
        return True
    props = extra[bid] or {}
    if viewport_only:
        return float(props.get("visibility") or 0.0) >= 0.5
    bbox = props.get("bbox")
    if bbox is None:
        return float(props.get("visibility") or 0.0) > 0.0
    x, _y, width, height = (float(v) for v in bbox)
    if width <= 1.0 and height <= 1.0 or width <= 0.0 or height <= 0.0:
        return False
    return x + width > 0.0


class _Mapper:
    """One depth-first walk over a merged CDP accessibility tree."""

    def __init__(
        self,
        nodes: list[Mapping[str, Any]],
        extra: Mapping[str, Any] | None,
        *,
        viewport_only: bool,
        max_name_chars: int,
        max_text_chars: int,
        max_options: int,
    ) -> None:
        self.nodes = nodes
        self.by_id = {str(n.get("nodeId")): n for n in nodes}
        self.extra = extra
        self.viewport_only = viewport_only
        self.max_name_chars = max_name_chars
        self.max_text_chars = max_text_chars
        self.max_options = max_options
        self.lines: list[Element] = []
        self._run = ""
        self._pending_sep = " "
        self._text_only: dict[str, bool] = {}

    # -- tree helpers -------------------------------------------------------------------------
    def children(self, node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        own = str(node.get("nodeId"))
        kids = []
        for cid in node.get("childIds") or []:
            cid = str(cid)
            if cid != own and cid in self.by_id:
                kids.append(self.by_id[cid])
        return kids

    def is_text_only(self, node: Mapping[str, Any]) -> bool:
        """True if the subtree holds nothing but text and transparent/inline wrappers."""
        key = str(node.get("nodeId"))
        if key not in self._text_only:
            role = _ax_value(node, "role") or ""
            if role in (TEXT_ROLE, *_DROP_SUBTREE_ROLES, "LineBreak"):
                result = True
            elif node.get("ignored") or role in _TRANSPARENT_ROLES or role in _INLINE_ROLES:
                result = all(self.is_text_only(c) for c in self.children(node))
            else:
                result = False
            self._text_only[key] = result
        return self._text_only[key]

    # -- text runs ----------------------------------------------------------------------------
    def add_text(self, text: str) -> None:
        text = normalize_text(text)
        if not text:
            return
        if self._run:
            candidate = self._run + self._pending_sep + text
            if len(candidate) <= self.max_text_chars:
                self._run = candidate
                self._pending_sep = " "
                return
            self.flush()
        self._run = text
        self._pending_sep = " "

    def flush(self) -> None:
        if self._run:
            text = _truncate(self._run, self.max_text_chars)
            self.lines.append(Element(None, TEXT_ROLE, text))
        self._run = ""
        self._pending_sep = " "

    def emit(self, element: Element) -> None:
        self.flush()
        self.lines.append(element)

    # -- the walk -----------------------------------------------------------------------------
    def visit(self, node: Mapping[str, Any]) -> None:
        role = _ax_value(node, "role") or ""
        if role in _DROP_SUBTREE_ROLES:
            return
        bid = node.get("browsergym_id")
        bid = str(bid) if bid is not None else None
        if node.get("ignored") or role in _TRANSPARENT_ROLES:
            block = role not in _INLINE_ROLES and not self.is_text_only(node)
            self.visit_children(node, block=block)
            return
        if role == TEXT_ROLE:
            self.add_text(str(_ax_value(node, "name") or ""))
            return
        if role == "LineBreak":
            self.flush()
            return
        name = _truncate(normalize_text(str(_ax_value(node, "name") or "")), self.max_name_chars)
        if role in ACTIONABLE_ROLES and bid:
            # Only targets are filtered: containers without a box (display: contents) still
            # hold visible children.
            if not _is_rendered(bid, self.extra, self.viewport_only):
                return
            element = self.make_element(node, role, bid, name)
            self.emit(element)
            if not element.options:  # a closed drop-down's options are folded into its line
                self.visit_targets(node)
            return
        if role == "heading":
            if name:
                self.emit(Element(None, "heading", name))
            else:
                self.visit_children(node, block=True)
            return
        if role in _IMAGE_ROLES:
            if name:
                self.emit(Element(None, "image", name))
            return
        if role in _CELL_ROLES:
            if self._run:
                self._pending_sep = " | "
            self.visit_children(node, block=False)
            if self._run:
                self._pending_sep = " | "
            return
        if role in _INLINE_ROLES:
            self.visit_children(node, block=False)
            return
        self.visit_children(node, block=True)

    def visit_targets(self, node: Mapping[str, Any]) -> None:
        """Emit the actionable elements nested in an element (a listbox's options); its text is
        already the element's name."""
        for child in self.children(node):
            role = _ax_value(child, "role") or ""
            bid = child.get("browsergym_id")
            if role in ACTIONABLE_ROLES and bid is not None and not child.get("ignored"):
                self.visit(child)
            else:
                self.visit_targets(child)

    def visit_children(self, node: Mapping[str, Any], *, block: bool) -> None:
        if block:
            self.flush()
        for child in self.children(node):
            self.visit(child)
        if block:
            self.flush()

    def make_element(self, node: Mapping[str, Any], role: str, bid: str, name: str) -> Element:
        props = _properties(node)
        value = ""
        if role in VALUE_ROLES:
            value = _truncate(
                normalize_text(str(_ax_value(node, "value") or "")), self.max_name_chars
            )
        options: tuple[str, ...] = ()
        if role == "combobox" and props.get("expanded") is not True:
            names = self.collect_options(node)
            if len(names) > self.max_options:
                names = names[: self.max_options] + [f"+{len(names) - self.max_options} more"]
            options = tuple(names)
        return Element(bid, role, name, value, options, _flags(role, props))

    def collect_options(self, node: Mapping[str, Any]) -> list[str]:
        names: list[str] = []
        stack = list(reversed(self.children(node)))
        while stack:
            child = stack.pop()
            if (_ax_value(child, "role") or "") == "option":
                text = normalize_text(str(_ax_value(child, "name") or ""))
                names.append(_truncate(text, self.max_name_chars))
                continue
            stack.extend(reversed(self.children(child)))
        return names


def _drop_label_and_repeated_text(lines: list[Element], max_text_lines: int) -> list[Element]:
    """Drop text equal to an element's name or a heading, repeated text, and excess text."""
    labels = {normalize_text(e.name).rstrip(":").strip().lower() for e in lines if e.is_actionable}
    seen = {e.name.lower() for e in lines if e.role == "heading"}
    kept: list[Element] = []
    text_lines = 0
    dropped = 0
    for e in lines:
        if e.role == TEXT_ROLE and e.bid is None:
            key = e.name.lower()
            if key.rstrip(":").strip() in labels or key in seen:
                continue
            seen.add(key)
            if text_lines >= max_text_lines:
                dropped += 1
                continue
            text_lines += 1
        kept.append(e)
    if dropped:
        logger.debug("abstract state: dropped %d text lines beyond max_text_lines", dropped)
    return kept


def map_axtree(
    axtree_object: Mapping[str, Any],
    *,
    url: str,
    title: str,
    extra_properties: Mapping[str, Any] | None = None,
    max_text_lines: int = 80,
    viewport_only: bool = False,
    max_name_chars: int = 120,
    max_text_chars: int = 240,
    max_options: int = 25,
) -> AbstractState:
    """Map a BrowserGym accessibility tree to an :class:`AbstractState`.

    Args:
        axtree_object: BrowserGym's ``obs["axtree_object"]`` (``{"nodes": [...]}``, the merged
            CDP tree; the first node is the root, nodes carry ``browsergym_id``).
        url: URL of the page.
        title: Title of the page.
        extra_properties: BrowserGym's ``obs["extra_element_properties"]`` (bid → visibility,
            bbox, clickable); elements it shows as not rendered are skipped.
        max_text_lines: Keep at most this many text lines (elements and headings are all kept).
        viewport_only: Keep only elements at least half inside the viewport.
        max_name_chars: Cut element names and values longer than this.
        max_text_chars: Cut text lines longer than this (shorter pieces are joined up to it).
        max_options: List at most this many options of a drop-down.

    Returns:
        The abstract state (see the module docstring for the format).
    """
    nodes = list(axtree_object.get("nodes") or [])
    mapper = _Mapper(
        nodes,
        extra_properties,
        viewport_only=viewport_only,
        max_name_chars=max_name_chars,
        max_text_chars=max_text_chars,
        max_options=max_options,
    )
    if nodes:
        mapper.visit_children(nodes[0], block=True)
    lines = _drop_label_and_repeated_text(mapper.lines, max_text_lines)
    return AbstractState(url=url, title=normalize_text(title), lines=lines)


def map_observation(obs: Mapping[str, Any], **kwargs: Any) -> AbstractState:
    """Map a whole BrowserGym observation dict (active page's URL and title) to a state.

    Args:
        obs: The observation returned by BrowserGym's ``reset`` or ``step``.
        **kwargs: Passed to :func:`map_axtree` (``max_text_lines`` …).
    """
    titles = list(obs.get("open_pages_titles") or [])
    index = int(obs.get("active_page_index", 0) or 0)
    title = str(titles[index]) if 0 <= index < len(titles) else ""
    return map_axtree(
        obs.get("axtree_object") or {},
        url=str(obs.get("url", "")),
        title=title,
        extra_properties=obs.get("extra_element_properties"),
        **kwargs,
    )


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
    read the experience model's predicted states.
    """
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
    return AbstractState(url=url, title=title, lines=lines)
