"""The compact experience-model prompt, for small models trained from scratch.

The full prompt (``prompts/experience_model.md``) shows every state in full: thousands of tokens,
fine for a hosted model, too long for a few-million-parameter model trained on two CPU cores. The
compact prompt shows the same inputs through what matters for the prediction: the current URL and
title, the action with the element it targets and the text right below it, the lines where the
current page differs from each retrieved demonstration's page, each demonstration's action and
outcome, and, for a final answer, the lines of the page that contain it. The model answers with
the usual fields, the outcome before the page; its next state is usually a reference
(``@demo N`` / ``@state`` plus edits, see :mod:`dreamgym_agents.state_delta`).
"""

from __future__ import annotations

import difflib
import functools
import re
from importlib import resources

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Transition

COMPACT_PROMPT_FILE = "experience_model_compact.md"
_BLOCK = re.compile(r"^<!--\s*([a-z_]+)\s*-->\s*$", re.M)
_BID_ARG = re.compile(r"""^\s*(?:[a-z_]+\(\s*['"]([^'"]+)['"]|[a-z_]+ \[(\d+)\])""")
_TEXT_ARG = re.compile(r"""send_msg_to_user\(\s*(['"])(.*)\1\s*\)|stop \[(.*)\]\s*$""", re.S)


@functools.cache
def load_compact_template() -> dict[str, str]:
    """The blocks of ``prompts/experience_model_compact.md`` by name."""
    path = resources.files("dreamgym_agents.prompts") / COMPACT_PROMPT_FILE
    parts = _BLOCK.split(path.read_text(encoding="utf-8"))
    blocks = {n: b.strip("\n") for n, b in zip(parts[1::2], parts[2::2], strict=True)}
    missing = {"instruction", "output_reasoning", "output_direct"} - set(blocks)
    if missing:
        raise ConfigError(f"{COMPACT_PROMPT_FILE} lacks the blocks {sorted(missing)}")
    return blocks


def _lines(state: str) -> list[str]:
    return [ln.strip() for ln in state.splitlines() if ln.strip()]


def head(state: str) -> str:
    """``URL | Title`` of a state."""
    found = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in _lines(state)[:3]
             if ln.startswith(("URL:", "Title:"))}
    return f"{found.get('URL', '?')} | {found.get('Title', '')}"


def target_line(state: str, action: str) -> str:
    """The state line of the element an action targets (``[12] link 'Laptops'``), or ''."""
    match = _BID_ARG.match(action)
    bid = (match.group(1) or match.group(2)) if match else None
    if not bid:
        return ""
    prefix = f"[{bid}] "
    return next((ln for ln in _lines(state) if ln.startswith(prefix)), "")


def target_context(state: str, action: str) -> str:
    """The text line right after the element an action targets, or '' when there is none.

    In a listing this is what the site says of the item under its link (``StaticText '$175.99 ·
    Rating: 2.3 out of 5 (12 reviews)'``): what the page the link opens will repeat.
    """
    target = target_line(state, action)
    if not target:
        return ""
    lines = _lines(state)
    at = lines.index(target)
    following = lines[at + 1] if at + 1 < len(lines) else ""
    return "" if not following or following.startswith("[") else following


def answer_text(action: str) -> str | None:
    """The answer of a final action (``send_msg_to_user('…')`` / ``stop […]``), else None."""
    match = _TEXT_ARG.search(action.strip())
    if not match:
        return None
    return match.group(2) if match.group(2) is not None else match.group(3)


