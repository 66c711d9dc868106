"""The scripted customer: τ²'s user simulator without a model, for tests and offline runs.

τ² hands its user model the scenario (reason for the call, what the customer knows and does
not) as the system message, and the agent's messages as the model's ``user`` turns. Served as
the LiteLLM model ``dg-user/scripted`` (a custom provider, called by τ²'s own simulator as any
model is), the scripted customer answers deterministically from that scenario alone: its first
turn states the reason for the call (its first sentence: the rest of the scenario's reason
is directions to the customer, never said) and what it knows; an agent's question is answered "Yes"
(a confirmation; at most :data:`CONFIRMATIONS` times); anything else ends the call (τ²'s
``###STOP###``). It asks nothing and knows no more than the scenario: a policy that needs the
customer to volunteer more needs a model user (``env.user_model``).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

PROVIDER = "dg-user"
SCRIPTED = f"{PROVIDER}/scripted"
STOP = "###STOP###"
CONFIRMATIONS = 3
_SECTION = re.compile(r"^[ \t]*(Reason for call|Known info|Unknown info|Task instructions):\s*$",
                      re.M)
_LOCK = threading.Lock()
_HANDLER: Any = None


def scenario_sections(system: str) -> dict[str, str]:
    """The sections of τ²'s ``<scenario>`` (``Reason for call``, ``Known info``, …), each's
    text with its indentation removed."""
    body = system.split("<scenario>", 1)[-1].split("</scenario>", 1)[0]
    marks = list(_SECTION.finditer(body))
    out: dict[str, str] = {}
    for mark, nxt in zip(marks, [*marks[1:], None], strict=False):
        text = body[mark.end(): nxt.start() if nxt else len(body)]
        out[mark.group(1)] = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return out


def scripted_reply(messages: list[dict[str, Any]]) -> str:
    """The scripted customer's next message, given τ²'s messages to its user model."""
    system = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    said = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    replies = [m for m in messages if m.get("role") == "assistant"]
    if not replies:
        sections = scenario_sections(system)
        opening = " ".join(s for s in (_first_sentence(sections.get("Reason for call", "")),
                                       sections.get("Known info", "")) if s)
        return opening or "I need help with my account."
    if said and said[-1].rstrip().endswith("?") and len(replies) <= CONFIRMATIONS:
        return "Yes, please go ahead."
    return STOP


def _first_sentence(text: str) -> str:
    """The reason for the call without the scenario's directions to the customer that follow
    it ("If the agent asks …, do not reveal …"): what a customer would say first."""
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return match.group(1) if match else text


def register_scripted_user() -> None:
    """Serve :data:`SCRIPTED` through LiteLLM (idempotent; other custom providers kept)."""
    global _HANDLER
    from dreamgym_agents.gateway.litellm_setup import import_litellm

    litellm = import_litellm()
    with _LOCK:
        if _HANDLER is None:
            from litellm.types.utils import ModelResponse

            class ScriptedUser(litellm.CustomLLM):
                def completion(self, model: str, messages: list, *args: Any,
                               model_response: Any = None, **kwargs: Any) -> Any:
                    response = model_response if model_response is not None else ModelResponse()
                    response.choices[0].message.content = scripted_reply(messages)
                    response.choices[0].finish_reason = "stop"
                    response.model = f"{PROVIDER}/{model}"
                    response.created = int(time.time())
                    return response

                async def acompletion(self, model: str, messages: list, *args: Any,
                                      **kwargs: Any) -> Any:
                    return self.completion(model, messages, *args, **kwargs)

            _HANDLER = ScriptedUser()
        entries = [e for e in (litellm.custom_provider_map or []) if e.get("provider") != PROVIDER]
        litellm.custom_provider_map = [*entries, {"provider": PROVIDER, "custom_handler": _HANDLER}]
