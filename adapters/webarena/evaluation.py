"""WebArena's task evaluators: string, URL and page-content checks.

Semantics follow WebArena's ``evaluation_harness/evaluators.py``:

- ``string_match`` compares the agent's final answer with ``eval.reference_answers``:
  ``exact_match`` (after :func:`clean_answer`), ``must_include`` or ``fuzzy_match``.
  ``must_include`` wants each item contained as written; ``" |OR| "`` is no separator here. A
  list holding a single one-character item is checked as a token of NLTK's
  ``word_tokenize``, so that ``"2"`` matches neither ``"12"`` nor ``"3/2"``. ``fuzzy_match``
  asks an LLM judge per reference. The reference ``"N/A"`` means the task is unachievable: an
  answer of ``N/A`` passes, otherwise the unachievable-task judge compares the answer with
  ``eval.string_note``. With no judge configured such an answer scores 0 and the check says it
  was not judged.
- ``url_match`` ("GOLD in PRED"): some reference's host + path is a substring of the page's,
  and every reference query parameter has one of its reference values in the page's query;
  ``" |OR| "`` separates alternative references (the query parameters of all alternatives are
  pooled: each key must match one of its values). A trailing ``/`` is dropped from the whole
  URL only, so a reference path ending ``/`` before its query (``…/issues/?sort=…``: 22 of
  ``test.raw.json``'s references) needs that ``/`` in the page's path.
- ``program_html``: for each target, open its URL in a new page of the same browser context
  (``"last"``: the page the episode ended on), wait 3 s, select content with its locator (the
  empty locator: the page's HTML) and check ``required_contents``: ``exact_match``,
  ``must_include`` with ``" |OR| "`` alternatives, ``must_exclude``, or ``fuzzy_match``, which
  WebArena-Lite writes for some. There the LLM judge compares the selection with the references
  joined by ``, ``, as VisualAgentBench, WebArena-Lite's home, does. The agent's page is never
  navigated, so ``url_match`` and ``__last_url__`` read the URL where the episode ended
  whatever the order of the evaluators.

The reference is WebArena's ``evaluation_harness/evaluators.py`` as its current release has it:
``libwebarena`` 0.0.5 on PyPI, the package BrowserGym's WebArena tasks run. The score of
a task is the product of its evaluators' scores. WebArena-Lite's task 81 writes
``must_include`` as a string: read as a one-item list (WebArena's code asserts a list).

Deliberate differences, none of which changes a verdict: no ``eval()`` of config strings
(``func:`` helpers are parsed and looked up by name); an empty answer is not sent to the
``fuzzy_match`` judge (it scores 1 only against an empty reference, as WebArena's later code
does); a judge reply without a verdict scores 0 (WebArena's ``assert`` stops the run).
Deviations that can change a verdict are opt-in, by name (:data:`DEVIATIONS`; ``--set
env.eval_deviations=[…]``): the bundled shop's tasks take ``load_wait`` (its pages are complete
at their load event).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import html
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dreamgym_agents.adapters.webarena.judge import (  # noqa: F401 - re-exported: the judge is part of the evaluator API
    LLMJudge,
    fuzzy_match_messages,
    make_llm_judge,
    parse_fuzzy_verdict,
    parse_unachievable_verdict,
    unachievable_messages,
)
from dreamgym_agents.adapters.webarena.page_helper import Helper, call_helper
from dreamgym_agents.errors import ConfigError, EnvError, MissingExtraError, TaskError

logger = logging.getLogger(__name__)

Judge = Callable[[str, str, str], float]
"""An LLM judge: ``(intent, reference, prediction) -> score in [0, 1]``.

