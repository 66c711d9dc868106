"""Replay every task's oracle in headless Chromium against the bundled site and grade it.

``python -m dreamgym_agents.adapters.shopping.oraclecheck [--limit N] [--negative]``

For each task: create a fresh instance, open ``start_url``, play the oracle steps with
``page.get_by_role(role, name=..., exact=...)`` (Playwright's strict locators, so an ambiguous
name fails the check), then grade with a small version of WebArena's evaluators:

- ``string_match``: ``exact_match`` is equality after WebArena's cleaning (strip, drop
  surrounding quotes, lower case); ``must_include`` requires every item as a substring.
- ``url_match`` ("GOLD in PRED"): the reference's host+path is contained in the final URL's, and
  each reference query parameter has one of its values in the final URL's query.
- ``program_html``: open the target URL (unless ``"last"``), evaluate ``"() => " + locator`` (an
  error gives ``""``; an empty locator gives the page's inner text), then apply the required
  ``exact_match`` / ``must_include`` (alternatives separated by ``" |OR| "``).

``--negative`` runs the control: nothing is done and a wrong answer (another instance's answer
of the same template, else ``"N/A"``) is given; every task must then fail.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from dreamgym_agents.adapters.shopping.server import ShoppingSite
from dreamgym_agents.adapters.shopping.taskkit import SITE

logger = logging.getLogger(__name__)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
Config = dict[str, Any]


@dataclass
class CheckResult:
    """Outcome of one task: ``passed`` is the grade (inverted expectations in negative mode)."""

    task_id: int
    template_id: int
    passed: bool
    reason: str = ""
    answer_on_page: bool | None = None


def load_tasks(task_dir: str | Path | None = None) -> list[Config]:
    """Train, validation and test configs, from ``task_dir`` or the installed
    ``tasks/webarena_shopping``."""
    tasks: list[Config] = []
    for split in ("train", "validation", "test"):
        if task_dir is not None:
            text = (Path(task_dir) / f"{split}.json").read_text(encoding="utf-8")
        else:
            ref = resources.files("dreamgym_agents.tasks") / "webarena_shopping" / f"{split}.json"
            text = ref.read_text(encoding="utf-8")
        tasks.extend(json.loads(text))
    return sorted(tasks, key=lambda t: t["task_id"])


def sample_tasks(tasks: list[Config], per_template: int) -> list[Config]:
    """The first ``per_template`` tasks (by id) of every template: deterministic, full cover."""
    by_template: dict[int, list[Config]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t["task_id"]):
        by_template[task["intent_template_id"]].append(task)
    return [t for tid in sorted(by_template) for t in by_template[tid][:per_template]]


# ---- grading -------------------------------------------------------------------------------
def clean_answer(text: str) -> str:
    """WebArena's answer cleaning: strip, drop one pair of surrounding quotes, lower case."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text.lower()


def string_match(reference: dict[str, Any], answer: str) -> bool:
    if "exact_match" in reference:
        return clean_answer(answer) == clean_answer(reference["exact_match"])
    return all(clean_answer(item) in clean_answer(answer) for item in reference["must_include"])


def url_match(reference_url: str, url: str) -> bool:
    """WebArena's "GOLD in PRED" rule (alternatives separated by ``" |OR| "``)."""
    pred = urlparse(url.rstrip("/"))
    pred_base, pred_query = pred.netloc + pred.path, parse_qs(pred.query)
    refs = [urlparse(ref.rstrip("/")) for ref in reference_url.split(" |OR| ")]
    if not any(ref.netloc + ref.path in pred_base for ref in refs):
        return False
    wanted: dict[str, set[str]] = defaultdict(set)
    for ref in refs:
        for key, values in parse_qs(ref.query).items():
            wanted[key].update(values)
    return all(any(v in pred_query.get(key, []) for v in values) for key, values in wanted.items())


def contents_match(required: dict[str, Any], text: str) -> bool:
    if "exact_match" in required:
        return clean_answer(text) == clean_answer(required["exact_match"])
    return all(any(alt.lower() in text.lower() for alt in item.split(" |OR| "))
               for item in required["must_include"])


def grade(page: Any, config: Config, answer: str, base: str) -> tuple[bool, str]:
    """Grade the episode that just ended on ``page``; return (success, reason if failed)."""
    ev = config["eval"]
    if "string_match" in ev["eval_types"] and not string_match(ev["reference_answers"], answer):
        return False, f"answer {answer!r} does not match {ev['reference_answers']}"
    if "url_match" in ev["eval_types"]:
        ref = ev["reference_url"].replace(SITE, base)
        if not url_match(ref, page.url):
            return False, f"url {page.url} does not match {ref}"
    if "program_html" in ev["eval_types"]:
        for target in ev["program_html"]:
            if target["url"] != "last":
                page.goto(target["url"].replace(SITE, base))
            locator = target["locator"].strip()
            if not locator:
                value = page.inner_text("body")
            else:
                try:
                    value = str(page.evaluate(f"() => {locator}"))
                except Exception as exc:  # WebArena: a failing locator means "not there"
                    logger.debug("locator %s failed: %s", locator, exc)
                    value = ""
            value = html.unescape(value)
            if not contents_match(target["required_contents"], value):
                return False, (f"{target['url']} {locator!r} = {value[:200]!r} does not satisfy "
                               f"{target['required_contents']}")
    return True, ""


