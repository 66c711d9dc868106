"""Web actions: BrowserGym's high-level calls and WebArena's bracket grammar.

The canonical action is a BrowserGym high-level function call of the ``webarena`` action subset
(``HighLevelActionSet(subsets=["webarena"])``): ``noop``, ``scroll``, ``keyboard_press``,
``click``, ``fill``, ``hover``, ``tab_focus``, ``new_tab``, ``go_back``, ``go_forward``,
``goto``, ``tab_close``, ``select_option``, ``send_msg_to_user``, ``report_infeasible``.

:class:`WebActionSet` parses two grammars into canonical actions:

1. BrowserGym calls, one or several: ``click('12')``, ``fill('15', "usb cable")``,
   ``send_msg_to_user("$12.99")``. Function names, argument counts, keyword names and argument
   types are checked against the signatures of the subset's functions.
2. WebArena's bracket grammar (its prompts' ``click [id]`` …), mapped as follows:

   ======================  ===============================================================
   ``click [id]``          ``click('id')``
   ``hover [id]``          ``hover('id')``
   ``type [id] [text] [1]``  ``fill('id', 'text')`` then ``keyboard_press('Enter')``
                           (flag ``0``: no Enter; the flag defaults to ``1`` as in WebArena)
   ``press [key_comb]``    ``keyboard_press('Control+a')`` (``Ctrl`` → ``Control``,
                           ``Cmd``/``Meta`` → ``ControlOrMeta`` as WebArena does on Linux)
   ``scroll [down|up]``    ``scroll(0, ±scroll_px)``
   ``goto [url]``          ``goto('url')``
   ``new_tab``, ``close_tab``, ``go_back``, ``go_forward``, ``noop``  the matching call
   ``tab_focus [i]``       ``tab_focus(i)``
   ``stop [answer]``       ``send_msg_to_user('answer')`` (``stop []`` or ``stop``: empty answer)
   ======================  ===============================================================

   One action per line; ``stop`` takes the rest of the text, so its answer may span lines.
   Text inside brackets may itself contain brackets (the last ``]`` closes it, as WebArena's
   greedy regular expressions do).

Both grammars tolerate surrounding whitespace, a surrounding Markdown code fence and a leading
``Action:``. Anything else raises :class:`ActionParseError`; callers record it as an
invalid-action step (it is the model's failure, not the program's).
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dreamgym_agents.errors import MissingExtraError

logger = logging.getLogger(__name__)

ACTION_SUBSET = "webarena"
"""The BrowserGym action subset whose functions are the canonical actions."""

TERMINAL_ACTIONS: frozenset[str] = frozenset({"send_msg_to_user", "report_infeasible", "stop"})
"""Actions that end an episode."""

INFEASIBLE_ANSWER = "N/A"
"""The answer of ``report_infeasible`` (WebArena's convention for unachievable tasks)."""


class ActionParseError(ValueError):
    """The text is not a valid action; the message says what was expected."""


@dataclass(frozen=True)
class WebAction:
    """One canonical action: a BrowserGym high-level call.

    Attributes:
        name: Function name (``click``, ``fill`` …).
        args: Positional arguments, canonical: keyword arguments are made positional, trailing
            arguments equal to their default are dropped, lists are stored as tuples.
    """

    name: str
    args: tuple = ()

    def to_browsergym(self) -> str:
        """The call as BrowserGym high-level code, e.g. ``fill('15', 'usb cable')``."""
        return f"{self.name}({', '.join(_literal(a) for a in self.args)})"

    @property
    def verb(self) -> str:
        """The function name (the family-independent view of an action, ``env.Action``)."""
        return self.name

    @property
    def is_terminal(self) -> bool:
        """True if the action ends the episode (an answer or a declared infeasibility)."""
        return self.name in TERMINAL_ACTIONS

    @property
    def answer(self) -> str | None:
        """The answer of a terminal action (``"N/A"`` for ``report_infeasible``), else None."""
        if self.name == "report_infeasible":
            return INFEASIBLE_ANSWER
        if self.name in TERMINAL_ACTIONS:
            return str(self.args[0]) if self.args else ""
        return None

    @property
    def typed(self) -> str | None:
        """The text a ``fill`` types (``env.Action.typed``), else None."""
        if self.name == "fill" and len(self.args) >= 2:
            return str(self.args[1])
        return None

    def __str__(self) -> str:
        return self.to_browsergym()


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _literal(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


# --------------------------------------------------------------------------------------------
# Argument checking against the BrowserGym function signatures
# --------------------------------------------------------------------------------------------


class _TypeMismatch(Exception):
    pass


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return f"a list of ({_type_name(item)})"
    return getattr(annotation, "__name__", str(annotation))


def _coerce(value: Any, annotation: Any) -> Any:
    """Check ``value`` against ``annotation``; return it canonicalised or raise _TypeMismatch."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    if origin is Literal:
        if value in typing.get_args(annotation):
            return value
        raise _TypeMismatch
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option)
            except _TypeMismatch:
                continue
        raise _TypeMismatch
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise _TypeMismatch
        return tuple(_coerce(v, item) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _TypeMismatch
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # click(12): element ids are strings
        raise _TypeMismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _TypeMismatch
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise _TypeMismatch
    if value is None and annotation is type(None):
        return value
    if isinstance(annotation, type) and isinstance(value, annotation):
        return value
    raise _TypeMismatch


@dataclass(frozen=True)
class _Spec:
    name: str
    signature: inspect.Signature
    hints: dict[str, Any]
    description: str

    def canonical(self, positional: Sequence[Any], named: dict[str, Any]) -> WebAction:
        try:
            bound = self.signature.bind(*positional, **named)
        except TypeError as exc:
            raise ActionParseError(
                f"bad arguments for {self.name}: {exc}; expected {self.name}{self.signature}"
            ) from None
        values: list[Any] = []
        defaults: list[Any] = []
        for pname, param in self.signature.parameters.items():
            if pname in bound.arguments:
                raw = bound.arguments[pname]
                try:
                    value = _coerce(raw, self.hints.get(pname, param.annotation))
                except _TypeMismatch:
                    expected = _type_name(self.hints.get(pname, param.annotation))
                    raise ActionParseError(
                        f"bad argument {pname}={raw!r} for {self.name}: expected {expected}; "
                        f"signature {self.name}{self.signature}"
                    ) from None
            else:
                value = param.default
            values.append(_as_tuple(value))
            defaults.append(_as_tuple(param.default))
        # Drop trailing defaults so that click('12') and click('12', button='left') are equal.
        while values and defaults[len(values) - 1] is not inspect.Parameter.empty:
            if values[-1] != defaults[len(values) - 1]:
                break
            values.pop()
        return WebAction(self.name, tuple(values))


# --------------------------------------------------------------------------------------------
# WebArena bracket grammar
# --------------------------------------------------------------------------------------------

_KEY_ALIASES = {
    "ctrl": "Control",
    "control": "Control",
    "cmd": "ControlOrMeta",
    "command": "ControlOrMeta",
    "meta": "ControlOrMeta",
    "controlormeta": "ControlOrMeta",
    "alt": "Alt",
    "option": "Alt",
    "shift": "Shift",
    "enter": "Enter",
    "return": "Enter",
    "esc": "Escape",
    "escape": "Escape",
    "tab": "Tab",
    "space": "Space",
    "backspace": "Backspace",
    "delete": "Delete",
    "del": "Delete",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "PageUp",
    "pagedown": "PageDown",
    "up": "ArrowUp",
    "down": "ArrowDown",
    "left": "ArrowLeft",
    "right": "ArrowRight",
    "arrowup": "ArrowUp",
    "arrowdown": "ArrowDown",
    "arrowleft": "ArrowLeft",
    "arrowright": "ArrowRight",
}
_FKEY = re.compile(r"^f([1-9]|1[0-2])$", re.IGNORECASE)


def normalize_key_comb(key_comb: str) -> str:
    """Map a WebArena key combination (``Ctrl+v``, ``enter``) to Playwright key names."""
    combo = key_comb.strip()
    if combo == "+":
        return combo
    parts = [p.strip() for p in re.split(r"\+(?!$)", combo)]
    out = []
    for part in parts:
        low = part.lower()
        if low in _KEY_ALIASES:
            out.append(_KEY_ALIASES[low])
        elif _FKEY.match(part):
            out.append(part.upper())
        else:
            out.append(part)
    return "+".join(out)


_ID = r"\[\s*([^\]\s]+)\s*\]"
_EMPTY_BRACKETS = r"(?:\s*\[\s*\])?"
_BRACKET_FORMS = (
    "click [id]",
    "type [id] [text] [0|1]",
    "hover [id]",
    "press [key_comb]",
    "scroll [down|up]",
    "new_tab",
    "tab_focus [index]",
    "close_tab",
    "goto [url]",
    "go_back",
    "go_forward",
    "stop [answer]",
)
_BRACKET_KEYWORDS = frozenset(
    {
        "click",
        "type",
        "hover",
        "press",
        "scroll",
        "new_tab",
        "tab_focus",
        "close_tab",
        "goto",
        "go_back",
        "go_forward",
        "stop",
        "noop",
    }
)
_KEYWORD = re.compile(r"^([A-Za-z_]+)(?=\s|\[|$)")


def _fence_stripped(text: str) -> str:
    text = text.strip()
    text = re.sub(r"^action\s*:\s*", "", text, flags=re.IGNORECASE)
    # A language tag counts only when a newline follows it: "```click('1')```" has none.
    fence = re.match(r"^```(?:[\w+-]*[ \t]*\n)?(.*?)\s*```$", text, flags=re.DOTALL)
    if fence:
        text = fence.group(1).strip()
    elif len(text) > 1 and text.startswith("`") and text.endswith("`") and "`" not in text[1:-1]:
        text = text[1:-1].strip()
    text = re.sub(r"^action\s*:\s*", "", text, flags=re.IGNORECASE)
    return text.strip()


# pyparsing learns a parse action's arity on its first calls, trying fewer arguments after each
# TypeError, in state its wrapper shares unguarded: two threads learning at once can drive it
# past the right count, and the action then fails with a TypeError of its own. A dream pool's
# episodes parse from many threads, so BrowserGym's grammar parses one text at a time, ours
# and its own (a parse is pure Python under the GIL: the lock costs no parallelism).
_PARSE_LOCK = threading.Lock()


class WebActionSet:
    """The web action space: describe it for prompts, parse model output, build env code.

    Args:
        scroll_px: Vertical distance of WebArena's ``scroll [down]``/``scroll [up]``
            (WebArena scrolls by one window height; BrowserGym's default viewport is 720 px).
        multiaction: Accept several calls/lines in one answer (they run in sequence without
            feedback from the page).
    """

    def __init__(self, *, scroll_px: int = 600, multiaction: bool = True) -> None:
        try:
            from browsergym.core.action import functions as bg_functions
            from browsergym.core.action.highlevel import HighLevelActionSet
            from browsergym.core.action.parsers import NamedArgument, highlevel_action_parser
        except ImportError:
            raise MissingExtraError("browsergym-core", "web") from None
        self.scroll_px = scroll_px
        self.multiaction = multiaction
        self._bg_set = HighLevelActionSet(subsets=[ACTION_SUBSET], multiaction=True, strict=False)
        self._parser = highlevel_action_parser
        self._named_argument = NamedArgument
        self.specs: dict[str, _Spec] = {}
        for name, action in self._bg_set.action_set.items():
            func = getattr(bg_functions, name)
            try:
                hints = typing.get_type_hints(func)
            except Exception:  # unresolvable annotations: check counts only
                logger.debug("no type hints for %s", name, exc_info=True)
                hints = {}
            self.specs[name] = _Spec(name, inspect.signature(func), hints, action.description)

    @property
    def action_names(self) -> list[str]:
        """Names of the canonical actions, in BrowserGym's order."""
        return list(self.specs)

    # -- prompt text --------------------------------------------------------------------------
    def describe(self) -> str:
        """Explain both grammars, with examples, for an agent prompt."""
        lines = [
            "Answer with one action. Two equivalent syntaxes are accepted.",
            "",
            "1. Function calls (BrowserGym). Element ids are the numbers in brackets in the page "
            "state, passed as strings:",
        ]
        for spec in self.specs.values():
            lines.append(f"   {spec.name}{_short_signature(spec.signature)}: {spec.description}")
        lines += [
            "   Examples: click('12')   fill('15', \"usb cable\")   select_option('20', 'Price')"
            '   send_msg_to_user("$12.99")',
            "",
            "2. WebArena commands:",
            "   click [id] | type [id] [text] [1] (the final 1 presses Enter after typing, 0 does "
            "not; default 1) | hover [id] | press [key_comb] | scroll [down] | scroll [up] | "
            "new_tab | tab_focus [index] | close_tab | goto [url] | go_back | go_forward | "
            "stop [answer]",
            "   Examples: click [12]   type [15] [usb cable] [1]   stop [$12.99]",
            "",
            'To finish, give the answer with send_msg_to_user("...") or stop [answer] '
            "(stop [] when no answer is needed); if the task is impossible, use "
            'report_infeasible("reason") or stop [N/A].',
        ]
        return "\n".join(lines)

    # -- parsing ------------------------------------------------------------------------------
    def parse(self, text: str) -> list[WebAction]:
        """Parse model output into canonical actions.

        Args:
            text: The action text (BrowserGym calls or WebArena commands).

        Returns:
            One or more actions (WebArena's ``type … [1]`` gives two).

        Raises:
            ActionParseError: The text is not a valid action; the message says what was expected.
        """
        cleaned = _fence_stripped(text or "")
        if not cleaned:
            raise ActionParseError(
                "empty action: expected a call such as click('12') or a command such as click [12]"
            )
        if re.match(r"^[A-Za-z_]\w*\s*\(", cleaned):
            actions = self._parse_calls(cleaned)
        else:
            actions = self._parse_brackets(cleaned)
        if not self.multiaction and len(actions) > 1 and not _is_type_enter(actions):
            raise ActionParseError(
                f"got {len(actions)} actions: give exactly one action per answer"
            )
        return actions

    def parse_one(self, text: str) -> WebAction:
        """Parse text that must hold exactly one canonical action."""
        actions = self.parse(text)
        if len(actions) != 1:
            raise ActionParseError(f"expected one action, got {len(actions)}")
        return actions[0]

    def _parse_calls(self, text: str) -> list[WebAction]:
        import pyparsing as pp

        try:
            with _PARSE_LOCK:
                calls = self._parser.parse_string(text, parse_all=True).as_list()
        except pp.ParseBaseException as exc:
            raise ActionParseError(
                f"could not parse the function call at line {exc.lineno}, column {exc.col}: "
                "expected calls like click('12') or fill('15', \"text\") with quoted strings"
            ) from None
        actions = []
        for name, raw_args in calls:
            spec = self.specs.get(name)
            if spec is None:
                hint = (
                    " (to answer, use send_msg_to_user(...) or stop [answer])"
                    if name in ("stop", "answer", "type")
                    else ""
                )
                raise ActionParseError(
                    f"unknown action {name!r}{hint}; expected one of: " + ", ".join(self.specs)
                )
            positional: list[Any] = []
            named: dict[str, Any] = {}
            for arg in raw_args:
                if isinstance(arg, self._named_argument):
                    if arg.name in named:
                        raise ActionParseError(f"argument {arg.name!r} given twice to {name}")
                    named[arg.name] = arg.value
                elif named:
                    raise ActionParseError(
                        f"positional argument after keyword argument in {name}(...)"
                    )
                else:
                    positional.append(arg)
            actions.append(spec.canonical(positional, named))
        return actions

    def _parse_brackets(self, text: str) -> list[WebAction]:
        actions: list[WebAction] = []
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            i += 1
            if not line:
                continue
            m = _KEYWORD.match(line)
            keyword = m.group(1).lower() if m else ""
            if keyword == "stop":
                rest = "\n".join([line] + lines[i:]).strip()
                actions.append(self._bracket_stop(rest))
                break
            actions.extend(self._bracket_line(keyword, line))
        return actions

    def _bracket_stop(self, text: str) -> WebAction:
        m = re.match(r"^stop\s*\[(.*)\]\s*$", text, flags=re.DOTALL | re.IGNORECASE)
        if m:
            return WebAction("send_msg_to_user", (m.group(1).strip(),))
        if re.match(r"^stop\s*$", text, flags=re.IGNORECASE):
            return WebAction("send_msg_to_user", ("",))
        raise ActionParseError(f"invalid stop action {text!r}: expected stop [answer] or stop []")

    def _bracket_line(self, keyword: str, line: str) -> list[WebAction]:
        if keyword not in _BRACKET_KEYWORDS:
            raise ActionParseError(
                f"cannot parse {line!r}: expected a call such as click('12') or one of "
                + ", ".join(_BRACKET_FORMS)
            )
        flags = re.IGNORECASE | re.DOTALL

        def expect(pattern: str, form: str) -> re.Match[str]:
            m = re.match(pattern, line, flags)
            if not m:
                raise ActionParseError(f"invalid {keyword} action {line!r}: expected {form}")
            return m

        if keyword in ("click", "hover"):
            m = expect(rf"^{keyword}\s*{_ID}\s*$", f"{keyword} [id]")
            return [WebAction(keyword, (m.group(1),))]
        if keyword == "type":
            if not re.search(r"\[\s*[01]\s*\]\s*$", line):
                line = line + " [1]"
            m = expect(rf"^type\s*{_ID}\s*\[(.*)\]\s*\[\s*([01])\s*\]\s*$", "type [id] [text] [1]")
            fill = self.specs["fill"].canonical([m.group(1), m.group(2)], {})
            if m.group(3) == "1":
                return [fill, WebAction("keyboard_press", ("Enter",))]
            return [fill]
        if keyword == "press":
            m = expect(r"^press\s*\[(.+)\]\s*$", "press [key_comb], e.g. press [Enter]")
            key = normalize_key_comb(m.group(1))
            if not key:
                raise ActionParseError("invalid press action: the key combination is empty")
            return [WebAction("keyboard_press", (key,))]
        if keyword == "scroll":
            m = expect(r"^scroll\s*\[?\s*(up|down)\s*\]?\s*$", "scroll [down] or scroll [up]")
            dy = self.scroll_px if m.group(1).lower() == "down" else -self.scroll_px
            return [WebAction("scroll", (0, dy))]
        if keyword == "goto":
            m = expect(r"^goto\s*\[(.+)\]\s*$", "goto [url]")
            url = m.group(1).strip()
            if not url:
                raise ActionParseError("invalid goto action: the url is empty")
            return [WebAction("goto", (url,))]
        if keyword == "tab_focus":
            m = expect(r"^tab_focus\s*\[\s*(\d+)\s*\]\s*$", "tab_focus [index]")
            return [WebAction("tab_focus", (int(m.group(1)),))]
        simple = {
            "new_tab": "new_tab",
            "close_tab": "tab_close",
            "go_back": "go_back",
            "go_forward": "go_forward",
            "noop": "noop",
        }
        expect(rf"^{keyword}{_EMPTY_BRACKETS}\s*$", keyword)
        return [WebAction(simple[keyword], ())]

    # -- execution ----------------------------------------------------------------------------
    def to_python(self, actions: Sequence[WebAction]) -> str:
        """The Python code BrowserGym's env executes for these actions (in sequence)."""
        if not actions:
            raise ValueError("to_python needs at least one action")
        for action in actions:
            if action.name not in self.specs:
                raise ValueError(f"{action.name!r} is not a BrowserGym {ACTION_SUBSET} action")
        with _PARSE_LOCK:  # BrowserGym parses the calls again, with the same grammar
            return self._bg_set.to_python_code("\n".join(a.to_browsergym() for a in actions))

    def to_browsergym(self, actions: Sequence[WebAction]) -> str:
        """The actions as BrowserGym high-level code, one call per line."""
        return "\n".join(a.to_browsergym() for a in actions)


def _short_signature(signature: inspect.Signature) -> str:
    parts = []
    for name, param in signature.parameters.items():
        if param.default is inspect.Parameter.empty:
            parts.append(name)
        else:
            parts.append(f"{name}={param.default!r}")
    return "(" + ", ".join(parts) + ")"


def _is_type_enter(actions: list[WebAction]) -> bool:
    """WebArena's ``type … [1]`` is one action that becomes fill + Enter."""
    return (
        len(actions) == 2
        and actions[0].name == "fill"
        and actions[1] == WebAction("keyboard_press", ("Enter",))
    )