Called for each ``fuzzy_match`` reference. For unachievable tasks (reference ``"N/A"``) the judge's
``unachievable(intent, reason, prediction)`` method is called if it has one (the judge built by
:func:`make_llm_judge` has), otherwise the judge itself with the reason as reference.
"""

EVAL_TYPES: tuple[str, ...] = ("string_match", "url_match", "program_html")
"""Evaluator types this module implements."""


def task_eval_types(task: Any) -> list[str]:
    """The WebArena eval types of a task's evaluator (empty for a task without one)."""
    config = task.config if isinstance(task.config, dict) else {}
    return list((config.get("eval") or {}).get("eval_types") or [])


STRING_APPROACHES: tuple[str, ...] = ("exact_match", "must_include", "fuzzy_match")
CONTENT_APPROACHES: tuple[str, ...] = ("exact_match", "must_include", "must_exclude",
                                       "fuzzy_match")
OR_SEPARATOR = " |OR| "
NOT_ACHIEVABLE = "N/A"
JUDGE_HINT = "this task needs an LLM judge: pass --judge MODEL"

NAVIGATION_WAIT_S = 3.0
"""WebArena's fixed wait after each ``program_html`` navigation."""

DEVIATIONS: dict[str, str] = {
    "url_slash": "url_match drops a '/' that ends the path before a query, in the reference and "
                 "the page alike (WebArena: '…/issues/?x' needs the '/')",
    "page_text": "the empty program_html locator selects the page's HTML followed by its visible "
                 "text, so a phrase split by tags is found (WebArena: the HTML only)",
    "load_wait": "a program_html navigation waits for the page's load event only (WebArena waits "
                 "3 s more)",
}
"""Opt-in deviations from WebArena's verdicts, by name (each says what it changes)."""


def check_deviations(names: Any) -> frozenset[str]:
    """``names`` (a list, or one comma-separated string) as a set of :data:`DEVIATIONS` keys.

    Raises:
        ConfigError: A name that is not one of them.
    """
    if names is None:
        return frozenset()
    items = names.split(",") if isinstance(names, str) else list(names)
    chosen = frozenset(str(n).strip() for n in items if str(n).strip())
    unknown = sorted(chosen - DEVIATIONS.keys())
    if unknown:
        raise ConfigError(f"unknown evaluator deviation(s) {', '.join(unknown)}; "
                          f"known: {', '.join(DEVIATIONS)}")
    return chosen

# Placeholders WebArena uses for its self-hosted sites; any ``__NAME__`` in a URL is looked up.
SITE_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9_]*?)__")
_SPECIAL_PLACEHOLDERS = frozenset({"__last_url__", "__page__"})


# --------------------------------------------------------------------------------------------
# String comparisons (StringEvaluator)
# --------------------------------------------------------------------------------------------


def clean_answer(answer: str) -> str:
    """Strip whitespace and one pair of surrounding quotes, then lowercase (as WebArena)."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


@functools.cache
def _nltk_tokenizers() -> tuple[Any, Any]:
    """NLTK's sentence splitter and word tokenizer (``word_tokenize``'s parts): Punkt with its
    English model when NLTK's data is installed, else Punkt's untrained defaults (the model is
    a download; they split sentences alike on ordinary text)."""
    try:
        from nltk.tokenize import NLTKWordTokenizer
        from nltk.tokenize.punkt import PunktSentenceTokenizer
    except ImportError:
        raise MissingExtraError("nltk", "web") from None
    try:
        from nltk.tokenize import PunktTokenizer

        sentences = PunktTokenizer("english")  # NLTK's data (punkt_tab), when installed
    except (LookupError, OSError, ValueError, ImportError):
        sentences = PunktSentenceTokenizer()
    return sentences, NLTKWordTokenizer()


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize``, as WebArena tokenizes answers: sentences by Punkt, then NLTK's
    Treebank-style word tokenizer (``"3/2."`` gives ``["3/2", "."]``, ``"$12.99"`` gives
    ``["$", "12.99"]``)."""
    sentences, words = _nltk_tokenizers()
    return [token for sentence in sentences.tokenize(text) for token in words.tokenize(sentence)]