# ---- playing the oracle --------------------------------------------------------------------
def play(page: Any, steps: list[dict[str, Any]], base: str) -> str:
    """Execute oracle steps on ``page``; return the ``stop`` answer (raises on a bad step)."""
    for step in steps:
        op = step["op"]
        if op == "stop":
            return str(step.get("answer", ""))
        if op == "goto":
            page.goto(step["url"].replace(SITE, base))
            continue
        exact = step.get("match", "exact") != "contains"
        element = page.get_by_role(step["role"], name=step["name"], exact=exact)
        if op == "click":
            element.click()
        elif op == "fill":
            element.fill(step["text"])
        elif op == "press":
            element.press(step["key"])
        elif op == "select":
            element.select_option(label=step["option"])
        else:
            raise ValueError(f"unknown oracle op {op!r}")
        page.wait_for_load_state("load")
    raise ValueError("oracle has no stop step")


def _wrong_answers(tasks: list[Config]) -> dict[int, str]:
    """For the negative control: another task's answer of the same template, else "N/A"."""
    by_template: dict[int, list[Config]] = defaultdict(list)
    for task in tasks:
        by_template[task["intent_template_id"]].append(task)
    wrong: dict[int, str] = {}
    for group in by_template.values():
        answers = [t["oracle"][-1].get("answer", "") for t in group]
        for i, task in enumerate(group):
            others = [a for a in answers[i + 1:] + answers[:i] if a != answers[i]]
            wrong[task["task_id"]] = others[0] if others else "N/A"
    return wrong


def check_tasks(tasks: list[Config], *, seed: int = 0, negative: bool = False,
                chromium: str = CHROMIUM, timeout_ms: int = 10_000) -> list[CheckResult]:
    """Run the oracle (or the negative control) of every task; one fresh instance per task."""
    from playwright.sync_api import sync_playwright

    wrong = _wrong_answers(tasks) if negative else {}
    results: list[CheckResult] = []
    with ShoppingSite(seed=seed) as site, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout_ms)
            for task in tasks:
                results.append(_check_one(site, page, task, wrong.get(task["task_id"])))
        finally:
            browser.close()
    return results


def _check_one(site: ShoppingSite, page: Any, task: Config, wrong: str | None) -> CheckResult:
    base = site.new_instance(login=bool(task["require_login"]))
    tid, template = task["task_id"], task["intent_template_id"]
    # a fresh browser state per task, as each episode's context: a sign-in of an earlier task
    # (its session cookie) must not sign this one in
    page.context.clear_cookies()
    try:
        page.goto(task["start_url"].replace(SITE, base))
        if wrong is not None:
            ok, reason = grade(page, task, wrong, base)
            return CheckResult(tid, template, not ok, "negative control passed grading" if ok
                               else "")
        try:
            answer = play(page, task["oracle"], base)
        except Exception as exc:  # a step that cannot be played is the finding we report
            return CheckResult(tid, template, False, f"step failed: {str(exc).splitlines()[0]}")
        on_page = None
        if task["eval"]["reference_answers"]:
            on_page = answer.lower() in page.inner_text("body").lower()
        ok, reason = grade(page, task, answer, base)
        return CheckResult(tid, template, ok, reason, on_page)
    finally:
        site.drop_instance(base)


def summarize(results: list[CheckResult]) -> str:
    """Per-template pass counts and every failure, as text."""
    by_template: dict[int, list[CheckResult]] = defaultdict(list)
    for r in results:
        by_template[r.template_id].append(r)
    lines = [f"template {tid:>3}: {sum(r.passed for r in rs)}/{len(rs)} passed"
             for tid, rs in sorted(by_template.items())]
    lines += [f"FAIL task {r.task_id} (template {r.template_id}): {r.reason}"
              for r in results if not r.passed]
    passed = sum(r.passed for r in results)
    shown = [r for r in results if r.answer_on_page is not None]
    lines.append(f"total: {passed}/{len(results)} passed; string answers visible on the final "
                 f"page: {sum(bool(r.answer_on_page) for r in shown)}/{len(shown)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: check all tasks (or ``--limit`` N), print a summary, exit 1 on any failure."""
    parser = argparse.ArgumentParser(description="Replay the oracles of the shopping tasks.")
    parser.add_argument("--limit", type=int, default=0, help="check only the first N tasks")
    parser.add_argument("--per-template", type=int, default=0,
                        help="check only the first K tasks of every template")
    parser.add_argument("--tasks", default=None, help="task directory (default: installed set)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--negative", action="store_true",
                        help="negative control: do nothing, answer wrongly; all must fail")
    parser.add_argument("--chromium", default=CHROMIUM)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    tasks = load_tasks(args.tasks)
    if args.per_template:
        tasks = sample_tasks(tasks, args.per_template)
    if args.limit:
        tasks = tasks[: args.limit]
    started = time.monotonic()
    results = check_tasks(tasks, seed=args.seed, negative=args.negative, chromium=args.chromium)
    print(summarize(results))
    print(f"{len(results)} tasks in {time.monotonic() - started:.0f}s"
          + (" (negative control)" if args.negative else ""))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
