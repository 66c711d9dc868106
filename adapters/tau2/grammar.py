"""The grammar of a τ² tool call, for constrained decoding (a
:class:`~dreamgym_agents.policy.grammar.Grammar`).

A turn is ``done()`` or ``name(key=value, …)`` as τ² writes calls back
(``to_functional_format``): a tool of the domain, its arguments in sorted order (an optional
one may be left out, a required one never), each value of its schema's shape: a quoted string
(one of its ``enum`` where it has one), an integer, a number, a list of quoted strings, or for
anything else (objects, lists of them) a Python literal with balanced brackets. The model still
chooses every name and value; the grammar removes the calls τ²'s schema check would refuse for
their shape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dreamgym_agents.adapters.tau2.actions import STOP
from dreamgym_agents.adapters.tau2.data import DomainTools

_DIGITS = frozenset(b"0123456789")
_BARE = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_.-+")
_NL = frozenset(b"\r\n")


@dataclass(frozen=True)
class _Param:
    key: bytes
    required: bool
    kind: str  # str, enum, int, num, strlist, any
    options: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class _S:
    """Where a call is: ``phase`` name | sep | comma | key | val | done; ``tool`` the name so
    far (phase name) or chosen; ``at`` the next parameter's index; ``first`` no argument yet;
    ``buf`` the key so far; ``param`` the parameter a value is for; ``v`` the value's state."""

    phase: str
    tool: bytes = b""
    at: int = 0
    first: bool = True
    buf: bytes = b""
    param: int = -1
    v: tuple = ()

    @property
    def complete(self) -> bool:
        return self.phase == "done"