def exact_match(ref: str, pred: str) -> float:
    """1.0 if the cleaned strings are equal."""
    return float(clean_answer(pred) == clean_answer(ref))


def must_include(ref: str, pred: str, *, tokenize: bool = False) -> float:
    """1.0 if the cleaned ``ref`` is contained in the cleaned ``pred``.

    With ``tokenize`` and a one-character reference, the reference must be a whole token of the
    prediction (WebArena's guard against ``"0"`` matching ``"10"``).
    """
    clean_ref = clean_answer(ref)
    clean_pred = clean_answer(pred)
    if tokenize and len(clean_ref) == 1 and len(word_tokenize(clean_ref)) == 1:
        return float(clean_ref in word_tokenize(clean_pred))
    return float(clean_ref in clean_pred)


def must_include_any(ref: str, pred: str, *, tokenize: bool = False) -> float:
    """:func:`must_include` where ``ref`` may hold ``" |OR| "``-separated alternatives."""
    return float(any(must_include(r, pred, tokenize=tokenize) for r in ref.split(OR_SEPARATOR)))


# --------------------------------------------------------------------------------------------
# URL comparison (URLEvaluator)
# --------------------------------------------------------------------------------------------


def _clean_url(url: str) -> str:
    return str(url).rstrip("/")


def _parse_url(url: str, *, clean_path: bool = False) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(url)
    base = parsed.netloc + parsed.path
    return (_clean_url(base) if clean_path else base), urllib.parse.parse_qs(parsed.query)


def url_match(reference: str, pred_url: str, *, clean_path: bool = False) -> float:
    """WebArena's "GOLD in PRED" URL rule (see the module docstring); ``clean_path`` is the
    ``url_slash`` deviation."""
    refs = [_clean_url(u) for u in reference.split(OR_SEPARATOR)]
    ref_bases: list[str] = []
    ref_queries: dict[str, set[str]] = collections.defaultdict(set)
    for ref in refs:
        base, query = _parse_url(ref, clean_path=clean_path)
        ref_bases.append(base)
        for key, values in query.items():
            ref_queries[key].update(values)
    pred_base, pred_query = _parse_url(_clean_url(pred_url), clean_path=clean_path)
    # As in WebArena: the reference base path must be a substring of the predicted one.
    base_score = float(any(base in pred_base for base in ref_bases))
    query_score = 1.0
    for key, values in ref_queries.items():
        query_score *= float(any(v in pred_query.get(key, []) for v in values))
    return base_score * query_score


# --------------------------------------------------------------------------------------------
# Config validation
# --------------------------------------------------------------------------------------------


def _where(config: Mapping[str, Any]) -> str:
    task_id = config.get("task_id") if isinstance(config, Mapping) else None
    return f"task {task_id}: " if task_id is not None else "task config: "


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def validate_config(config: Mapping[str, Any]) -> None:
    """Check a WebArena task config; raise :class:`TaskError` with a one-line message if malformed.

    Checks ``intent``, ``start_url`` and ``eval`` (known ``eval_types`` and, for each, the fields
    it reads).
    """
    if not isinstance(config, Mapping):
        raise TaskError(f"task config must be a JSON object, got {type(config).__name__}")
    where = _where(config)
    intent = config.get("intent")
    if not isinstance(intent, str) or not intent.strip():
        raise TaskError(f"{where}missing 'intent' (the instruction given to the agent)")
    if not isinstance(config.get("start_url"), str) or not config["start_url"].strip():
        raise TaskError(f"{where}missing 'start_url'")
    ev = config.get("eval")
    if not isinstance(ev, Mapping):
        raise TaskError(f"{where}missing 'eval' object")
    eval_types = ev.get("eval_types")
    if not _is_str_list(eval_types) or not eval_types:
        raise TaskError(f"{where}'eval.eval_types' must be a non-empty list of strings")
    for eval_type in eval_types:
        if eval_type not in EVAL_TYPES:
            raise TaskError(
                f"{where}unknown eval type {eval_type!r} (supported: {', '.join(EVAL_TYPES)})"
            )
    if "string_match" in eval_types:
        _validate_string_match(ev, where)
    if "url_match" in eval_types:
        ref = ev.get("reference_url")
        if not isinstance(ref, str) or not ref.strip():
            raise TaskError(f"{where}url_match needs a non-empty 'eval.reference_url'")
        note = ev.get("url_note") or "GOLD in PRED"
        if note != "GOLD in PRED":
            raise TaskError(f"{where}unknown url_note {note!r} (supported: 'GOLD in PRED')")
    if "program_html" in eval_types:
        _validate_program_html(ev, where)


