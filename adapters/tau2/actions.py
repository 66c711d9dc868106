"""τ²'s actions: a tool call, a message to the user, or ``done()``.

The text is read by τ²'s own parser, ``tau2.utils.tools.parse_action_string``: a JSON tool call
``{"name": …, "arguments": {…}}`` or a functional one ``name(arg='…')``; anything else is a
message. Then a tool call is checked against the domain's tool schema here, before τ² runs it:
an unknown tool, an unknown or missing argument or one of the wrong type is an invalid action
(the agent reads why), never a call τ² answers with an error it would count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dreamgym_agents.adapters.tau2.data import DomainTools, require

STOP = "done"
"""The tool that ends an episode (τ²'s gym agent adds it to every domain's tools)."""
SAY = "say"
"""The verb of a message to the user."""
_CALL_START = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(")


@dataclass(frozen=True)
class Tau2Action:
    """One action: a tool call (``verb`` the tool's name, ``arguments``), a message (``verb``
    ``say``, ``text``) or the stop (``done``)."""

    verb: str
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def is_terminal(self) -> bool:
        return self.verb == STOP

    @property
    def answer(self) -> str | None:
        return None  # τ² scores the end state and what was said, not a final answer

    @property
    def is_message(self) -> bool:
        return self.verb == SAY

    def written(self) -> str:
        """The action as τ² reads it back: ``name(arg='…')`` (arguments sorted) or the text."""
        if self.is_message:
            return self.text
        return call_text(self.verb, self.arguments)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in τ²'s functional form (its ``to_functional_format``)."""
    require()
    from tau2.data_model.message import ToolCall
    from tau2.utils.tools import to_functional_format

    return to_functional_format(ToolCall(id="", name=name, arguments=arguments))


class Tau2ActionSet:
    """Parses and describes the actions of one domain's agent (``tools``: its tools, with the
    user's own in solo mode). In solo mode there is nobody to talk to: a message is invalid."""

    def __init__(self, tools: DomainTools) -> None:
        self.tools = tools

    @property
    def solo(self) -> bool:
        return self.tools.solo

    def describe(self) -> str:
        lines = ["# Domain policy", self.tools.policy.strip(), "", "# Tools (JSON schemas)"]
        lines += [json.dumps(self.tools.schema(name)) for name in self.tools.by_name]
        lines += ["", "# How to act",
                  "One action per turn: a tool call written name(arg='value', …) or as JSON "
                  '{"name": …, "arguments": {…}}'
                  + ("" if self.solo else ", or a message to the customer (plain text)")
                  + "; done() when the task is finished."]
        return "\n".join(lines)

    def parse(self, text: str) -> Sequence[Tau2Action]:
        """The one action ``text`` holds.

        Raises:
            ValueError: Empty text, an unknown tool, arguments its schema refuses, or a message
                in solo mode; the message says what was expected.
        """
        require()
        from tau2.utils.tools import parse_action_string

        if not text or not text.strip():
            raise ValueError("empty action: call a tool, write a message, or done()")
        message = parse_action_string(text)
        calls = message.tool_calls or []
        if not calls:
            started = _CALL_START.match(text)
            if started and (started.group(1) in self.tools.by_name or started.group(1) == STOP):
                raise ValueError(f"cannot read the arguments of {text.strip()[:80]!r}: write "
                                 "them as name(arg='value', …) with Python literals")
            if self.solo:
                raise ValueError("solo mode has no customer to talk to: call a tool (the "
                                 "customer's device tools too), or done()")
            return [Tau2Action(SAY, text=text.strip())]
        call = calls[0]
        if call.name == STOP:
            return [Tau2Action(STOP)]
        self.check(call.name, dict(call.arguments or {}))
        return [Tau2Action(call.name, dict(call.arguments or {}))]

    def check(self, name: str, arguments: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``name`` is a tool of the domain and ``arguments`` fit its
        schema (no unknown argument, every required one, each of its type)."""
        tool = self.tools.by_name.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools.by_name))
            raise ValueError(f"no tool {name!r} in {self.tools.domain}: one of {known}, done")
        params = self.tools.schema(name).get("parameters") or {}
        properties = params.get("properties") or {}
        unknown = sorted(set(arguments) - set(properties))
        missing = sorted(set(params.get("required") or ()) - set(arguments))
        if unknown or missing:
            parts = ([f"unknown argument(s) {', '.join(unknown)}"] if unknown else []) + (
                [f"missing {', '.join(missing)}"] if missing else [])
            raise ValueError(f"{name}: {'; '.join(parts)} (takes "
                             f"{self.tools.signature(name)})")
        try:
            tool.params.model_validate(arguments)
        except Exception as exc:  # pydantic's ValidationError: say the first problem
            errors = getattr(exc, "errors", None)
            first = errors()[0] if callable(errors) and errors() else {"msg": str(exc)}
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ValueError(f"{name}: {where + ': ' if where else ''}{first.get('msg')} "
                             f"(takes {self.tools.signature(name)})") from None
