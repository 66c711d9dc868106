"""What the policy sees of a τ² state: the tools it may call, then the transcript.

The domain policy (several pages) is the LLM agent's to read (the action set's ``describe``,
in its prompt); a small local policy sees the tools as signatures and the transcript with its
opening kept and its latest lines first to go last: a long conversation loses its middle, not
its end.
"""

from __future__ import annotations

from typing import Any

from dreamgym_agents.adapters.tau2.actions import STOP
from dreamgym_agents.adapters.tau2.data import DomainTools
from dreamgym_agents.policy.model import PlainView, PolicyConfig

RESULT_CHARS = 1200
"""The shortest cut of a line here: a tool's result is JSON whose ids the next call copies (the
policy's ``max_text_chars``, 100 by default, is a web page's text line)."""
OPENING_LINES = 2
"""The lines a long transcript always keeps: the domain and the ticket (or the customer's
opening)."""


class Tau2View(PlainView):
    """:class:`~dreamgym_agents.policy.model.PlainView` with a ``Tools:`` line (each tool's
    signature) and long transcripts cut in the middle."""

    def __init__(self, tools: DomainTools) -> None:
        super().__init__()
        self.tools = tools
        self._grammar: Any = None
        self.tools_line = "Tools: " + "; ".join(
            [*(tools.signature(name) for name in tools.by_name), f"{STOP}()"])

    def page(self, state: str, intent: str, cfg: PolicyConfig) -> str:
        del intent
        cut = max(cfg.max_text_chars, RESULT_CHARS)
        lines = [ln if len(ln) <= cut else ln[:cut] + "…" for ln in state.strip().splitlines()]
        keep = max(cfg.max_state_lines - 1, OPENING_LINES + 1)
        if len(lines) > keep:
            tail = keep - OPENING_LINES - 1
            lines = [*lines[:OPENING_LINES],
                     f"(… {len(lines) - OPENING_LINES - tail} earlier lines)",
                     *lines[len(lines) - tail:]]
        return "\n".join([self.tools_line, *lines])

    def grammar(self, state: str, intent: str, cfg: PolicyConfig) -> Any:
        """In solo mode, a tool call of the domain's shape (:class:`.grammar.ToolCallGrammar`);
        with a customer, none: a message is free text."""
        del state, intent
        if not cfg.constrained_decoding or not self.tools.solo:
            return None
        if self._grammar is None:
            from dreamgym_agents.adapters.tau2.grammar import ToolCallGrammar

            self._grammar = ToolCallGrammar(self.tools)
        return self._grammar
