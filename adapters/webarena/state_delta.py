"""Next states written relative to a known state: ``@state`` / ``@demo N`` plus line edits.

An experience model may write the next state in full, or as a reference to a state it was shown
followed by edits. The reference is the first line of the ``<next_state>`` block:

- ``@state``: the current state;
- ``@previous``: the page ``go_back`` returns to, as the history recorded it: the state before
  the last navigation (:func:`~dreamgym_agents.adapters.webarena.experience_prompt.back_page`),
  when the model is given the episode's history;
- ``@demo N``: the next state of the N-th retrieved demonstration (1-based, as shown).

Each following line is an edit applied in order with a cursor (initially at the end):
``- <line>`` deletes the first occurrence of that line and puts the cursor where it was;
``+ <line>`` inserts the line at the cursor (then after it), except that a line whose ``[bid]``
is already on the page replaces that element's line where it stands (ids are unique on a page):
a field's new value is one line, ``+ [37] searchbox 'Search' value='{typed}'``. A replacement
of a line without an id is ``-`` old then ``+`` new, and keeps the line's place. A bare line
that reads like a state line (``[12] link 'Home'``, ``StaticText '…'``) is taken as a ``+``, the
way a reader would take it: small models sometimes drop the ``+``.

An edit line may name the element the action targets instead of copying its line:
``+ @target value='…'`` is that element's line (same id, role, name and options) with the value
given (and the flags given, if any), in place. A field's new value is then one short line; a
small model that has to copy the field's line (``[44] combobox 'Sort by' … options='…'``) writes
other ids and names.

Two placeholders stand for the text the action types (``fill(bid, text)``, or the option of
``select_option(bid, option)``), or else the text typed into the current page's filled text
field (the last ``textbox``/``searchbox`` line with a ``value='…'``): ``{typed}`` as the page
quotes it and ``{typed+}`` as a URL query carries it (``+`` for spaces, ``%2C`` for commas). A
search results page repeats the query in its URL, title, heading and search box. A small model
copies a long query well through a placeholder; spelling it out, it garbles the query character
by character or writes a demo's query (evidence: docs/history/results-2026-11-to-12.md). The
placeholders are expanded in full states and in edit lines alike, and :func:`demo_pages` writes
a demo's own typed text as placeholders, so ``@demo N`` after a search is the demo's results
page for this step's query.

Writing a page as "the same page as that demo's, with the cart count changed" is how a person
would describe it, and it keeps a small model's answers short: the embedded default model is
trained on the shortest of the full state and every reference form (:func:`encode_state`).
Hosted models may use either form.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
from urllib.parse import quote_plus

from dreamgym_agents.adapters.webarena.state import (
    Element,
    action_bid,
    parse_line,
    parse_state,
    quote,
    target_line,
)
from dreamgym_agents.experience.codec import StateReferenceError

STATE_REF = "@state"
PREVIOUS_REF = "@previous"
DEMO_REF = "@demo"
TARGET_REF = "@target"
_STATE_LINE = re.compile(r"^(?:URL|Title):|^(?:\[[^\]\s]+\]\s+)?[A-Za-z][\w-]*(?:\s+'|$)")
_BID = re.compile(r"^\[([^\]\s]+)\]\s")
"""An abstract state line: ``URL:``/``Title:``, or an optional ``[bid]``, a role, then its
quoted name (or nothing)."""


TYPED, TYPED_URL = "{typed}", "{typed+}"
_TEXT_FIELDS = ("textbox", "searchbox")


def _filled(action: str | None) -> str | None:
    """The text of a ``fill(bid, text)`` action (the option of ``select_option(bid, option)``),
    or None."""
    if not action or not action.strip().startswith(("fill(", "select_option(")):
        return None
    try:
        call = ast.parse(action.strip(), mode="eval").body
    except SyntaxError:
        return None
    args = getattr(call, "args", [])
    if len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
        return args[1].value
    return None


@functools.lru_cache(maxsize=512)
def typed_text(current: str, action: str | None = None) -> tuple[str, str] | None:
    """The text ``action`` types (a ``fill``), else the text in ``current``'s last filled text
    field: ``(as quoted in a state, as in a URL query)``, or None when there is none.

    Cached: encoding and expanding one step ask for it once per candidate reference."""
    text = _filled(action)
    if not text:
        fields = [e.value for e in parse_state(current).elements
                  if e.role in _TEXT_FIELDS and e.value]
        text = fields[-1] if fields else None
    if not text:
        return None
    return quote(text)[1:-1], quote_plus(text)


def fill_typed(text: str, current: str, action: str | None = None) -> str:
    """``text`` with :data:`TYPED` / :data:`TYPED_URL` replaced by the typed text
    (:func:`typed_text`; left as they are when nothing is typed)."""
    typed = typed_text(current, action)
    if typed is None or "{typed" not in text:
        return text
    return text.replace(TYPED_URL, typed[1]).replace(TYPED, typed[0])


def use_typed(text: str, current: str, action: str | None = None) -> str:
    """``text`` with ``current``'s typed text written as placeholders where it stands whole: a
    quoted name (``'…'``, ``\\'…\\'``) or a URL query value (``=…``). The inverse of
    :func:`fill_typed`; callers check the round trip."""
    typed = typed_text(current, action)
    if typed is None:
        return text
    quoted, query = typed
    text = re.sub(rf"(?<==){re.escape(query)}(?=&|$|\s)", lambda _: TYPED_URL, text,
                  flags=re.M)
    return re.sub(rf"(?<='){re.escape(quoted)}(?=\\?')", lambda _: TYPED, text)


def demo_pages(demos: list, current: str, action: str | None = None) -> list[str]:
    """The next states of retrieved demonstrations (objects with ``state``, ``action`` and
    ``next_state``) as ``@demo N`` refers to them: when this step types text, each demo's own
    typed text is written as the placeholders (:func:`use_typed`), so the page a demo's search
    led to reads as the same page for this step's query."""
    if typed_text(current, action) is None:
        return [d.next_state for d in demos]
    return [use_typed(d.next_state, d.state, d.action) for d in demos]


