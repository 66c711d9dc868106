"""The task's own verdict of a dream step, where it needs only what the dream knows.

WebArena scores an episode when the agent stops (``send_msg_to_user``, ``stop [...]``): a
``string_match`` evaluator reads the answer's text, a ``url_match`` evaluator the URL of the
page the agent stopped on. Both are pure functions of what the dream has: the action the
policy wrote and the state it wrote it in. So for a task with those evaluators (and a
reference, without an LLM judge) the dream need not ask the experience model whether the
episode succeeded: the task's own evaluator says it, exactly as the real site would on the
same page (:func:`~dreamgym_agents.adapters.webarena.evaluation.evaluate_task`). A step that
does not stop never completes such a task (the real environment scores only a stop).

The experience model, judging alone, rewards answers of the right form and the wrong value
that the site fails; with this verdict it pays none (evidence: docs/RESULTS.md, "Calibration of
the dream"). Tasks judged by the site's hidden state (``program_html``), by an LLM
(``fuzzy_match``) and a curriculum's variants without a reference (the generic template
generator's) have no such verdict: the experience model's stands there.
"""

from __future__ import annotations

from dreamgym_agents.adapters.webarena.evaluation import (
    SITE_PLACEHOLDER,
    evaluate_task,
    fill_placeholders,
    needs_judge,
)
from dreamgym_agents.adapters.webarena.experience_prompt import answer_text
from dreamgym_agents.types import Task

CHECKED = frozenset({"string_match", "url_match"})
"""The evaluator kinds a dream step can be checked by."""


class _UrlPage:
    """What ``url_match`` reads of a page: its URL."""

    def __init__(self, url: str) -> None:
        self.url = url


def checkable(task: Task) -> bool:
    """Whether the task's own evaluator can judge a dream step: evaluators of the
    :data:`CHECKED` kinds only, a reference, no judge. A curriculum's variant has an evaluator
    only where its generator made one (the shop's, :mod:`.curriculum`)."""
    ev = task.config.get("eval") or {}
    kinds = set(ev.get("eval_types") or [])
    return bool(kinds) and kinds <= CHECKED and not needs_judge(task.config)


def dream_verdict(task: Task, state: str, action: str) -> bool | None:
    """The task's verdict of playing ``action`` on ``state`` (None: it cannot say; the
    experience model's verdict stands). A stop is judged by the task's evaluators on the
    answer and the page's URL; any other step of a checkable task completes nothing."""
    if not checkable(task):
        return None
    answer = answer_text(action)
    if answer is None:
        return False
    ev = task.config["eval"]
    page = None
    sites: dict[str, str] = {}
    if "url_match" in ev["eval_types"]:
        url = next((line[4:].strip() for line in state.splitlines()[:3]
                    if line.startswith("URL:")), "")
        # states name sites by placeholder; any base does, as long as both resolve alike
        sites = {m.group(0): f"http://{m.group(1).lower()}.offline.invalid"
                 for text in (url, str(ev.get("reference_url") or ""))
                 for m in SITE_PLACEHOLDER.finditer(text)}
        page = _UrlPage(fill_placeholders(url, sites, strict=False))
    return evaluate_task(task.config, answer=answer, page=page, site_urls=sites).success
