"""The compact experience-model prompt, for small models trained from scratch.

The full prompt (``prompts/experience_model.md``) shows every state in full: thousands of tokens,
fine for a hosted model, too long for a few-million-parameter model trained on two CPU cores. The
compact prompt shows the same inputs through what matters for the prediction: the current URL and
title, the action with the element it targets and the text right below it, the lines where the
current page differs from each retrieved demonstration's page, each demonstration's action and
outcome, and, for a final answer, the lines of the page that contain it. The model answers with
the usual fields, the outcome before the page; its next state is usually a reference
(``@demo N`` / ``@state`` plus edits, see :mod:`dreamgym_agents.adapters.webarena.state_delta`).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable

from dreamgym_agents.adapters.webarena.state import parse_line, parse_state, quote, target_line
from dreamgym_agents.adapters.webarena.state_delta import demo_pages, typed_text, use_typed
from dreamgym_agents.prompts import prompt_blocks
from dreamgym_agents.types import Transition

COMPACT_PROMPT_FILE = "experience_model_compact.md"
_TEXT_ARG = re.compile(r"""send_msg_to_user\(\s*(['"])(.*)\1\s*\)|stop \[(.*)\]\s*$""", re.S)


def load_compact_template() -> dict[str, str]:
    """The blocks of ``prompts/experience_model_compact.md`` by name."""
    return prompt_blocks(COMPACT_PROMPT_FILE, ("instruction", "output_reasoning",
                                               "output_direct"))


def _lines(state: str) -> list[str]:
    return [ln.strip() for ln in state.splitlines() if ln.strip()]


def head(state: str) -> str:
    """``URL | Title`` of a state."""
    found = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in _lines(state)[:3]
             if ln.startswith(("URL:", "Title:"))}
    return f"{found.get('URL', '?')} | {found.get('Title', '')}"


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
    """What an answer looks like: ``an amount of money``, ``a number``, ``a decimal number``,
    ``a date``, ``text``, ``an empty answer``.

    Text is not counted in words: recorded wrong answers are mostly one word picked off a page,
    and a small model shown a word count learns to call every one-word answer wrong, right ones
    too, such as 'Complete' for an order's status."""
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
    return "text"


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


_FIELD = re.compile(r"^\s*([A-Za-z][\w &/-]{0,40}?)\s*(?::|\|)\s*(.+?)\s*$")
_TASK_WORD = re.compile(r"[a-z]{3,}")


def answer_place(state: str, answer: str, intent: str) -> str:
    """How the page shows an answer, in the terms a reader checks it by.

    ``the page shows it as the value of 'Status', which the task names`` (a ``Label: value`` or
    ``Label | value`` line whose label shares a word with the task), ``… of 'Brand', which the
    task does not name``, ``… as a whole line`` (a line that is just the answer: a link, a
    price), ``… inside a longer text``, or ``the page does not show it``. Best place first:
    an answer a page labels with what the task asks about is likelier right than a word picked
    out of a sentence, and a small model does not work that out from the raw lines.
    """
    text = answer.strip().strip("'\"").strip().lower()
    if not text:
        return "the page does not show it"
    pattern = re.compile(rf"(?<!\w){re.escape(text)}(?!\w)")
    task = set(_TASK_WORD.findall(intent.lower()))
    best = (9, "the page does not show it")
    for line in _state_lines(state):
        name = line.lower()
        if not pattern.search(name):
            continue
        field = _FIELD.match(line)
        if name == text:
            place = (1, "the page shows it as a whole line")
        elif field and pattern.search(field.group(2).lower()):
            label = field.group(1).strip()
            named = bool(task & set(_TASK_WORD.findall(label.lower())))
            exact = field.group(2).strip().lower() == text
            where = "as the value" if exact else "in the value"
            place = ((0 if named else 2) + (0 if exact else 0.5),
                     f"the page shows it {where} of '{label}', which the task "
                     f"{'names' if named else 'does not name'}")
        else:
            place = (3, "the page shows it inside a longer text")
        best = min(best, place)
    return best[1]


def _state_lines(state: str) -> list[str]:
    """The quoted names of a state's body lines (URL and Title left out)."""
    return [ln.name for ln in parse_state(state).lines if ln.name]


def task_params(task: object) -> dict[str, str]:
    """A task's parameters (:attr:`~dreamgym_agents.types.Task.params`); empty for a bare
    intent."""
    params = getattr(task, "params", None)
    return dict(params) if isinstance(params, dict) else {}


def _find_terms(state: str, params: dict[str, str]
                ) -> tuple[dict[str, tuple[list[str], list[int]]], list[str], str]:
    """Each parameter's places (``URL``/``title`` and the indices of the body lines holding
    it), the body lines and the lower-cased title."""
    from urllib.parse import unquote_plus

    lines = _lines(state)
    url = unquote_plus(next((ln[4:] for ln in lines[:2] if ln.startswith("URL:")), "")).lower()
    title = next((ln[6:] for ln in lines[:2] if ln.startswith("Title:")), "").strip().lower()
    body = _state_lines(state)
    found = {}
    for name, value in params.items():
        # Whole terms only: "2" is not found in "3.2", "$2" or "2-in-1".
        pattern = re.compile(rf"(?<![\w.$-]){re.escape(value.lower())}(?![\w-]|[.,]\d)")
        where = [label for label, text in (("URL", url), ("title", title))
                 if pattern.search(text)]
        found[name] = (where, [i for i, ln in enumerate(body) if pattern.search(ln.lower())])
    return found, body, title


def terms_named(state: str, params: dict[str, str]) -> str:
    """How many of the task's parameters the page shows anywhere (URL, title or text):
    ``the page names all 2 task terms`` / ``… 1 of 2 …`` / ``… none of the 2 …``; '' without
    parameters. Coarser than :func:`task_terms` on purpose: it reads the same across task
    templates, so answers of different tasks compare by it (:class:`Demos` tally)."""
    if not params:
        return ""
    return _named(_find_terms(state, params)[0])


def _named(found: dict[str, tuple[list[str], list[int]]]) -> str:
    """:func:`terms_named`'s phrase for :func:`_find_terms`' places."""
    shown, total = sum(bool(w or at) for w, at in found.values()), len(found)
    term = "term" if total == 1 else "terms"
    if shown == total:
        return f"the page names {'the' if total == 1 else f'all {total}'} task {term}"
    if not shown:
        return f"the page names {'no' if total == 1 else f'none of the {total}'} task {term}"
    return f"the page names {shown} of the {total} task terms"


def action_terms(state: str, params: dict[str, str]) -> str:
    """:func:`terms_named`, and whether the page's title or URL names any of the terms (``the
    page names all 2 task terms, the title or URL too``): after an action task's last step the
    page it lands on is named after what was done (the product opened, the category sorted, the
    query searched), and a coarse phrase read the same across templates is what a small model
    learns from a few hundred answers."""
    if not params:
        return ""
    found, _, _ = _find_terms(state, params)
    return _named(found) + (", the title or URL too" if any(w for w, _ in found.values()) else "")


def step_kind(state: str, action: str) -> str:
    """An action by its kind, for an action task's answer checks: ``click on a button 'Add to
    Cart'`` (a button is named: which one was pressed is what decides), ``click on a link``,
    ``fill on a textbox``, ``go_back``. The target's own text (a product's long name) is left
    out: it reads differently for every task and buried the kind."""
    verb = action_verb(action) or "act"
    line = target_line(state, action)
    if not line:
        return verb
    target = parse_line(line)
    if target.role == "button":
        return f"{verb} on a button {quote(target.name)}"
    return f"{verb} on a {target.role}"


def action_verb(action: str) -> str:
    """An action's verb: ``click`` of ``click('12')`` or ``click [12]``; '' for none."""
    return action.strip().split("(", 1)[0].split(" ", 1)[0].strip()


def task_terms(state: str, params: dict[str, str], *, max_lines: int = 2,
               width: int = 90) -> str:
    """Where the page shows the task's parameters: ``product (title, 2 lines), qty (none) |
    'You added 2 × …'`` — each parameter's places (URL, title, body lines), then the body lines
    holding the most parameters.

    Whether a navigation or a state change is done shows in what the page says of the task's
    own terms (the product in the title, the page number in the URL, a confirmation naming the
    product); this gathers that evidence for the model to weigh. '' without parameters.
    """
    if not params:
        return ""
    found, body, title = _find_terms(state, params)
    places, hits = [], {}
    for name, (where, at) in found.items():
        for i in at:
            hits[i] = hits.get(i, 0) + 1
        if at:
            where = [*where, f"{len(at)} line{'s' if len(at) != 1 else ''}"]
        places.append(f"{name} ({', '.join(where) or 'none'})")
    # The lines holding the most parameters (shortest first: a line that is mostly the term),
    # not counting the page's heading (its title again).
    heading = title.rsplit(" | ", 1)[0]
    best = sorted((i for i in hits if body[i].lower() != heading),
                  key=lambda i: (-hits[i], len(body[i]), i))[:max_lines]
    shown = [body[i] if len(body[i]) <= width else body[i][: width - 1] + "…"
             for i in sorted(best)]
    return ", ".join(places) + "".join(f" | '{ln}'" for ln in shown)


def answer_checks(state: str, answer: str, intent: str, params: dict[str, str] | None = None,
                  last_step: str | None = None) -> str:
    """What can be checked of a final answer without knowing the right one, the decisive part
    last: how the page shows it (:func:`answer_place`), then its kind against the kind the task
    asks for (``the page shows it as a whole line; an amount of money, as the task asks for an
    amount of money``), then whether the page names the task's parameters
    (:func:`terms_named`: a rating read off another product's page looks like a right one but
    for this). For a task that asks for an action, the message itself is not judged. The checks
    then say how many of the task's parameters the page names and whether its title or URL does
    (:func:`action_terms`), and, when ``last_step`` is given, the kind of step before the answer
    (:func:`step_kind`, ``last step: click on a button 'Add to Cart'``), since whether the
    change was made shows in what the agent did last.

    A small model trained from scratch does not compose these from the task and the page reliably
    (evidence: docs/history/results-2026-11-to-12.md), so the compact prompt spells them out as its
    last line, right before the verdict. Whether the answer is right is still the model's call: the
    page may show several values of that kind, the task may want another one.
    """
    match = kinds_match(answer, intent)
    if match is None:
        # What the message says does not decide an action task (its evaluator reads the site),
        # so its place and kind are left out: a small model judges by them, and recorded data
        # holds many one-word messages of failing agents, so it would call every right "done"
        # wrong.
        return ("the task asks for an action"
                + (f"; {named}" if (named := action_terms(state, params or {})) else "")
                + (f"; last step: {last_step}" if last_step is not None else ""))
    where = answer_place(state, answer, intent)
    named = terms_named(state, params or {})
    return (f"{where}; {answer_kind(answer)}, {'as' if match else 'but'} the task asks for "
            f"{asked_kind(intent)}" + (f"; {named}" if named else ""))


_INTENT_WORD = re.compile(r"[a-z]+")


def _intent_words(text: str) -> set[str]:
    return set(_INTENT_WORD.findall(text.lower()))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


_CHECK_VALUE = re.compile(r"'[^']*'|\(\d+ words?\)|\d+ lines?")


def checks_words(checks: str) -> set[str]:
    """The words of an answer's checks that say what kind of evidence it is (the quoted labels,
    word and line counts left out, so two checks compare by form)."""
    return set(_INTENT_WORD.findall(_CHECK_VALUE.sub(" ", checks.lower())))


def demo_checks(demo: Transition) -> str:
    """The answer checks of a recorded final answer, computed with its own task (as retrieved:
    ``info["intent"]``, ``info["task_params"]``)."""
    params = demo.info.get("task_params") or {}
    return _cached_checks(demo.state, answer_text(demo.action) or "",
                          str(demo.info.get("intent", "")), tuple(sorted(params.items())))


@functools.lru_cache(maxsize=4096)
def _cached_checks(state: str, answer: str, intent: str,
                   params: tuple[tuple[str, str], ...]) -> str:
    # a recorded answer is ranked against every final answer of the examples: compute once
    return answer_checks(state, answer, intent, dict(params))


class Demos(list):
    """Retrieved demonstrations (a list, best first) and, for a final answer, ``tally``: how
    many of the retrieved recorded answers whose answer checks read the same as this answer's
    were right and how many wrong (None for other steps).

    The checks are evidence of a kind, not a verdict (a page may show several values of the
    kind asked); the tally says how often that kind of evidence went with a right answer in
    real recorded episodes, which a small model does not otherwise gather from three demos."""

    def __init__(self, items: Iterable[Transition] = (), *,
                 tally: tuple[int, int] | None = None) -> None:
        super().__init__(items)
        self.tally = tally


def tally_line(tally: tuple[int, int]) -> str:
    """The prompt line for a :class:`Demos` tally: the counts, then which side has more in
    words (``5 right, 1 wrong: mostly right``). A small model trained for minutes does not learn
    to compare two counts, but it may follow one word."""
    right, wrong = tally
    if not right + wrong:
        return "recorded answers with the same checks: none"
    side = ("mostly right" if right > wrong else "mostly wrong" if wrong > right
            else "as many right as wrong")
    return f"recorded answers with the same checks: {right} right, {wrong} wrong: {side}"


def rank_final_answer_demos(
    intent: str, state: str, action: str, params: dict[str, str], candidates: list[Transition],
    k: int,
) -> Demos:
    """Order recorded final answers as demonstrations for the final answer ``action``.

    Each candidate is scored by how much its answer checks (:func:`answer_checks`) resemble
    this answer's: how the page shows the answer, its kind against the kind asked, where the
    page shows the task's terms. Ties go by how much its task resembles this one (word
    overlap), then by page similarity. The best comes first, then the best of the other outcome
    (right if the best is wrong, and the reverse), then the next best: the model sees the
    closest recorded case and what the other outcome looks like. The result's ``tally`` counts
    the outcomes of all candidates whose checks read the same as this answer's (:class:`Demos`).
    """
    mine = checks_words(answer_checks(state, answer_text(action) or "", intent, params))
    words = _intent_words(intent)

    alike = {id(t): _jaccard(mine, checks_words(demo_checks(t))) for t in candidates}

    def score(t: Transition) -> tuple[float, float, float]:
        return (alike[id(t)],
                _jaccard(words, _intent_words(str(t.info.get("intent", "")))),
                float(t.info.get("similarity", 0.0)))

    ranked = sorted(candidates, key=score, reverse=True)
    if not ranked:
        return Demos()
    other = next((t for t in ranked if t.success != ranked[0].success), None)
    order = [ranked[0]] + ([other] if other is not None else [])
    order += [t for t in ranked[1:] if t is not other]
    # What every candidate with the same evidence came to (not just the k shown).
    same = [t for t in ranked if alike[id(t)] >= 1.0]
    right = sum(bool(t.success) for t in same)
    return Demos(order[:k], tally=(right, len(same) - right))


def action_signature(state: str, action: str) -> tuple[str, str | None, str | None]:
    """An action by its verb and its target's role and name (``('click', 'link', 'Laptops')``):
    the same action on another page reads the same whatever the target's bid there."""
    line = target_line(state, action)
    target = parse_line(line) if line else None
    return (action_verb(action), target.role if target else None,
            target.name if target else None)


def page_likeness(state: str, other: str) -> float:
    """The share of lines two states have in common, in order (bids included): 1.0 for the same
    page, lower for another page of the same kind, lower still when the header differs (signed
    in or out) and every id after it shifts."""
    return difflib.SequenceMatcher(a=_lines(state), b=_lines(other), autojunk=False).ratio()


SAME_PAGE = 0.999
"""Page likeness from which two states count as the same page (:func:`rank_step_demos`; their
typed text written as the placeholder)."""


def rank_step_demos(state: str, action: str, candidates: list[Transition], k: int
                    ) -> list[Transition]:
    """Re-rank retrieved transitions for a step that is not a final answer; the best ``k``.

    First the same action on the same target (:func:`action_signature`). Among those, a
    demonstration made on this very page (the typed text aside) comes first, then the one whose
    *next* page is most like this page (:func:`page_likeness`): the same link followed from
    another page leads to the page this step leads to, and the one whose result shares this
    page's context (signed in or out, and so every id after the header) is the one to copy. Then
    the same kind of action (its verb), then the page most like this one, then the embedding's
    order.

    The hash embedding blends page and action features: it finds the right neighbourhood, but among
    near-identical pages it cannot tell the one whose layout (and ids) is this page's, and a small
    model copies the first demonstration's next page; this order puts the right next page first
    more often than the embedding's (evidence: docs/history/results-2026-11-to-12.md). "This very
    page" means a likeness of at least :data:`SAME_PAGE` with the typed text written as a
    placeholder: a page with another query typed is this page, and no looser likeness lets in a
    search sent from an empty box. The verb comes before the page: ranked by the page alone, a click
    on the cart link finds final answers given on the same page, and the model calls the click the
    end of a successful episode.
    """
    mine = action_signature(state, action)
    order = {id(t): i for i, t in enumerate(candidates)}
    # typed text as the placeholder: a page with another query typed is this page
    plain = use_typed(state, state)

    def score(t: Transition) -> tuple[bool, bool, bool, float, int]:
        theirs = action_signature(t.state, t.action)
        here = page_likeness(plain, use_typed(t.state, t.state))
        if theirs == mine and mine[1] is not None:
            return (True, True, here >= SAME_PAGE, page_likeness(state, t.next_state),
                    -order[id(t)])
        return (theirs == mine, theirs[0] == mine[0], False, here, -order[id(t)])

    return sorted(candidates, key=score, reverse=True)[:k]


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


def back_page(history: list[Transition]) -> str | None:
    """The page ``go_back()`` returns to after ``history``, as recorded: the state before the
    last navigation (a recorded ``go_back`` pops one; a step that stays on its URL is not a
    navigation), or None when the episode has not left its start page (the browser goes back
    to a blank page). It is what ``@previous`` stands for
    (:mod:`dreamgym_agents.adapters.webarena.state_delta`)."""
    pages: list[str] = []
    for t in history:
        if head(t.state).split(" | ")[0] == head(t.next_state).split(" | ")[0]:
            continue
        if t.action.strip().startswith("go_back"):
            if pages:
                pages.pop()
        else:
            pages.append(t.state)
    return pages[-1] if pages else None


def back_target(history: list[Transition]) -> str | None:
    """Where ``go_back()`` leads after ``history``: the ``URL | Title`` of :func:`back_page`."""
    page = back_page(history)
    return None if page is None else head(page)


_SUBMIT = re.compile(r"^\s*(?:keyboard_press\(|press\s*\[)", re.I)


def action_notes(state: str, action: str, history: list[Transition] | None) -> str:
    """What the page implies of an action beyond its target: where ``go_back`` returns (with
    the history shown), and the text typed in the page's field for a key press or a button
    click (what a search or a form sends:
    :data:`~dreamgym_agents.adapters.webarena.state_delta.TYPED`)."""
    act = action.strip()
    if act.startswith("go_back") and history is not None:
        back = back_target(history)
        # @previous is that page (back_page): the note names it for the model to copy
        return (f"back to: {back.split(' | ')[0]} (@previous)" if back
                else "back to: a blank page (no earlier page)")
    target = target_line(state, action)
    if _SUBMIT.match(act) or re.match(r"^\[[^\]]+\]\s+button\b", target):
        typed = typed_text(state)
        if typed is not None:
            return f"typed: '{typed[0]}'"
    return ""


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
    params: dict[str, str] | None = None,
    tally: tuple[int, int] | None = None,
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
        params: The task's parameters (:func:`task_params`); for a final answer, where the page
            shows them (:func:`task_terms`).
        tally: For a final answer, the outcomes of the retrieved recorded answers whose checks
            read the same (:class:`Demos`); by default the ``demos``' own tally. Shown with the
            checks, also when the demonstrations themselves are not (judge copies).
    """
    template = load_compact_template()
    parts = [template["instruction"], f"task: {intent}"]
    if history is not None:
        steps = [f"{describe_action(t.state, t.action)} -> {head(t.next_state).split(' | ')[0]}"
                 for t in history[-history_steps:]] or ["(first step)"]
        parts.append("history: " + " || ".join(steps))
    parts.append(f"page: {head(state)}")
    context = target_context(state, action)
    notes = action_notes(state, action, history)
    parts.append(f"action: {describe_action(state, action)}"
                 + (f" | below it: {context}" if context else "")
                 + (f" | {notes}" if notes else ""))
    if demos is not None:
        if not demos:
            parts.append("demos: (none)")
        # where each demo went, its typed text written as this step's (state_delta)
        pages = demo_pages(demos, state, action)
        for i, demo in enumerate(demos, 1):
            changes = changed_lines(state, demo.state)
            # Only the best demonstration's differences are spelled out (prompt length).
            limit = max_changed if i == 1 else 0
            shown = changes[:limit] + (["…"] if len(changes) > limit else [])
            said = answer_text(demo.action)
            if said is not None:  # a final answer: its task and its checks
                what = (f"task: {demo.info.get('intent', '?')} | "
                        f"checks: {demo_checks(demo)} | ")
            else:
                what = ""
            parts.append(
                f"demo {i}: {head(demo.state).split(' | ')[0]} | "
                f"{describe_action(demo.state, demo.action)} -> "
                f"{head(pages[i - 1]).split(' | ')[0]} | {what}reward {demo.reward:g} "
                f"done {int(demo.terminated)} success {int(demo.success)} | page differs by "
                f"{len(changes)} lines" + "".join(f"\n  {c}" for c in shown)
            )
    answer = answer_text(action)
    if answer is not None:
        hits, count = answer_lines(state, answer)
        parts.append(f"answer on page ({count} lines): " + (" || ".join(hits) or "(not found)"))
        terms = task_terms(state, params or {})
        if terms:
            parts.append(f"task terms on page: {terms}")
    parts.append(template["output_reasoning" if use_reasoning else "output_direct"])
    if answer is not None:
        # Last, right before the verdict the answer starts with: a small model judges from
        # what is near (annotate.deterministic_rationale).
        last = None
        if history is not None:
            last = step_kind(history[-1].state, history[-1].action) if history else "none"
        parts.append(f"answer checks: {answer_checks(state, answer, intent, params, last)}")
        if tally is None:
            tally = getattr(demos, "tally", None)
        if tally is not None:  # the very last line: what answers with these checks came to
            parts.append(tally_line(tally))
    return [{"role": "user", "content": "\n".join(parts)}]
