"""The policy's action grammar on a page, and decoding constrained to it.

A small policy trained from scratch knows *which kind* of action a turn needs long before it
copies strings reliably: the measured warm start wrote ``fill(searchbox 'Search', '…')`` with a
training product's name instead of the task's, and clicked links the page did not have. Decoding
is therefore constrained, like grammar-guided decoding in serving stacks (TRL's GRPO offers the
same through vLLM's guided decoding), to the actions that make sense on the current page:

- ``click`` / ``hover`` / ``dblclick`` / ``focus`` / ``clear``: an element on the page
  (``link 'Name'`` with name references, ``'84'`` with bids);
- ``fill``: a field on the page and a text taken from the task's intent (every text the
  bundled tasks type — a product, a query, an address part, a quantity — is part of the
  intent), starting at a word and ending at a phrase's end (not inside a word, nor before a
  capitalised word that continues a name: a small model's copy tends to stop early);
- ``select_option``: a drop-down on the page and one of *its* options;
- ``keyboard_press``: a key of :data:`KEYS`;
- ``send_msg_to_user``: any text (answers are copied from pages or computed);
- ``go_back()``, ``go_forward()``, ``noop()``.

The model still chooses everything — the verb, the element, where a typed text starts and ends,
the answer —; the grammar only removes what could not be executed or was never asked for. The
constraint works on bytes (byte-level BPE tokenizers: the embedded policy's, GPT-2's, Qwen's …)
with an automaton stepped byte by byte and a trie of the vocabulary, so finding a turn's allowed
next tokens visits only the vocabulary's branches that stay inside the grammar. Training scores
tokens under the unconstrained model (as TRL does with guided decoding).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from dreamgym_agents.state import VALUE_ROLES, AbstractState, parse_state, quote

logger = logging.getLogger(__name__)

KEYS: tuple[str, ...] = ("Enter", "Tab", "Escape", "Backspace", "ArrowDown", "ArrowUp",
                         "PageDown", "PageUp")
"""Keys ``keyboard_press`` may press."""

_REF_VERBS = ("click", "dblclick", "hover", "focus", "clear")
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


@dataclass(frozen=True)
class _Choice:
    """Where a :class:`ChoiceGrammar` is: ``cands`` the options the bytes so far begin,
    ``complete`` whether they already spell one (it may go on to a longer one)."""

    phase: str
    cands: tuple[bytes, ...]
    pos: int = 0
    complete: bool = False


class ChoiceGrammar:
    """One of a finite list of actions, written exactly (a text game's admissible commands).

    Options need not be prefix-free ("go to drawer 1", "go to drawer 10"): after a complete
    option the turn may end or go on (:class:`Constraint` then allows the end tokens too).
    """

    def __init__(self, options: list[str]) -> None:
        self.options = tuple(dict.fromkeys(o.encode() for o in options if o))
        if not self.options:
            raise ValueError("a choice grammar needs at least one option")

    @property
    def start(self) -> _Choice:
        return _Choice("set", self.options)

    def step(self, s: _Choice, byte: int) -> _Choice | None:
        cands = tuple(c for c in s.cands if len(c) > s.pos and c[s.pos] == byte)
        if not cands:
            return None
        pos = s.pos + 1
        complete = any(len(c) == pos for c in cands)
        if complete and len(cands) == 1:
            return _Choice("done", cands, pos, True)
        return _Choice("set", cands, pos, complete)

    def accepts(self, text: str) -> bool:
        return text.encode() in self.options


class Vocabulary:
    """A byte-level tokenizer's tokens as bytes, in a trie (built once per tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        decode = _byte_decoder()
        special = set(tokenizer.all_special_ids) | {
            int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
        self.bytes: dict[int, bytes] = {}
        self.trie: dict[int, Any] = {}
        self.ok = True
        mismatches = 0
        for token, i in tokenizer.get_vocab().items():
            if i in special:
                continue
            try:
                raw = bytes(decode[c] for c in token)
            except KeyError:
                mismatches += 1
                continue
            self.bytes[i] = raw
            node = self.trie
            for b in raw:
                node = node.setdefault(b, {})
            node.setdefault(-1, []).append(i)
        if mismatches > len(self.bytes) // 100:  # not a byte-level BPE (e.g. SentencePiece)
            self.ok = False
        self.quote_free: list[int] = []
        self.quoting: list[int] = []  # tokens with a quote or a backslash
        for i, raw in self.bytes.items():
            quoting = any(b in raw for b in (0x27, 0x22, 0x5C))
            (self.quoting if quoting else self.quote_free).append(i)


class Constraint:
    """One turn's constrained decoding: :meth:`allowed` lists the token ids that keep the
    action inside the grammar after the tokens generated so far (None: no restriction)."""

    def __init__(self, grammar: ActionGrammar | ChoiceGrammar, vocab: Vocabulary,
                 eos_ids: set[int]) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.eos = sorted(eos_ids)
        self._ids: list[int] = []
        self._state: Any = grammar.start

    def _advance(self, ids: list[int]) -> _State | None:
        if ids[:len(self._ids)] != self._ids:  # not an extension: start over
            self._ids, self._state = [], self.grammar.start
        for i in ids[len(self._ids):]:
            for byte in self.vocab.bytes.get(i, b"\xff"):
                self._state = self.grammar.step(self._state, byte) \
                    if self._state is not None else None
            self._ids.append(i)
        return self._state

    def allowed(self, ids: list[int]) -> list[int] | None:
        if any(i in self.eos for i in ids):
            return None  # finished: the row is padded from here
        state = self._advance(ids)
        if state is None:
            return None  # left the grammar (only a text written without the constraint)
        if state.phase == "done":
            return list(self.eos)
        # a complete choice that may also go on: the turn may end here
        out: list[int] = list(self.eos) if getattr(state, "complete", False) else []
        step = self.grammar.step
        if state.phase == "lit" and state.pos > 0 and not state.escape and \
                self.grammar.verbs[state.verb][state.piece] == _FREE:
            out.extend(self.vocab.quote_free)  # free text: only quotes need checking
            for i in self.vocab.quoting:
                s: _State | None = state
                for b in self.vocab.bytes[i]:
                    s = step(s, b) if s is not None else None
                if s is not None:
                    out.append(i)
            return out
        stack: list[tuple[dict[int, Any], _State]] = [(self.vocab.trie, state)]
        while stack:
            node, s = stack.pop()
            for b, child in node.items():
                if b == -1:
                    continue
                nxt = step(s, b)
                if nxt is None:
                    continue
                out.extend(child.get(-1, ()))
                stack.append((child, nxt))
        return out


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


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (the characters byte-level BPE tokens use)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}