def _kind(schema: dict[str, Any]) -> tuple[str, tuple[bytes, ...]]:
    if schema.get("enum") and schema.get("type") == "string":
        return "enum", tuple(repr(str(o)).encode() for o in schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return "str", ()
    if kind == "integer":
        return "int", ()
    if kind == "number":
        return "num", ()
    if kind == "array" and (schema.get("items") or {}).get("type") == "string":
        return "strlist", ()
    return "any", ()


class ToolCallGrammar:
    """The calls of one domain's tools (``tools``) and ``done()``."""

    def __init__(self, tools: DomainTools) -> None:
        self.params: dict[bytes, tuple[_Param, ...]] = {STOP.encode(): ()}
        for name in tools.by_name:
            spec = tools.schema(name).get("parameters") or {}
            required = set(spec.get("required") or ())
            props = spec.get("properties") or {}
            self.params[name.encode()] = tuple(
                _Param(key.encode(), key in required, *_kind(props[key]))
                for key in sorted(props))

    @property
    def start(self) -> _S:
        return _S("name")

    def free_text(self, s: _S) -> bool:
        return s.phase == "val" and bool(s.v) and s.v[0] == "in"

    def accepts(self, text: str) -> bool:
        s: _S | None = self.start
        for byte in text.encode():
            s = self.step(s, byte) if s is not None else None
        return s is not None and s.complete

    # -- the automaton -------------------------------------------------------------------------
    def step(self, s: _S, byte: int) -> _S | None:
        if s.phase == "name":
            if byte == ord("("):
                return _S("sep", s.tool) if s.tool in self.params else None
            tool = s.tool + bytes([byte])
            return replace(s, tool=tool) if any(n.startswith(tool) for n in self.params) else None
        params = self.params[s.tool]
        if s.phase == "sep":
            if byte == ord(")"):
                return _S("done", s.tool) if not any(p.required for p in params[s.at:]) else None
            if not s.first:
                return replace(s, phase="comma") if byte == ord(",") else None
            return self._key(replace(s, phase="key", buf=b""), byte, params)
        if s.phase == "comma":
            return replace(s, phase="key", buf=b"") if byte == ord(" ") else None
        if s.phase == "key":
            return self._key(s, byte, params)
        if s.phase == "val":
            param = params[s.param]
            v = _value(param, s.v, byte)
            if v is not None:
                return replace(s, v=v)
            if _value_done(param, s.v):  # the value ended before this byte: read it on
                return self.step(_S("sep", s.tool, s.param + 1, False), byte)
            return None
        return None  # done: nothing may follow

    def _key(self, s: _S, byte: int, params: tuple[_Param, ...]) -> _S | None:
        # the parameters this key may name: the next one, or a later one past optional ones
        open_ = []
        for j in range(s.at, len(params)):
            open_.append(j)
            if params[j].required:
                break
        if byte == ord("="):
            found = next((j for j in open_ if params[j].key == s.buf), None)
            return None if found is None else _S("val", s.tool, s.at, s.first, param=found)
        buf = s.buf + bytes([byte])
        return replace(s, buf=buf) if any(params[j].key.startswith(buf) for j in open_) else None


def _value(p: _Param, v: tuple, byte: int) -> tuple | None:
    """The value's next state after ``byte`` (None: the byte does not continue it)."""
    if byte in _NL and not (v and v[0] in ("in", "esc")):  # a quoted string may hold any byte
        return None
    if p.kind == "str":
        return _quoted(v, byte)
    if p.kind == "enum":
        pos = v[1] if v else 0
        cands = [o for o in (v[2] if v else p.options) if len(o) > pos and o[pos] == byte]
        return ("enum", pos + 1, tuple(cands)) if cands else None
    if p.kind in ("int", "num"):
        text = (v[1] if v else b"") + bytes([byte])
        body = text[1:] if text[:1] == b"-" else text
        ok = bool(body) and body.count(b".") <= (1 if p.kind == "num" else 0) and all(
            c in _DIGITS or c == ord(".") for c in body) and body[:1] != b"."
        return ("num", text) if ok or text == b"-" else None
    if p.kind == "strlist":
        if not v:
            return ("list", "open") if byte == ord("[") else None
        if v[0] in ("in", "esc"):
            inner = _quoted(v, byte)
            return ("list", "after") if inner == ("closed",) else inner
        state = v[1]
        if state in ("open", "item") and byte == ord("'"):
            return ("in",)
        if state in ("open", "after") and byte == ord("]"):
            return ("list", "closed")
        if state == "after" and byte == ord(","):
            return ("list", "comma")
        if state == "comma" and byte == ord(" "):
            return ("list", "item")
        return None
    return _literal(v, byte)


def _quoted(v: tuple, byte: int) -> tuple | None:
    """A single-quoted string: ``("in",)`` inside, ``("esc",)`` after a backslash,
    ``("closed",)`` after its closing quote."""
    if not v:
        return ("in",) if byte == ord("'") else None
    if v[0] == "in":
        return ("esc",) if byte == ord("\\") else ("closed",) if byte == ord("'") else ("in",)
    if v[0] == "esc":
        return ("in",)
    return None


def _literal(v: tuple, byte: int) -> tuple | None:
    """Any Python literal on one line: brackets balanced, quotes closed; ``("lit", depth,
    quote, escaped, bare)``."""
    depth, quote, escaped, bare = v[1:] if v else (0, 0, False, False)
    if v and depth == 0 and not quote and not bare:
        return None  # a closed bracket or string: the value is over
    if quote:
        if escaped:
            return ("lit", depth, quote, False, False)
        if byte == ord("\\"):
            return ("lit", depth, quote, True, False)
        return ("lit", depth, 0 if byte == quote else quote, False, False)
    if byte in (ord("'"), ord('"')):
        return None if bare else ("lit", depth, byte, False, False)
    if byte in b"[{(":
        return None if bare else ("lit", depth + 1, 0, False, False)
    if byte in b"]})":
        return ("lit", depth - 1, 0, False, False) if depth > 0 else None
    if depth == 0:
        return ("lit", 0, 0, False, True) if byte in _BARE and (bare or not v) else None
    return ("lit", depth, 0, False, False)


def _value_done(p: _Param, v: tuple) -> bool:
    """Whether the value so far is a whole one (the next byte may end it)."""
    if not v:
        return False
    if p.kind == "str":
        return v == ("closed",)
    if p.kind == "enum":
        return any(len(o) == v[1] for o in v[2])
    if p.kind in ("int", "num"):
        return v[1] not in (b"-",) and not v[1].endswith(b".")
    if p.kind == "strlist":
        return v == ("list", "closed")
    depth, quote, _escaped, _bare = v[1:]
    return depth == 0 and not quote