_MONEY = re.compile(r"^\$\s?\d[\d,]*(?:\.\d+)?$")
_INTEGER = re.compile(r"^\d[\d,]*$")
_DECIMAL = re.compile(r"^\d+\.\d+$")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DATE = re.compile(rf"\b(?:{'|'.join(_MONTHS)})[a-z]*\.?\s+\d{{1,2}},?\s+\d{{4}}\b|"
                   r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b", re.IGNORECASE)
# What a question asks for, by its wording (first match wins).
_ASKS = (
    (re.compile(r"\bhow many\b|answer with a number", re.I), "a number"),
    (re.compile(r"\b(?:price|cost|how much|total|spend|spent|amount)\b", re.I),
     "an amount of money"),
    (re.compile(r"\brating\b", re.I), "a rating"),
    (re.compile(r"\b(?:date|when)\b", re.I), "a date"),
    (re.compile(r"\bwho\b", re.I), "a name"),
    (re.compile(r"\bstatus\b", re.I), "a status"),
)


def answer_kind(answer: str) -> str:
    """What an answer looks like: ``an amount of money``, ``a number``, ``a date``, ``text (2
    words)``, ``an empty answer``."""
    text = answer.strip().strip("'\"").strip()
    if not text:
        return "an empty answer"
    if _MONEY.match(text):
        return "an amount of money"
    if _INTEGER.match(text):
        return "a number"
    if _DECIMAL.match(text):
        return "a decimal number"
    if _DATE.search(text):
        return "a date"
    words = len(text.split())
    return f"text ({words} word{'s' if words != 1 else ''})"


def asked_kind(intent: str) -> str:
    """What a task asks the agent to say, by its wording; ``an action`` for a task that asks to
    do something rather than to answer."""
    question = "?" in intent or re.search(r"\btell me\b", intent, re.I)
    if not question:
        return "an action (then any short reply)"
    for pattern, kind in _ASKS:
        if pattern.search(intent):
            return kind
    return "a value"


_SAME_KIND = {
    "a number": ("a number",),
    "an amount of money": ("an amount of money",),
    "a rating": ("a decimal number", "a number"),
    "a date": ("a date",),
}


def kinds_match(answer: str, intent: str) -> bool | None:
    """Whether an answer looks like what the task asks for; None for a task that asks for an
    action (its final message is not judged by its form)."""
    asked = asked_kind(intent)
    if asked.startswith("an action"):
        return None
    kind = answer_kind(answer)
    if asked in _SAME_KIND:
        return kind in _SAME_KIND[asked]
    return kind.startswith("text")  # a name, a status, a value: words


def answer_lines(state: str, answer: str, limit: int = 3) -> tuple[list[str], int]:
    """Body lines of ``state`` that contain ``answer`` as whole words; ``(first few, count)``.

    Whole-word matching keeps a short answer (``9``, ``it``) from hitting every line that merely
    contains its characters; lines that equal the answer's value come first.
    """
    answer = answer.strip().strip("'\"").strip()
    if not answer:
        return [], 0
    pattern = re.compile(rf"(?<!\w){re.escape(answer)}(?!\w)", re.IGNORECASE)
    hits = [ln for ln in _lines(state)[2:] if pattern.search(ln)]
    exact = [ln for ln in hits if ln.lower().endswith(f"'{answer.lower()}'")]
    ordered = exact + [ln for ln in hits if ln not in exact]
    return ordered[:limit], len(hits)


def answer_checks(state: str, answer: str, intent: str) -> str:
    """What can be checked of a final answer without knowing the right one: its kind against the
    kind the task asks for, and whether the page shows it (``an amount of money, as the task asks
    for an amount of money; the page shows it``).

    A small model trained from scratch does not compose these from the task and the page
    reliably (measured: recipes v8, v9 in docs/RESULTS.md), so the compact prompt spells them
    out; whether the answer is right is still the model's call (the page may show several values
    of that kind, the task may want another one).
    """
    _, count = answer_lines(state, answer, limit=1)
    where = "the page shows it" if count else "the page does not show it"
    match = kinds_match(answer, intent)
    if match is None:
        return f"{answer_kind(answer)}, and the task asks for an action; {where}"
    return (f"{answer_kind(answer)}, {'as' if match else 'but'} the task asks for "
            f"{asked_kind(intent)}; {where}")


_INTENT_WORD = re.compile(r"[a-z]+")


def _intent_words(text: str) -> set[str]:
    return set(_INTENT_WORD.findall(text.lower()))


def rerank_final_answer_demos(
    intent: str, action: str, demos: list[Transition], k: int
) -> list[Transition]:
    """For a final answer, prefer demonstrations whose task asks the same kind of question.

    Whether an answer is right depends on what the task asks; (state, action) similarity alone
    pulls in answers to other questions about the same page. Candidates are re-ordered by the
    word overlap (Jaccard) of their task with this one, then by similarity. Other actions keep
    the similarity order.
    """
    if answer_text(action) is None:
        return demos[:k]
    mine = _intent_words(intent)

    def score(t: Transition) -> tuple[float, float]:
        theirs = _intent_words(str(t.info.get("intent", "")))
        overlap = len(mine & theirs) / len(mine | theirs) if mine or theirs else 0.0
        return overlap, float(t.info.get("similarity", 0.0))

    return sorted(demos, key=score, reverse=True)[:k]


def changed_lines(state: str, other: str) -> list[str]:
    """Body lines of ``state`` missing from ``other`` (``+``) and of ``other`` missing here (``-``).

    The URL and Title lines are left out (the prompt shows them separately).
    """
    a, b = _lines(other)[2:], _lines(state)[2:]
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        out.extend(f"- {ln}" for ln in a[i1:i2])
        out.extend(f"+ {ln}" for ln in b[j1:j2])
    return out


def describe_action(state: str, action: str) -> str:
    target = target_line(state, action)
    return f"{action.strip()} on {target}" if target else action.strip()


def render_compact(
    intent: str,
    history: list[Transition] | None,
    state: str,
    action: str,
    demos: list[Transition] | None,
    *,
    history_steps: int = 2,
    max_changed: int = 4,
    use_reasoning: bool = True,
) -> list[dict[str, str]]:
    """The compact prompt as chat messages (one user message).

    Args:
        intent: The task.
        history: Previous transitions of the episode (None: history ablated).
        state: Current state.
        action: The agent's action.
        demos: Retrieved transitions, best first (None: retrieval ablated).
        history_steps: How many previous steps to show.
        max_changed: Most changed lines shown for the best demonstration (the others show
            only how many lines differ).
        use_reasoning: Ask for reasoning (False: empty reasoning).
    """
    template = load_compact_template()
    parts = [template["instruction"], f"task: {intent}"]
    if history is not None:
        steps = [f"{describe_action(t.state, t.action)} -> {head(t.next_state).split(' | ')[0]}"
                 for t in history[-history_steps:]] or ["(first step)"]
        parts.append("history: " + " || ".join(steps))
    parts.append(f"page: {head(state)}")
    context = target_context(state, action)
    parts.append(f"action: {describe_action(state, action)}"
                 + (f" | below it: {context}" if context else ""))
    if demos is not None:
        if not demos:
            parts.append("demos: (none)")
        for i, demo in enumerate(demos, 1):
            changes = changed_lines(state, demo.state)
            # Only the best demonstration's differences are spelled out (prompt length).
            limit = max_changed if i == 1 else 0
            shown = changes[:limit] + (["…"] if len(changes) > limit else [])
            said = answer_text(demo.action)
            if said is not None:  # a final answer: its task and where its page shows it
                found, _ = answer_lines(demo.state, said, limit=1)
                what = (f"task: {demo.info.get('intent', '?')} | "
                        f"answer on page: {found[0] if found else '(not found)'} | ")
            else:
                what = ""
            parts.append(
                f"demo {i}: {head(demo.state).split(' | ')[0]} | "
                f"{describe_action(demo.state, demo.action)} -> "
                f"{head(demo.next_state).split(' | ')[0]} | {what}reward {demo.reward:g} "
                f"done {int(demo.terminated)} success {int(demo.success)} | page differs by "
                f"{len(changes)} lines" + "".join(f"\n  {c}" for c in shown)
            )
    answer = answer_text(action)
    if answer is not None:
        # Last, next to where the answer starts: a small model judges from what is near.
        hits, count = answer_lines(state, answer)
        parts.append(f"answer on page ({count} lines): " + (" || ".join(hits) or "(not found)"))
        parts.append(f"answer checks: {answer_checks(state, answer, intent)}")
    parts.append(template["output_reasoning" if use_reasoning else "output_direct"])
    return [{"role": "user", "content": "\n".join(parts)}]