def _validate_string_match(ev: Mapping[str, Any], where: str) -> None:
    refs = ev.get("reference_answers")
    if not isinstance(refs, Mapping) or not refs:
        raise TaskError(f"{where}string_match needs an 'eval.reference_answers' object")
    for approach, value in refs.items():
        if approach not in STRING_APPROACHES:
            raise TaskError(
                f"{where}unknown reference_answers key {approach!r} "
                f"(supported: {', '.join(STRING_APPROACHES)})"
            )
        if approach == "exact_match" and not isinstance(value, str):
            raise TaskError(f"{where}reference_answers.exact_match must be a string")
        if approach == "must_include" and not (_is_str_list(value) or isinstance(value, str)):
            raise TaskError(f"{where}reference_answers.must_include must be a list of strings")
        if approach == "fuzzy_match":
            if value == NOT_ACHIEVABLE:
                if not isinstance(ev.get("string_note"), str):
                    raise TaskError(
                        f"{where}fuzzy_match 'N/A' needs 'eval.string_note' (why the task "
                        "cannot be done)"
                    )
            elif not _is_str_list(value):
                raise TaskError(
                    f"{where}reference_answers.fuzzy_match must be 'N/A' or a list of strings"
                )


def _validate_program_html(ev: Mapping[str, Any], where: str) -> None:
    targets = ev.get("program_html")
    if not isinstance(targets, list) or not targets:
        raise TaskError(f"{where}program_html needs a non-empty 'eval.program_html' list")
    for i, target in enumerate(targets):
        if not isinstance(target, Mapping):
            raise TaskError(f"{where}program_html[{i}] must be an object")
        if not isinstance(target.get("url"), str) or not target["url"].strip():
            raise TaskError(f"{where}program_html[{i}] needs a 'url' (or \"last\")")
        locator = target.get("locator")
        if not isinstance(locator, str):
            raise TaskError(f"{where}program_html[{i}] needs a 'locator' string (\"\" = page)")
        stripped = locator.strip()
        if stripped and not stripped.startswith(("document.", "[...document.", "func:")):
            raise TaskError(
                f'{where}program_html[{i}] locator must be "", document.… or func:…, '
                f"got {locator[:60]!r}"
            )
        contents = target.get("required_contents")
        if not isinstance(contents, Mapping) or len(contents) != 1:
            raise TaskError(
                f"{where}program_html[{i}] needs 'required_contents' with one of "
                + ", ".join(CONTENT_APPROACHES)
            )
        ((approach, value),) = contents.items()
        if approach not in CONTENT_APPROACHES:
            raise TaskError(
                f"{where}program_html[{i}] unknown required_contents key {approach!r} "
                f"(supported: {', '.join(CONTENT_APPROACHES)})"
            )
        if approach == "exact_match" and not isinstance(value, str):
            raise TaskError(f"{where}program_html[{i}] exact_match must be a string")
        if approach != "exact_match" and not _is_str_list(value) and not (
                approach == "fuzzy_match" and isinstance(value, str)):
            raise TaskError(f"{where}program_html[{i}] {approach} must be a list of strings")


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """The outcome of evaluating one task.

    Attributes:
        score: Product of the evaluators' scores, in [0, 1] (1.0 = success).
        details: One dict per evaluator: ``type``, ``score`` and what was compared.
    """

    score: float
    details: list[dict[str, Any]] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """True if every evaluator passed."""
        return self.score >= 1.0