def is_reference(text: str) -> bool:
    """True when a ``<next_state>`` block is written as a reference plus edits."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return first in (STATE_REF, PREVIOUS_REF) or first.startswith(DEMO_REF)


def expand_state(text: str, current: str, demo_next_states: list[str],
                 previous: str | None = None, action: str | None = None) -> str:
    """Turn a reference-plus-edits block into the full state (a full state is returned as is).

    Args:
        text: The ``<next_state>`` block.
        current: The current state (``@state``).
        demo_next_states: The retrieved demonstrations' next states, in the order shown
            (:func:`demo_pages`; placeholders in them are filled too).
        previous: The page ``go_back`` returns to (``@previous``); None when there is none.
        action: The action (its typed text fills the placeholders, :func:`typed_text`).

    Raises:
        StateReferenceError: The reference is malformed or names a demo that was not shown, or an
            edit line is neither ``+``, ``-`` nor a bare state line.
    """
    text = fill_typed(text, current, action)
    demo_next_states = [fill_typed(page, current, action) for page in demo_next_states]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not is_reference(text):
        return text.strip()
    head, edits = lines[0].strip(), lines[1:]
    if head == STATE_REF:
        base = current
    elif head == PREVIOUS_REF:
        if previous is None:
            raise StateReferenceError(f"{head!r}: there is no previous state at the first step")
        base = previous
    else:
        number = head[len(DEMO_REF):].strip()
        if not number.isdigit() or not 1 <= int(number) <= len(demo_next_states):
            raise StateReferenceError(
                f"{head!r} names no shown demonstration (there are {len(demo_next_states)})"
            )
        base = demo_next_states[int(number) - 1]
    out = [ln for ln in base.splitlines() if ln.strip()]
    cursor = len(out)
    for edit in edits:
        op, line = edit[:1], edit[2:] if edit[1:2] == " " else edit[1:]
        if op == "-":
            if line in out:
                cursor = out.index(line)
                out.pop(cursor)
            # deleting a line that is not there changes nothing: the intent is met
            continue
        if op != "+":
            if not _STATE_LINE.match(edit.strip()) and not edit.startswith(TARGET_REF):
                raise StateReferenceError(f"edit lines start with '+ ' or '- ', got {edit!r}")
            line = edit.strip()
        if line.startswith(TARGET_REF):
            line = _target_edit(line, current, action)
        same = _bid_index(out, line)
        if same is not None:  # the element is on the page: its line changes in place
            out[same] = line
            cursor = same + 1
        else:
            out.insert(cursor, line)
            cursor += 1
    return "\n".join(out)


def _target_edit(line: str, current: str, action: str | None) -> str:
    """The line ``@target <attributes>`` stands for: the action's target element (in
    ``current``) with the value and flags given."""
    bid = action_bid(action or "")
    found = target_line(current, action or "")
    if not found:
        raise StateReferenceError(f"{TARGET_REF}: the action {action!r} targets no element of "
                                  "the page")
    element = parse_line(found)
    given = parse_line(f"[{bid}] {element.role} {quote(element.name)} "
                       f"{line[len(TARGET_REF):].strip()}")
    if given.role != element.role or given.bid != bid:
        raise StateReferenceError(f"{TARGET_REF} takes value='…' and flags, got {line!r}")
    return Element(bid, element.role, element.name, given.value, element.options,
                   given.flags).line()


def _target_form(edit: str, current: str, action: str | None) -> str | None:
    """``edit`` (a ``+`` line) as ``+ @target …`` when it is the action's target with another
    value or other flags only; else None."""
    bid = action_bid(action or "")
    new = parse_line(edit[2:])
    if not bid or new.bid != bid:
        return None
    old_line = target_line(current, action or "")
    if not old_line:
        return None
    old = parse_line(old_line)
    if (old.role, old.name, old.options) != (new.role, new.name, new.options):
        return None
    attrs = " ".join([f"value={quote(new.value)}"] * bool(new.value) + list(new.flags))
    return f"+ {TARGET_REF}" + (f" {attrs}" if attrs else "")


def _bid_index(lines: list[str], line: str) -> int | None:
    """Where the element of ``line`` (by its ``[bid]``) stands in ``lines``; None without one."""
    match = _BID.match(line)
    if not match:
        return None
    prefix = f"[{match.group(1)}] "
    return next((i for i, ln in enumerate(lines) if ln.startswith(prefix)), None)


def diff_edits(base: str, target: str) -> list[str]:
    """The ``-``/``+`` edits that turn ``base`` into ``target`` under :func:`expand_state`."""
    a = [ln for ln in base.splitlines() if ln.strip()]
    b = [ln for ln in target.splitlines() if ln.strip()]
    edits: list[str] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    opcodes = matcher.get_opcodes()
    # Only the leading run of unchanged lines fixes the cursor for pure insertions: emit edits
    # so that each insertion follows a deletion or sits at the end, else write the full state.
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1 and all(
                _same_bid(x, y) for x, y in zip(a[i1:i2], b[j1:j2], strict=True)):
            # the same elements with new text (a field's value): each is one "+" line
            edits.extend(f"+ {ln}" for ln in b[j1:j2])
            continue
        if tag in ("replace", "delete"):
            edits.extend(f"- {ln}" for ln in a[i1:i2])
        if tag in ("replace", "insert"):
            if tag == "insert":
                # anchor the insertion: delete and re-add the line before it (or after it)
                if i1 > 0:
                    edits.append(f"- {a[i1 - 1]}")
                    edits.append(f"+ {a[i1 - 1]}")
                elif i1 < len(a):
                    edits.append(f"- {a[i1]}")
                    edits.extend(f"+ {ln}" for ln in b[j1:j2])
                    edits.append(f"+ {a[i1]}")
                    continue
            edits.extend(f"+ {ln}" for ln in b[j1:j2])
    return edits


def _same_bid(old: str, new: str) -> bool:
    match = _BID.match(old)
    return bool(match) and new.startswith(f"[{match.group(1)}] ")


def encode_state(target: str, current: str, demo_next_states: list[str],
                 previous: str | None = None, action: str | None = None) -> str:
    """The shortest faithful way to write ``target``: full, or ``@state`` / ``@previous`` /
    ``@demo N`` plus edits, with the typed text as placeholders (:func:`use_typed`).

    ``@state`` with one edit counts as short as a demonstration's page with none: the current
    page is always the one shown, while a demonstration's page may differ from this step's in
    lines the prompt does not show (its sign-in header, another field's value). So a field's new
    value is always ``@state`` plus its line, whatever the demonstrations: trained on ``@demo 1``
    wherever a demonstration matched, a model writes ``@demo 1`` for every fill, wrong ones too.

    Candidates whose expansion does not reproduce ``target`` exactly (duplicate lines can
    confuse the cursor) are discarded, so decoding an encoded state is always lossless.
    """
    full = "\n".join(ln for ln in target.splitlines() if ln.strip())
    best, best_len = full, len(full.splitlines())
    bases = [(STATE_REF, current)]
    if previous is not None:
        bases.append((PREVIOUS_REF, previous))
    # demo pages may hold placeholders (demo_pages): diff against them as expanded
    bases += [(f"{DEMO_REF} {i + 1}", fill_typed(s, current, action))
              for i, s in enumerate(demo_next_states)]
    for ref, base in bases:
        edits = diff_edits(base, target)
        cost = len(edits) + (0 if ref == STATE_REF else 1)
        if cost >= best_len:
            continue
        text = "\n".join([ref, *edits])
        if expand_state(text, current, demo_next_states, previous, action) == full:
            best, best_len = text, cost
    lines = best.splitlines()
    if lines[0] == STATE_REF and len(lines) == 2 and lines[1].startswith("+ "):
        # the action's own target with a new value: named, not copied
        pointed = _target_form(lines[1], current, action)
        if pointed is not None:
            text = f"{STATE_REF}\n{pointed}"
            if expand_state(text, current, demo_next_states, previous, action) == full:
                best = text
    short = use_typed(best, current, action)
    if short != best and expand_state(short, current, demo_next_states, previous,
                                      action) == full:
        return short
    return best
