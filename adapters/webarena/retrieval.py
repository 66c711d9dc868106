"""The web family's hash features for the replay buffer (its ``hash_features`` hook).

A page's features are its URL path, its title and its elements as ``role|name`` with their ids
stripped (ids differ between visits of one page); an action's are its verb, the element it acts
on (resolved through the page's ids, so clicking "Laptops" matches across pages) and its string
arguments, plus, for a form submit, the shape of what it sends. The core hashes them
(:class:`dreamgym_agents.buffer.embedding.HashEmbeddingFunction`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from dreamgym_agents.adapters.webarena.state import parse_state
from dreamgym_agents.buffer.embedding import add_ngrams, words
from dreamgym_agents.errors import ConfigError

_BID_LINE = re.compile(r"^\[(?P<bid>[^\]\s]+)\]\s+(?P<rest>.*)$")
_ELEMENT = re.compile(r"^(?P<role>[A-Za-z][\w-]*)(?:\s+'(?P<name>(?:[^'\\]|\\.)*)')?")
_CALL = re.compile(r"^\s*(?P<fn>[A-Za-z_]\w*)\s*\((?P<args>.*)\)\s*$", re.DOTALL)
_STRING_ARG = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
_URL_HOST = re.compile(r"^[a-z][a-z0-9+.-]*://[^/]*", re.IGNORECASE)

VERSIONS = (1, 2)
"""The web features' versions: 2 adds the shape of what a form submit sends."""


class WebHashFeatures:
    """The web family's :class:`~dreamgym_agents.buffer.embedding.HashFeatures` at ``version``.

    Raises:
        ConfigError: Not one of :data:`VERSIONS`.
    """

    def __init__(self, version: int = 2) -> None:
        if version not in VERSIONS:
            raise ConfigError(f"hash embedding features must be 1 or 2 for web pages, "
                              f"got {version}")
        self.version = version

    def state(self, text: str) -> tuple[Counter[str], Any]:
        return state_features(text)

    def action(self, text: str, state: str, context: Any) -> Counter[str]:
        typed = typed_texts(state) if self.version >= 2 else None
        return action_features(text, context, typed)


def _url_path(url: str) -> str:
    """Drop scheme and host so ``http://127.0.0.1:7770/x`` and ``__SHOPPING__/x`` share ``/x``."""
    url = _URL_HOST.sub("", url.strip())
    url = re.sub(r"^__[A-Z_]+__", "", url)
    return url.split("#", 1)[0] or "/"


def state_features(state: str) -> tuple[Counter[str], dict[str, tuple[str, str]]]:
    """Features of an abstract state, and its elements by bid (to resolve action targets).

    Features are word unigrams and bigrams within each line, the URL path and its segments, and
    each element as ``role|name`` with its bid stripped (bids differ between visits of one page).
    """
    feats: Counter[str] = Counter()
    elements: dict[str, tuple[str, str]] = {}
    for raw in state.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("URL:"):
            path = _url_path(line[4:])
            base = path.split("?", 1)[0]
            feats[f"url:{base.lower()}"] += 2
            for seg in filter(None, base.lower().split("/")):
                feats[f"seg:{seg}"] += 1
            add_ngrams(feats, "", words(path.replace("/", " ")))
            continue
        if line.startswith("Title:"):
            title = " ".join(words(line[6:]))
            feats[f"title:{title}"] += 1
            add_ngrams(feats, "", words(title))
            continue
        bid = ""
        match = _BID_LINE.match(line)
        if match:
            bid, line = match["bid"], match["rest"]
        element = _ELEMENT.match(line)
        if element and element["name"] is not None:
            role, name = element["role"], " ".join(words(element["name"]))
            feats[f"el:{role.lower()}|{name}"] += 1
            feats[f"role:{role.lower()}"] += 1
            if bid:
                elements[bid] = (role.lower(), name)
            add_ngrams(feats, "", words(element["name"]))
            rest = line[element.end():]
            if rest.strip():
                add_ngrams(feats, "", words(rest))
            continue
        add_ngrams(feats, "", words(line))
    return feats, elements


_SENT_FIELDS = ("textbox", "searchbox", "combobox")
"""Fields a submit sends (a combobox too, unlike the web codec's ``state_delta.typed_text``,
which looks for typed text only)."""


def typed_texts(state: str) -> list[str]:
    """The non-empty values of the state's fields that a submit sends."""
    return [e.value for e in parse_state(state).elements
            if e.role.lower() in _SENT_FIELDS and e.value.strip()]


SHAPE_WEIGHT = 4
"""Count given to each shape feature of a submitted query (see :func:`action_features`)."""


def _submits(fn: str, args: list[str], target_role: str | None) -> bool:
    """Whether an action sends a form: Enter pressed, or a button clicked."""
    if fn == "keyboard_press":
        return bool(args) and args[0].lower() == "enter"
    return fn == "click" and target_role == "button"


def action_features(action: str, elements: dict[str, tuple[str, str]],
                    typed: list[str] | None = None) -> Counter[str]:
    """Features of an action such as ``click('12')`` or ``fill('15', 'usb')``.

    The function name, the target element resolved through the state's bids to ``role|name``
    (so clicking "Laptops" matches across pages with different bids), and the words of the other
    string arguments. An action in no known shape contributes its words.

    With ``typed`` (the state's text-field values, :func:`typed_texts`), an action that sends a
    form (Enter, or a click on a button) also gets the shape of what it sends: submitted at all,
    how many words (1, 2, 3, 4 or more) and whether there is a comma. What a search page shows
    depends on the kind of query far more than on which button sent it: a whole product name
    finds that one product, a keyword a list. Without the shape, a product-name search sent by
    the Search button retrieves only keyword searches sent the same way, and the dream writes
    their lists.
    """
    feats: Counter[str] = Counter()
    call = _CALL.match(action)
    if not call:
        add_ngrams(feats, "a", words(action))
        return feats
    fn = call["fn"].lower()
    feats[f"afn:{fn}"] += 1
    args = [m.group(1) if m.group(1) is not None else m.group(2)
            for m in _STRING_ARG.finditer(call["args"])]
    target = elements.get(args[0]) if args else None
    if typed and _submits(fn, args, target[0] if target else None):
        feats["asubmit"] += 2
        for text in typed:
            feats[f"atyped:n{min(len(words(text)), 4)}"] += SHAPE_WEIGHT
            if "," in text:
                feats["atyped:comma"] += SHAPE_WEIGHT
    if target is not None:
        role, name = target
        feats[f"ael:{role}|{name}"] += 2
        feats[f"arole:{role}"] += 1
        add_ngrams(feats, "an", name.split())
        args = args[1:]
    elif args and re.fullmatch(r"[a-z]?\d+", args[0]):
        feats[f"abid:{args[0]}"] += 1  # a bid absent from the state: weak evidence only
        args = args[1:]
    for arg in args:
        add_ngrams(feats, "aa", words(arg))
    if not args and not call["args"].strip():
        feats[f"afn0:{call['fn'].lower()}"] += 1
    return feats
