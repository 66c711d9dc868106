"""The policy's action grammar on a web page: the web family's
:class:`~dreamgym_agents.policy.grammar.Grammar`.

A small policy trained from scratch knows *which kind* of action a turn needs long before it
copies strings reliably: unconstrained, a warm start writes ``fill(searchbox 'Search', '…')``
with a training product's name instead of the task's, and clicks links the page does not have.
Decoding is therefore constrained, like grammar-guided decoding in serving stacks (TRL's GRPO
offers the same through vLLM's guided decoding), to the actions that make sense on the current
page:

- ``click`` / ``hover``: an element on the page
  (``link 'Name'`` with name references, ``'84'`` with bids);
- ``fill``: a field on the page and a text taken from the task's intent, since every text the
  bundled tasks type (a product, a query, an address part, a quantity) is part of the intent.
  The text starts at a word and ends at a phrase's end, never inside a word nor before a
  capitalised word that continues a name, where a small model's copy tends to stop early;
- ``select_option``: a drop-down on the page and one of *its* options;
- ``keyboard_press``: a key of :data:`KEYS`;
- ``send_msg_to_user``: any text (answers are copied from pages or computed);
- ``go_back()``, ``go_forward()``, ``noop()``.

The model still chooses everything — the verb, the element, where a typed text starts and ends,
the answer —; the grammar only removes what could not be executed or was never asked for. The
core's :class:`~dreamgym_agents.policy.grammar.Constraint` steps it byte by byte.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from dreamgym_agents.adapters.webarena.state import (
    VALUE_ROLES,
    AbstractState,
    parse_state,
    quote,
)

logger = logging.getLogger(__name__)

KEYS: tuple[str, ...] = ("Enter", "Tab", "Escape", "Backspace", "ArrowDown", "ArrowUp",
                         "PageDown", "PageUp")
"""Keys ``keyboard_press`` may press."""

_REF_VERBS = ("click", "hover")
"""The element-only verbs: those of the environment's action set (BrowserGym's ``dblclick``,
``focus`` and ``clear`` are not in it: the environment refuses them)."""
_SELECT_ROLES = frozenset({"combobox", "listbox"})
_FREE = "free"


@dataclass(frozen=True)
class _Spans:
    """A text that quoted text must be a span of: starting at a word, ending at a phrase's
    end (:func:`_phrase_end`)."""

    text: bytes
    starts: tuple[int, ...]
    ends: frozenset[int]
    counts: bool = False
    """Also any whole number (a count the page does not show as such)."""

    @classmethod
    def of(cls, text: bytes, counts: bool = False) -> _Spans:
        return cls(text, tuple(p for p in range(len(text))
                               if p == 0 or not _wordish(text[p - 1])),
                   frozenset(q for q in range(1, len(text) + 1) if _phrase_end(text, q)),
                   counts)


@dataclass(frozen=True)
class _State:
    """Where the automaton is: ``phase`` ``verb`` (reading the verb), ``set`` (matching one of
    finitely many strings), ``lit`` (inside a quoted text), ``done`` (the action is complete)."""

    phase: str
    verb: bytes = b""
    piece: int = 0
    cands: tuple[bytes, ...] = ()
    pos: int = 0
    quote: int = 0
    content: bytes = b""
    escape: bool = False
    element: int = -1
    live: tuple[int, ...] = ()
    """Inside a span-bound text: where in its source the text so far can start."""


class ActionGrammar:
    """The actions a policy may write on one page, for one task (see the module docstring).

    Args:
        state: The page (its rendered abstract state or the parsed one).
        intent: The task's intent (what ``fill`` may type comes from it).
        refs: ``name`` (``link 'Name'``) or ``bid`` (``'84'``): how elements are written.
        extractive_answers: Answers (``send_msg_to_user``) are spans of the page's text or
            the intent, whole numbers (counts), or ``done``; False: any text.
    """

    def __init__(self, state: str | AbstractState, intent: str, refs: str = "name",
                 extractive_answers: bool = False) -> None:
        page = state if isinstance(state, AbstractState) else parse_state(state)
        self.intent = intent.encode()
        typed = _Spans.of(self.intent)
        answers: Any = _FREE
        if extractive_answers:
            shown = "\n".join(line.name for line in page.lines)
            answers = _Spans.of(f"{shown}\n{intent}\ndone".encode(), counts=True)
        self.elements = [e for e in page.elements if e.bid]

        def ref(e: Any) -> bytes:
            return (f"{e.role} {quote(e.name)}" if refs == "name" else quote(e.bid)).encode()

        def refs_of(roles: frozenset[str] | None, options: bool = False) -> tuple[bytes, ...]:
            seen: dict[bytes, int] = {}
            for i, e in enumerate(self.elements):
                if (roles is None or e.role in roles) and (e.options or not options):
                    seen.setdefault(ref(e), i)
            return tuple(seen)

        self._element_of = {ref(e): i for i, e in reversed(list(enumerate(self.elements)))}
        any_ref = refs_of(None)
        # each verb: its pieces after "verb(": a finite set of strings, a literal, or a
        # separator; an empty set (no such element on the page) makes the verb unwritable
        self.verbs: dict[bytes, tuple[Any, ...]] = {
            **{v.encode(): (any_ref, b")") for v in _REF_VERBS},
            b"fill": (refs_of(frozenset(VALUE_ROLES)), b", ", typed, b")"),
            b"select_option": (refs_of(_SELECT_ROLES, options=True), b", ", "options", b")"),
            b"keyboard_press": (tuple(repr(k).encode() for k in KEYS), b")"),
            b"send_msg_to_user": (answers, b")"),
            b"go_back": (b")",), b"go_forward": (b")",), b"noop": (b")",),
        }
        self.verbs = {v: p for v, p in self.verbs.items()
                      if all(not isinstance(x, tuple) or x for x in p)}
        self._heads = tuple(v + b"(" for v in self.verbs)

    @property
    def start(self) -> _State:
        return _State("verb", cands=self._heads)

    def step(self, s: _State, byte: int) -> _State | None:
        """The state after one more byte, or None if the text leaves the grammar."""
        if s.phase == "done":
            return None
        if s.phase == "verb":
            cands = tuple(c for c in s.cands if len(c) > s.pos and c[s.pos] == byte)
            if not cands:
                return None
            if len(cands) == 1 and len(cands[0]) == s.pos + 1:
                return self._enter(cands[0][:-1], 0, -1)
            return _State("verb", cands=cands, pos=s.pos + 1)
        if s.phase == "set":
            cands = tuple(c for c in s.cands if len(c) > s.pos and c[s.pos] == byte)
            if not cands:
                return None
            if len(cands) == 1 and len(cands[0]) == s.pos + 1:  # sets are prefix-free
                element = self._element_of.get(cands[0], s.element)
                return self._enter(s.verb, s.piece + 1, element)
            return _State("set", s.verb, s.piece, cands, s.pos + 1, element=s.element)
        # inside a quoted text
        kind = self.verbs[s.verb][s.piece]
        spans = kind if isinstance(kind, _Spans) else None
        if s.pos == 0:  # the opening quote
            if byte not in (0x27, 0x22):
                return None
            return _State("lit", s.verb, s.piece, pos=1, quote=byte, element=s.element,
                          live=spans.starts if spans else ())
        if s.escape:
            return self._content(s, _unescape(byte), spans)
        if byte == 0x5C:  # backslash
            n = len(s.content)
            if spans and not any(p + n < len(spans.text) and spans.text[p + n] in b"'\"\\"
                                 for p in s.live):
                return None  # an escape that nothing in the source continues: a dead end
            return replace(s, pos=s.pos + 1, escape=True)
        if byte == s.quote:
            if not s.content:
                return None  # an empty text types or says nothing
            if spans and not any(p + len(s.content) in spans.ends for p in s.live) and \
                    not (spans.counts and s.content.isdigit()):
                return None  # a span does not stop inside a word or a name
            return self._enter(s.verb, s.piece + 1, s.element)
        return self._content(s, bytes([byte]), spans)

    def _content(self, s: _State, more: bytes, spans: _Spans | None) -> _State | None:
        live = s.live
        if spans:
            n, text = len(s.content), spans.text
            live = tuple(p for p in live if text.startswith(more, p + n))
            if not live and not (spans.counts and (s.content + more).isdigit()):
                return None
        return replace(s, pos=s.pos + 1, content=s.content + more, escape=False, live=live)

    def _enter(self, verb: bytes, piece: int, element: int) -> _State:
        pieces = self.verbs[verb]
        if piece >= len(pieces):
            return _State("done", verb)
        kind = pieces[piece]
        if kind == _FREE or isinstance(kind, _Spans):
            return _State("lit", verb, piece, element=element)
        if kind == "options":
            options = self.elements[element].options if element >= 0 else ()
            cands = tuple(dict.fromkeys(repr(o).encode() for o in options))
            return _State("set", verb, piece, cands, element=element)
        cands = kind if isinstance(kind, tuple) else (kind,)
        return _State("set", verb, piece, cands, element=element)

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete action of the grammar."""
        s: _State | None = self.start
        for byte in text.encode():
            s = self.step(s, byte) if s is not None else None
        return s is not None and s.phase == "done"

    def free_text(self, s: _State) -> bool:
        """Inside a text any byte but a quote or a backslash may continue (an answer with
        ``extractive_answers`` off)."""
        return s.phase == "lit" and s.pos > 0 and not s.escape and \
            self.verbs[s.verb][s.piece] == _FREE


def _wordish(byte: int) -> bool:
    """Letters, digits and any non-ASCII byte (part of a letter in UTF-8)."""
    return byte >= 0x80 or chr(byte).isalnum()


def _phrase_end(text: bytes, q: int) -> bool:
    """Whether typed text may end before ``text[q]``: not inside a word (``USB-C``,
    ``leo.fischer@…``, ``1,234.56``, ``Okafor.789``), nor before a capitalised word that goes
    on with the name (``Botanica| Daily Conditioner``)."""
    if q >= len(text):
        return True
    nxt = text[q]
    after = text[q + 1] if q + 1 < len(text) else None
    if _wordish(nxt) or nxt in b"-_@":
        return False
    if nxt in b".,:/" and after is not None and _wordish(after):
        return False
    return not (nxt == 0x20 and after is not None and after < 0x80 and chr(after).isupper())


def _unescape(byte: int) -> bytes:
    return b"\n" if byte == 0x6E else b"\t" if byte == 0x74 else bytes([byte])
