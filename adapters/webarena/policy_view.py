"""The web family's policy view: pages shown compactly, elements named instead of numbered, and
decoding constrained to the page's actions.

Pages are shown compactly (:func:`compact_page`): text lines without their ``StaticText`` role,
headings as ``# …``, long texts cut, at most ``max_state_lines`` lines. By default elements are
shown and named without their bids (``element_refs="name"``, :mod:`.grounding`): the agent
resolves ``click(link 'Name')`` to the element's bid on the current page, so a product's link is
a copy of its name from the task rather than a number looked up on the page. The grammar of a
turn is :class:`~dreamgym_agents.adapters.webarena.action_grammar.ActionGrammar` on the page.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from dreamgym_agents.adapters.webarena.grounding import refer, resolve
from dreamgym_agents.adapters.webarena.options import WebViewOptions
from dreamgym_agents.adapters.webarena.state import parse_line, parse_state
from dreamgym_agents.policy.model import PolicyConfig, view_options


@functools.lru_cache(maxsize=64)
def _options(given: tuple[tuple[str, Any], ...]) -> WebViewOptions:
    return view_options(WebViewOptions, PolicyConfig(options=dict(given)))


def web_options(cfg: PolicyConfig) -> WebViewOptions:
    """The web view's settings in ``cfg`` (its ``options``), read once per distinct set."""
    return _options(tuple(sorted(cfg.options.items())))

_TEXT = re.compile(r"^StaticText '(.*)'$")
_HEADING = re.compile(r"^heading '(.*)'$")
_BID = re.compile(r"^\[[^\]\s]+\] ")
_LABEL = re.compile(r"^([^:|·]+?)\s*(?::\s|\s\|\s)")
_NUMBER = re.compile(r"\d{5,}")


def mentions(name: str, intent: str) -> bool:
    """Whether the task's ``intent`` mentions a page line's ``name``: the whole name (at least
    4 characters, a cut name by what is left of it), its label (``Jacket`` of ``Jacket | PVC``,
    ``Rating`` of ``Rating: 4.0 out of 5``), or a number of 5+ digits in it (an order's
    ``#100062``), case-insensitively."""
    text = intent.lower()
    name = name.rstrip("…").strip().lower()
    label = _LABEL.match(name)
    parts = [name, label.group(1)] if label else [name]
    if any(len(p) >= 4 and p in text for p in parts):
        return True
    return any(n in text for n in _NUMBER.findall(name))


def compact_page(state: str, max_lines: int = 80, max_chars: int = 100,
                 bids: bool = True, intent: str | None = None) -> str:
    """The page as the policy sees it: text lines bare, headings as ``# …``, long ones cut,
    elements without their ``[bid]`` unless ``bids``. With an ``intent``, the lines the task
    mentions (:func:`mentions`) are marked ``* ``, so a small model finds the product to click
    or the attribute to read without matching every line against the task itself."""
    out = []
    for line in state.splitlines():
        marked = False
        if intent and line and not line.startswith(("URL: ", "Title: ")):
            marked = mentions(parse_line(line).name, intent)
        if not bids:
            line = _BID.sub("", line, count=1)
        if m := _TEXT.match(line):
            line = m.group(1)
        elif m := _HEADING.match(line):
            line = f"# {m.group(1)}"
        if len(line) > max_chars:
            line = line[:max_chars] + "…"
        out.append(f"* {line}" if marked else line)
    if len(out) > max_lines:
        out = [*out[:max_lines], f"(… {len(out) - max_lines} more lines)"]
    return "\n".join(out)


class WebPolicyView:
    """:class:`~dreamgym_agents.policy.model.PolicyView` of web pages."""

    @staticmethod
    def page(state: str, intent: str, cfg: PolicyConfig) -> str:
        options = web_options(cfg)
        return compact_page(state, cfg.max_state_lines, cfg.max_text_chars,
                            bids=options.element_refs == "bid",
                            intent=intent if options.mark_task_terms else None)

    @staticmethod
    def written(action: str, state: str, cfg: PolicyConfig) -> str:
        return action if web_options(cfg).element_refs == "bid" else refer(action, state)

    @staticmethod
    def resolve(written: str, state: str, cfg: PolicyConfig) -> str | None:
        return resolve(written, state) if web_options(cfg).element_refs == "name" else written

    @staticmethod
    def grammar(state: str, intent: str, cfg: PolicyConfig) -> Any:
        from dreamgym_agents.adapters.webarena.action_grammar import ActionGrammar

        page = parse_state(state)
        if not page.url or not page.elements:
            return None  # not a web page with elements: the web grammar does not apply
        options = web_options(cfg)
        return ActionGrammar(page, intent, options.element_refs,
                             extractive_answers=options.extractive_answers)
