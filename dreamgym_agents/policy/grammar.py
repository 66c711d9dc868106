"""Decoding constrained to a grammar of actions.

A small policy knows *which kind* of action a turn needs long before it copies strings
reliably, so its decoding can be constrained, like grammar-guided decoding in serving stacks
(TRL's GRPO offers the same through vLLM's guided decoding), to the actions that make sense in
the current state. A family's :class:`~dreamgym_agents.policy.model.PolicyView` gives the turn's
grammar (:class:`Grammar`): :class:`ChoiceGrammar` for a finite list of commands (a text game's
admissible ones), the web family's ``ActionGrammar`` for actions on a page.

The constraint works on bytes (byte-level BPE tokenizers: the embedded policy's, GPT-2's, Qwen's
…) with an automaton stepped byte by byte and a trie of the vocabulary, so finding a turn's
allowed next tokens visits only the vocabulary's branches that stay inside the grammar. The
model still chooses everything; the grammar only removes what could not be executed. Training
scores tokens under the unconstrained model (as TRL does with guided decoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Grammar(Protocol):
    """A byte automaton over one turn's action: ``start`` state, ``step(state, byte)`` (None:
    the byte leaves the grammar), ``accepts(text)``. A state's ``phase`` is ``"done"`` when the
    action is complete; one with ``complete`` true may end or go on. Optional
    ``free_text(state)``: inside a quoted text where any byte but a quote or a backslash is
    allowed (lets :class:`Constraint` skip checking those tokens one by one)."""

    @property
    def start(self) -> Any: ...

    def step(self, s: Any, byte: int) -> Any | None: ...

    def accepts(self, text: str) -> bool: ...


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

    def __init__(self, grammar: Grammar, vocab: Vocabulary,
                 eos_ids: set[int]) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.eos = sorted(eos_ids)
        self._ids: list[int] = []
        self._state: Any = grammar.start

    def _advance(self, ids: list[int]) -> Any | None:
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
        free_text = getattr(self.grammar, "free_text", None)
        if free_text is not None and free_text(state):
            out.extend(self.vocab.quote_free)  # free text: only quotes need checking
            for i in self.vocab.quoting:
                s: Any | None = state
                for b in self.vocab.bytes[i]:
                    s = step(s, b) if s is not None else None
                if s is not None:
                    out.append(i)
            return out
        stack: list[tuple[dict[int, Any], Any]] = [(self.vocab.trie, state)]
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
