"""The rule-based abstract-state mapper: BrowserGym accessibility tree → :class:`AbstractState`.

Keeps actionable elements (with their bids), headings and the page's key text, in document order;
see :mod:`dreamgym_agents.adapters.webarena.state` for the rendered format the models read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dreamgym_agents.adapters.webarena.state import (
    ACTIONABLE_ROLES,
    STATE_FLAGS,
    TEXT_ROLE,
    VALUE_ROLES,
    AbstractState,
    Element,
)
from dreamgym_agents.episodes.env import normalize_text

logger = logging.getLogger(__name__)

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


def _truncate(text: str, max_chars: int) -> str:
    if max_chars > 0 and len(text) > max_chars:
        return text[: max_chars - 1].rstrip() + "…"
    return text


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
        axtree_object: BrowserGym's ``obs["axtree_object"]``: the merged CDP tree as
            ``{"nodes": [...]}``, the first node the root, nodes carrying ``browsergym_id``.
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