def _normalise_site_urls(site_urls: Mapping[str, str]) -> dict[str, str]:
    """Accept ``{"__SHOPPING__": url}`` or ``{"shopping": url}``; drop trailing slashes."""
    out: dict[str, str] = {}
    for key, value in (site_urls or {}).items():
        name = key if key.startswith("__") and key.endswith("__") else f"__{key.upper()}__"
        out[name] = str(value).rstrip("/")
    return out


def fill_placeholders(
    text: str, site_urls: Mapping[str, str], *, what: str = "url", strict: bool = True
) -> str:
    """Replace WebArena site placeholders (``__SHOPPING__`` …) in ``text``.

    Args:
        text: A URL (or locator) from a task config.
        site_urls: Placeholder → base URL.
        what: What ``text`` is, for the error message.
        strict: Raise for a placeholder without a URL (False: leave it, e.g. in JavaScript
            where ``__NEXT_DATA__`` is a global, not a placeholder).

    Raises:
        ConfigError: ``strict`` and a placeholder has no URL in ``site_urls``.
    """
    urls = _normalise_site_urls(site_urls)

    def replace(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in _SPECIAL_PLACEHOLDERS or (not strict and token not in urls):
            return token
        if token not in urls:
            raise ConfigError(
                f"{what} {text!r} uses {token} but no URL was given for it: pass its site URL "
                f"(e.g. site_urls={{'{token}': 'http://127.0.0.1:7770'}})"
            )
        return urls[token]

    return SITE_PLACEHOLDER.sub(replace, text)


def evaluate_task(
    config: Mapping[str, Any],
    *,
    answer: str | None,
    page: Any,
    site_urls: Mapping[str, str],
    judge: Judge | None = None,
    helpers: Mapping[str, Helper] | None = None,
    deviations: Collection[str] = (),
) -> EvalResult:
    """Evaluate a finished episode the way WebArena does.

    Args:
        config: The WebArena task config (``intent``, ``eval`` …).
        answer: The agent's final answer (``send_msg_to_user`` text, ``"N/A"`` for
            ``report_infeasible``); None when it gave none (compared as ``""``).
        page: The sync Playwright page the episode ended on; may be None when no evaluator
            needs it (``url_match`` only reads ``page.url``).
        site_urls: WebArena placeholders to base URLs, e.g. ``{"__SHOPPING__": "http://…"}``.
        judge: The LLM judge for ``fuzzy_match`` (see :data:`Judge`).
        helpers: Extra or replacement ``func:`` helpers by name. The built-in ones are
            ``get_query_text``, ``get_query_text_lowercase``, ``reddit_get_post_url`` and
            ``gitlab_get_project_memeber_role``.
        deviations: Opt-in deviations from WebArena's verdicts (:data:`DEVIATIONS` keys).

    Returns:
        The score (product over evaluators) and per-evaluator details.

    Raises:
        TaskError: The config is malformed, has an unknown eval type, or names an unknown
            helper.
        ConfigError: A ``fuzzy_match`` task got no judge, or a placeholder has no site URL.
        EnvError: An evaluator needs the page but ``page`` is None, or a ``program_html`` URL
            cannot be opened.
    """
    validate_config(config)
    deviations = check_deviations(deviations)
    ev = config["eval"]
    eval_types = list(ev["eval_types"])
    if judge is None and needs_judge(config):
        raise ConfigError(JUDGE_HINT)
    needs_page = [t for t in eval_types if t in ("url_match", "program_html")]
    if needs_page and page is None:
        raise EnvError(f"evaluators {', '.join(needs_page)} need the final page, got none")
    start_url = str(page.url) if page is not None else ""
    details: list[dict[str, Any]] = []
    score = 1.0
    for eval_type in eval_types:
        if eval_type == "string_match":
            detail = _eval_string(config, answer, judge)
        elif eval_type == "url_match":
            detail = _eval_url(ev, start_url, site_urls, clean_path="url_slash" in deviations)
        elif eval_type == "program_html":
            detail = _eval_html(config, page, start_url, site_urls, helpers, deviations, judge)
        else:  # validate_config already rejects these; kept for a clear error if it changes
            raise TaskError(f"{_where(config)}unknown eval type {eval_type!r}")
        details.append(detail)
        score *= detail["score"]
    return EvalResult(score=score, details=details)


def needs_judge(config: Mapping[str, Any]) -> bool:
    """Whether scoring the task always takes the LLM judge: a ``fuzzy_match`` reference other
    than ``N/A`` (an ``N/A`` task needs it only for an answer other than ``N/A``)."""
    ev = config.get("eval") or {}
    types = ev.get("eval_types") or []
    refs = ev.get("reference_answers") or {}
    if "string_match" in types and "fuzzy_match" in refs and refs["fuzzy_match"] != NOT_ACHIEVABLE:
        return True
    return "program_html" in types and any(
        "fuzzy_match" in (t.get("required_contents") or {}) for t in ev.get("program_html") or [])


def _eval_string(config: Mapping[str, Any], answer: str | None, judge: Judge | None) -> dict:
    ev = config["eval"]
    intent = config["intent"]
    pred = clean_answer(answer or "")
    checks: list[dict[str, Any]] = []
    score = 1.0
    for approach, value in ev["reference_answers"].items():
        if approach == "exact_match":
            s = exact_match(value, pred)
            checks.append({"approach": approach, "reference": value, "score": s})
            score *= s
        elif approach == "must_include":
            items = [value] if isinstance(value, str) else value  # WebArena-Lite's task 81
            for item in items:
                s = must_include(item, pred, tokenize=len(items) == 1)
                checks.append({"approach": approach, "reference": item, "score": s})
                score *= s
        elif approach == "fuzzy_match":
            if value == NOT_ACHIEVABLE:
                s = exact_match(NOT_ACHIEVABLE, pred)
                check = {"approach": approach, "reference": NOT_ACHIEVABLE, "score": s}
                if s != 1.0 and judge is None:
                    # an answer other than N/A needs the unachievable-task judge: none is
                    # configured, so it is not judged (scored 0, and said so)
                    check["judge"] = "none: pass --judge MODEL to judge this answer"
                elif s != 1.0:
                    reason = ev.get("string_note", "")
                    ua = getattr(judge, "unachievable", judge)
                    s = float(ua(intent, reason, pred))
                    check.update(judge="unachievable", string_note=reason, score=s)
                checks.append(check)
                # WebArena replaces (rather than multiplies) the score here.
                score = s
            else:
                assert judge is not None  # checked by evaluate_task
                for reference in value:
                    if not pred:
                        s = 1.0 if not reference else 0.0
                    else:
                        s = float(judge(intent, reference, pred))
                    checks.append(
                        {"approach": approach, "reference": reference, "score": s, "judge": "fuzzy"}
                    )
                    score *= s
    return {"type": "string_match", "score": score, "prediction": pred, "checks": checks}


def _eval_url(ev: Mapping[str, Any], page_url: str, site_urls: Mapping[str, str], *,
              clean_path: bool = False) -> dict:
    reference = fill_placeholders(ev["reference_url"], site_urls, what="reference_url")
    score = url_match(reference, page_url, clean_path=clean_path)
    return {"type": "url_match", "score": score, "reference": reference, "url": page_url}


# -- program_html -----------------------------------------------------------------------------


def _page_content(page: Any, *, with_text: bool = False) -> str:
    """The page's HTML (WebArena), followed by its visible text with ``with_text`` (the
    ``page_text`` deviation)."""
    content = str(page.content())
    if not with_text:
        return content
    try:
        text = str(page.inner_text("body"))
    except Exception as exc:  # a page without a body: the HTML is all there is
        logger.debug("inner_text(body) failed: %s", exc)
        text = ""
    return content + "\n" + text


def _select(page: Any, target: Mapping[str, Any], helpers: Mapping[str, Helper] | None,
            *, with_text: bool = False) -> str:
    locator = target["locator"].strip()
    if not locator:
        return _page_content(page, with_text=with_text)
    if locator.startswith(("document.", "[...document.")):
        for prep in target.get("prep_actions") or []:
            try:
                page.evaluate(f"() => {prep}")
            except Exception as exc:  # as WebArena: a failed preparation is ignored
                logger.debug("prep action %r failed: %s", prep, exc)
        try:
            result = page.evaluate(f"() => {locator}")
        except Exception as exc:  # as WebArena: the page is wrong, nothing is selected
            logger.debug("locator %r failed: %s", locator, exc)
            return ""
        return "" if result is None else str(result)
    expression = locator[len("func:") :]
    return call_helper(expression, page=page, helpers=helpers)


@contextlib.contextmanager
def _target_page(page: Any, url: str, *, wait_s: float) -> Iterator[Any]:
    """The page a ``program_html`` target reads: ``page`` itself for ``"last"``, else ``url``
    opened in a new page of its browser context (closed afterwards), as WebArena does, so the
    agent's page and its URL stay as the episode left them."""
    if url == "last":
        yield page
        return
    opened = page.context.new_page()
    try:
        try:
            opened.goto(url, wait_until="load")
        except Exception as exc:  # an unreachable site is an infrastructure failure
            raise EnvError(f"program_html could not open {url}: {exc}") from exc
        if wait_s > 0:
            time.sleep(wait_s)
        yield opened
    finally:
        try:
            opened.close()
        except Exception as exc:  # a crashed page is closed already
            logger.debug("closing the program_html page failed: %s", exc)


def _eval_html(
    config: Mapping[str, Any],
    page: Any,
    start_url: str,
    site_urls: Mapping[str, str],
    helpers: Mapping[str, Helper] | None,
    deviations: frozenset[str],
    judge: Judge | None = None,
) -> dict:
    ev = config["eval"]
    score = 1.0
    checks: list[dict[str, Any]] = []
    for target in ev["program_html"]:
        url = target["url"].strip()
        if url.startswith("func:"):
            expression = url[len("func:") :].replace("__last_url__", start_url)
            url = call_helper(fill_placeholders(expression, site_urls), page=page, helpers=helpers)
        url = fill_placeholders(url, site_urls)
        locator = fill_placeholders(target["locator"], site_urls, what="locator", strict=False)
        with _target_page(page, url, wait_s=0.0 if "load_wait" in deviations
                          else NAVIGATION_WAIT_S) as where:
            selected = html.unescape(_select(where, {**target, "locator": locator}, helpers,
                                             with_text="page_text" in deviations))
        ((approach, required),) = target["required_contents"].items()
        check: dict[str, Any] = {
            "url": url,
            "locator": target["locator"],
            "approach": approach,
            "selected": selected[:500],
        }
        if approach == "exact_match":
            s = exact_match(required, selected)
            check["reference"] = required
        elif approach == "must_include":
            s = 1.0
            for content in required:
                s *= must_include_any(content, selected)
            check["reference"] = required
        elif approach == "fuzzy_match":  # WebArena-Lite: one judgement of all the references
            assert judge is not None  # checked by evaluate_task
            reference = required if isinstance(required, str) else ", ".join(required)
            s = float(judge(config["intent"], reference, selected)) if selected else 0.0
            check.update(reference=reference, judge="fuzzy")
        else:  # must_exclude
            s = 1.0
            for content in required:
                s *= 1.0 - must_include_any(content, selected)
            check["reference"] = required
        check["score"] = s
        checks.append(check)
        score *= s
    return {"type": "program_html", "score": score, "checks": checks}
