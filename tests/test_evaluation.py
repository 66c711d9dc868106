"""Tests of the WebArena evaluators (string, URL, page content) and config validation."""

from __future__ import annotations

import copy
import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dreamgym_agents.adapters.webarena.evaluation import (
    JUDGE_HINT,
    EvalResult,
    clean_answer,
    evaluate_task,
    exact_match,
    fill_placeholders,
    must_include,
    url_match,
    validate_config,
    word_tokenize,
)
from dreamgym_agents.adapters.webarena.judge import make_llm_judge
from dreamgym_agents.adapters.webarena.page_helper import call_helper, reddit_get_post_url
from dreamgym_agents.errors import ConfigError, EnvError, TaskError

SITES = {"__SHOPPING__": "http://shop.test:7770", "__REDDIT__": "http://forum.test:9999/"}


def task(eval_types: list[str], **ev: Any) -> dict[str, Any]:
    return {
        "task_id": 7,
        "intent": "What is the price of the Acme Laptop?",
        "start_url": "__SHOPPING__",
        "eval": {"eval_types": eval_types, **ev},
    }


def string_task(**reference_answers: Any) -> dict[str, Any]:
    return task(["string_match"], reference_answers=reference_answers)


class FakeJudge:
    """Scores 1.0 when the reference occurs in the prediction; records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, intent: str, reference: str, prediction: str) -> float:
        self.calls.append((intent, reference, prediction))
        return float(reference.lower() in prediction.lower())


class FakeUAJudge(FakeJudge):
    def __init__(self, verdict: float) -> None:
        super().__init__()
        self.verdict = verdict
        self.ua_calls: list[tuple[str, str, str]] = []

    def unachievable(self, intent: str, reason: str, prediction: str) -> float:
        self.ua_calls.append((intent, reason, prediction))
        return self.verdict


def run(config: dict[str, Any], answer: str | None, **kwargs: Any) -> EvalResult:
    kwargs.setdefault("page", None)
    kwargs.setdefault("site_urls", SITES)
    return evaluate_task(config, answer=answer, **kwargs)


# -- string_match -----------------------------------------------------------------------------


def test_clean_answer_and_tokenize() -> None:
    assert clean_answer('  "Hello World" ') == "hello world"
    assert clean_answer("'x'") == "x"
    assert clean_answer("'x\"") == "'x\""
    assert word_tokenize("Total: $12.99, 3 items.") == [
        "Total",
        ":",
        "$",
        "12.99",
        ",",
        "3",
        "items",
        ".",
    ]
    assert exact_match("$12.99", " '$12.99' ") == 1.0
    assert must_include("0", "10 items", tokenize=True) == 0.0
    assert must_include("0", "0 items", tokenize=True) == 1.0
    assert must_include("0", "10 items") == 1.0


def test_exact_match() -> None:
    config = string_task(exact_match="$12.99")
    assert run(config, '"$12.99"').score == 1.0
    result = run(config, "It costs $12.99")
    assert result.score == 0.0
    (detail,) = result.details
    assert detail["type"] == "string_match" and detail["prediction"] == "it costs $12.99"
    assert detail["checks"] == [{"approach": "exact_match", "reference": "$12.99", "score": 0.0}]


def test_must_include_items_are_literal_in_answers() -> None:
    config = string_task(must_include=["Acme", "12.99"])
    assert run(config, "The Acme laptop costs $12.99").score == 1.0
    assert run(config, "It costs $12.99").score == 0.0
    # " |OR| " separates alternatives in program_html only: WebArena's StringEvaluator looks
    # for the whole item in the answer
    assert run(string_task(must_include=["Acme", "12.99 |OR| 13.00"]),
               "The Acme laptop costs $13.00").score == 0.0


WEBARENA = Path(__file__).resolve().parents[2] / "shared" / "data" / "webarena"


def webarena_config(task_id: int, file: str = "test.raw.json") -> dict:
    if not (WEBARENA / file).exists():
        pytest.skip(f"{WEBARENA / file} is not here")
    return next(c for c in json.loads((WEBARENA / file).read_text()) if c["task_id"] == task_id)


# Expected verdicts: WebArena's StringEvaluator (evaluation_harness/evaluators.py) worked by
# hand on each answer: clean_answer lowercases and strips quotes; must_include with a one-item
# list of a one-character reference is ``ref in nltk.word_tokenize(pred)``, else a substring
# test; exact_match compares the cleaned strings. The tokens are NLTK's own.
@pytest.mark.parametrize(("task_id", "answer", "verdict"), [
    (133, "Eric made 0 commits on 3/2.", 0.0),   # tokens: eric made 0 commits on 3/2 .
    (133, "2", 1.0),
    (133, "Eric made 2 commits.", 1.0),          # tokens: eric made 2 commits .
    (133, "12 commits", 0.0),                    # "2" is no token of "12"
    (386, "65 |OR| 3", 1.0),                     # the item as written is in the answer
    (386, "3", 0.0),                             # " |OR| " is no separator in string_match
    (386, "65", 0.0),
])
def test_verdicts_on_webarenas_own_references(task_id, answer, verdict) -> None:
    assert run(webarena_config(task_id), answer).score == verdict


def test_webarena_lite_loads_whole_with_its_odd_tasks() -> None:
    from dreamgym_agents.adapters.webarena.evaluation import needs_judge
    from dreamgym_agents.adapters.webarena.family import load_config_file

    if not (WEBARENA / "test_webarena_lite.raw.json").exists():
        pytest.skip("the WebArena-Lite file is not here")
    tasks = {int(t.task_id): t for t in load_config_file(WEBARENA / "test_webarena_lite.raw.json")}
    assert len(tasks) == 165 and len(load_config_file(WEBARENA / "test.raw.json")) == 812
    # task 81 writes must_include as a string: one item (a substring here: "yjlou" is long)
    assert run(tasks[81].config, "The users are yjlou and abisubramanya27").score == 1.0
    assert run(tasks[81].config, "abisubramanya27").score == 0.0
    # fuzzy_match inside program_html needs the judge
    assert all(needs_judge(tasks[i].config) for i in (123, 139, 140, 142))


def test_must_include_single_character_is_a_token() -> None:
    config = string_task(must_include=["3"])
    assert run(config, "There are 3 orders").score == 1.0
    assert run(config, "There are 13 orders").score == 0.0
    # With several items, WebArena does not tokenize.
    assert run(string_task(must_include=["3", "orders"]), "13 orders").score == 1.0


def test_no_answer_counts_as_empty() -> None:
    assert run(string_task(exact_match=""), None).score == 1.0
    assert run(string_task(must_include=["x"]), None).score == 0.0


def test_fuzzy_match_calls_the_judge() -> None:
    judge = FakeJudge()
    config = string_task(fuzzy_match=["12.99", "acme"])
    result = run(config, "Acme costs 12.99", judge=judge)
    assert result.score == 1.0
    intent = config["intent"]
    assert judge.calls == [
        (intent, "12.99", "acme costs 12.99"),
        (intent, "acme", "acme costs 12.99"),
    ]
    assert run(config, "Acme costs 13", judge=judge).score == 0.0
    judge.calls.clear()
    assert run(config, "", judge=judge).score == 0.0  # empty answer: no judge call
    assert judge.calls == []


def test_fuzzy_match_without_judge_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="pass --judge MODEL") as err:
        run(string_task(fuzzy_match=["x"]), "x")
    assert str(err.value) == JUDGE_HINT


def test_an_unachievable_task_needs_no_judge_for_an_na_answer() -> None:
    na = task(["string_match"], reference_answers={"fuzzy_match": "N/A"}, string_note="r")
    assert run(na, "N/A").score == 1.0
    other = run(na, "It cannot be done: no such order")
    (check,) = other.details[0]["checks"]
    assert other.score == 0.0 and check["judge"].startswith("none")  # not judged, and said


def test_not_achievable() -> None:
    config = task(
        ["string_match"],
        reference_answers={"fuzzy_match": "N/A"},
        string_note="the store does not sell cars",
    )
    judge = FakeUAJudge(verdict=1.0)
    assert run(config, "N/A", judge=judge).score == 1.0
    assert judge.ua_calls == [] and judge.calls == []
    result = run(config, "I cannot: no cars are sold here", judge=judge)
    assert result.score == 1.0
    assert judge.ua_calls == [
        (config["intent"], "the store does not sell cars", "i cannot: no cars are sold here")
    ]
    assert result.details[0]["checks"][0]["judge"] == "unachievable"
    assert run(config, "It costs $5", judge=FakeUAJudge(verdict=0.0)).score == 0.0
    # A plain callable judge is used for both kinds.
    plain = FakeJudge()
    assert run(config, "the store does not sell cars", judge=plain).score == 1.0
    assert plain.calls[0][1] == "the store does not sell cars"


# -- url_match --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "url", "score"),
    [
        ("http://s/a/b", "http://s/a/b/", 1.0),
        ("http://s/a/b", "http://s/a/b/c", 1.0),  # GOLD is a substring of PRED
        ("http://s/a/b", "http://s/a/x", 0.0),
        ("http://s/search?q=usb", "http://s/search?q=usb&page=2", 1.0),
        ("http://s/search?q=usb", "http://s/search?q=usb+cable", 0.0),
        ("http://s/search?q=usb", "http://s/search", 0.0),
        ("http://s/x |OR| http://s/y", "http://s/y", 1.0),
        ("http://s/s?q=a |OR| http://s/s?q=b", "http://s/s?q=b", 1.0),
        ("http://s/s?q=a |OR| http://s/s?q=b", "http://s/s?q=c", 0.0),
        # WebArena drops a trailing "/" of the whole URL only: a reference path ending "/"
        # before its query needs that "/" (WebArena's URLEvaluator, libwebarena 0.0.5, gives
        # these verdicts: the reference base "s/a/issues/" is not in "s/a/issues")
        ("http://s/a/issues/?sort=asc", "http://s/a/issues?sort=asc", 0.0),
        ("http://s/a/issues/?sort=asc", "http://s/a/issues/?sort=asc", 1.0),
        ("http://s/a/issues?sort=asc", "http://s/a/issues/?sort=asc", 1.0),
    ],
)
def test_url_match_rule(reference: str, url: str, score: float) -> None:
    assert url_match(reference, url) == score


def test_url_slash_deviation_on_a_real_reference() -> None:
    # task 45 of WebArena's test.raw.json; the page GitLab shows without the "/" before "?"
    reference = "__GITLAB__/a11yproject/a11yproject.com/-/issues/?sort=created_asc&state=opened"
    config = task(["url_match"], reference_url=reference)
    page = SimpleNamespace(
        url="http://git.test/a11yproject/a11yproject.com/-/issues?sort=created_asc&state=opened")
    sites = {"__GITLAB__": "http://git.test"}
    assert run(config, None, page=page, site_urls=sites).score == 0.0  # WebArena's verdict
    lenient = run(config, None, page=page, site_urls=sites, deviations=["url_slash"])
    assert lenient.score == 1.0


def test_unknown_deviation_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown evaluator deviation.*page_txt.*known: "):
        run(string_task(exact_match="x"), "x", deviations="page_txt")


def test_url_match_evaluator_with_placeholders() -> None:
    config = task(["url_match"], reference_url="__SHOPPING__/catalog?cat=3 |OR| __REDDIT__/f/x")
    page = SimpleNamespace(url="http://shop.test:7770/catalog?cat=3&sort=name")
    result = run(config, None, page=page)
    assert result.score == 1.0
    assert result.details[0]["reference"].startswith("http://shop.test:7770/catalog?cat=3")
    # As in WebArena, query parameters of all alternatives are required together.
    assert run(config, None, page=SimpleNamespace(url="http://forum.test:9999/f/x/")).score == 0.0
    either = task(["url_match"], reference_url="__SHOPPING__/catalog |OR| __REDDIT__/f/x")
    assert run(either, None, page=SimpleNamespace(url="http://forum.test:9999/f/x/")).score == 1.0
    assert run(config, None, page=SimpleNamespace(url="http://shop.test:7770/")).score == 0.0
    # Short site names are accepted too.
    short = {"shopping": "http://shop.test:7770", "reddit": "http://forum.test:9999"}
    assert run(config, None, page=page, site_urls=short).score == 1.0


def test_url_match_errors() -> None:
    config = task(["url_match"], reference_url="__GITLAB__/explore")
    with pytest.raises(ConfigError, match="__GITLAB__"):
        run(config, None, page=SimpleNamespace(url="http://x/"))
    with pytest.raises(EnvError):
        run(task(["url_match"], reference_url="http://x/"), None, page=None)


def test_scores_multiply() -> None:
    config = task(
        ["string_match", "url_match"],
        reference_answers={"exact_match": "yes"},
        reference_url="http://s/done",
    )
    assert run(config, "yes", page=SimpleNamespace(url="http://s/done")).score == 1.0
    result = run(config, "yes", page=SimpleNamespace(url="http://s/other"))
    assert result.score == 0.0 and [d["score"] for d in result.details] == [1.0, 0.0]
    assert not result.success


def test_placeholders_and_helpers_without_browser() -> None:
    assert fill_placeholders("__SHOPPING__/a", SITES) == "http://shop.test:7770/a"
    assert fill_placeholders("func:f('__last_url__')", SITES) == "func:f('__last_url__')"
    assert fill_placeholders("window.__NEXT_DATA__", SITES, strict=False) == "window.__NEXT_DATA__"
    assert reddit_get_post_url("http://r/f/books/12/some-title/comment/3") == "http://r/f/books/12/"
    assert reddit_get_post_url("http://r/user/x") == "http://r/user/x"
    assert call_helper("reddit_get_post_url('http://r/f/a/1/t')", page=None) == "http://r/f/a/1/"
    assert call_helper("shout(__page__, 'x')", page="P", helpers={"shout": lambda p, s: p + s}) == (
        "Px"
    )
    with pytest.raises(TaskError, match="unsupported evaluation helper 'shopping_get_latest"):
        call_helper("shopping_get_latest_order_url()", page=None)
    with pytest.raises(TaskError, match="literals"):
        call_helper("get_query_text(__import__('os'), 'x')", page=None)
    with pytest.raises(TaskError, match="function call"):
        call_helper("1 + 2", page=None)


# -- make_llm_judge ---------------------------------------------------------------------------


class FakeGateway:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.messages: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]]) -> Any:
        self.messages.append(messages)
        return SimpleNamespace(text=self.replies.pop(0))


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("The answer is correct.", 1.0),
        ("Correct", 1.0),
        ("incorrect", 0.0),
        ("It is partially correct.", 0.0),
        ("I cannot tell", 0.0),
    ],
)
def test_llm_judge_fuzzy(reply: str, score: float) -> None:
    gateway = FakeGateway([reply])
    judge = make_llm_judge(gateway)  # type: ignore[arg-type]
    assert judge("How much?", "$12.99", "12.99 dollars") == score
    (messages,) = gateway.messages
    assert messages[0] == {"role": "system", "content": "You are a helpful assistant"}
    user = messages[1]["content"]
    assert "question: How much?" in user and "reference answer: $12.99" in user
    assert "student answer: 12.99 dollars" in user
    assert user.endswith("Conclude the judgement by correct/incorrect/partially correct.")


def test_llm_judge_unachievable_through_evaluate_task() -> None:
    gateway = FakeGateway(["[same]", "[different]"])
    judge = make_llm_judge(gateway)  # type: ignore[arg-type]
    config = task(
        ["string_match"], reference_answers={"fuzzy_match": "N/A"}, string_note="no such item"
    )
    assert run(config, "there is no such item", judge=judge).score == 1.0
    # WebArena's current llm_ua_match prompt (libwebarena 0.0.5)
    user = gateway.messages[0][1]["content"]
    assert user.startswith("task: What is the price of the Acme Laptop?\n"
                           "actual unachievable reason: no such item\n"
                           "reported unachievable reason: there is no such item\n"
                           "The task described above is inherently unachievable")
    assert user.endswith("respond with 'same'. Otherwise, respond with 'different'.")
    assert run(config, "it costs $3", judge=judge).score == 0.0


# -- validate_config --------------------------------------------------------------------------


def _without(config: dict[str, Any], *path: str) -> dict[str, Any]:
    out = copy.deepcopy(config)
    target = out
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return out


GOOD = task(
    ["string_match", "url_match", "program_html"],
    reference_answers={"must_include": ["a"], "fuzzy_match": ["b"]},
    reference_url="__SHOPPING__/x",
    program_html=[
        {"url": "last", "locator": "", "required_contents": {"must_include": ["a"]}},
        {
            "url": "__SHOPPING__/y",
            "locator": "document.querySelector('.p').outerText",
            "required_contents": {"exact_match": "b"},
        },
    ],
)


def _set(path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(GOOD)
    keys = path.split(".")
    target: Any = out
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[keys[-1]] = value
    return out


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ([], "must be a JSON object"),
        (_without(GOOD, "intent"), "missing 'intent'"),
        (_set("intent", "  "), "missing 'intent'"),
        (_without(GOOD, "start_url"), "missing 'start_url'"),
        (_without(GOOD, "eval"), "missing 'eval'"),
        (_set("eval.eval_types", []), "non-empty list"),
        (_set("eval.eval_types", ["string_match", "page_image_query"]), "unknown eval type"),
        (_set("eval.reference_answers", None), "reference_answers"),
        (_set("eval.reference_answers", {"regex": "x"}), "unknown reference_answers key"),
        (_set("eval.reference_answers", {"must_include": 3}), "must_include must be a list"),
        (_set("eval.reference_answers", {"exact_match": ["a"]}), "exact_match must be a string"),
        (_set("eval.reference_answers", {"fuzzy_match": "maybe"}), "fuzzy_match must be"),
        (_set("eval.reference_answers", {"fuzzy_match": "N/A"}), "string_note"),
        (_set("eval.reference_url", ""), "reference_url"),
        (_set("eval.url_note", "EXACT"), "unknown url_note"),
        (_set("eval.program_html", []), "non-empty 'eval.program_html'"),
        (_set("eval.program_html.0.url", ""), "program_html[0] needs a 'url'"),
        (_set("eval.program_html.1.locator", None), "program_html[1] needs a 'locator'"),
        (_set("eval.program_html.1.locator", "$('.p')"), "locator must be"),
        (_set("eval.program_html.0.required_contents", {}), "required_contents"),
        (_set("eval.program_html.0.required_contents", {"regex": ["a"]}), "unknown"),
        (_set("eval.program_html.0.required_contents", {"must_include": "a"}), "list of strings"),
    ],
)
def test_validate_config_errors(config: Any, fragment: str) -> None:
    with pytest.raises(TaskError) as err:
        validate_config(config)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message
    if isinstance(config, dict) and "task_id" in config:
        assert message.startswith("task 7: ")


def test_validate_config_accepts_good_configs() -> None:
    """Every real WebArena task and every bundled task is accepted (an error would raise)."""
    import json
    from pathlib import Path

    assert validate_config(GOOD) is None
    na = task(["string_match"], reference_answers={"fuzzy_match": "N/A"}, string_note="why")
    assert validate_config(na) is None
    root = Path(__file__).resolve().parents[1]
    webarena = root.parent / "shared" / "data" / "webarena" / "test.raw.json"
    configs = json.loads(webarena.read_text()) if webarena.exists() else []
    for split in ("train", "validation", "test"):
        configs += json.loads((root / "tasks" / "webarena_shopping" / f"{split}.json").read_text())
    accepted = [c["task_id"] for c in configs if validate_config(c) is None]
    assert len(accepted) == len(configs) >= 609 + (812 if webarena.exists() else 0)


def test_unknown_eval_type_raises_task_error() -> None:
    with pytest.raises(TaskError, match="unknown eval type 'program_image'"):
        run(task(["program_image"]), "x")


# -- program_html on real pages ---------------------------------------------------------------

PAGES = {
    "product.html": """<!doctype html><html><head><title>Acme Laptop</title></head><body>
<h1 class="name">Acme Laptop</h1>
<p class="price">Price: <b>$12.99</b></p>
<p id="stock">In stock &amp; ready</p>
<input id="qty" value="2">
</body></html>""",
    "cart.html": """<!doctype html><html><head><title>Cart</title></head><body>
<table><tr><td class="item">Acme Laptop</td><td class="qty">2</td></tr></table>
</body></html>""",
    "f/books/12/index.html": """<!doctype html><html><head><title>Post</title></head><body>
<h1>Post 12</h1></body></html>""",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("evalsite")
    for name, body in PAGES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser_page(site: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    from dreamgym_agents.adapters.webarena.chromium import find_chromium, patch_playwright

    exe = find_chromium()
    if exe is None:
        pytest.fail("no Chromium found: install chromium or set DG_CHROMIUM")
    pw = sync_playwright().start()
    try:
        patch_playwright(pw, exe)
        browser = pw.chromium.launch(headless=True)
        page = browser.new_context().new_page()  # a context of its own, as an episode's
        yield page
        browser.close()
    finally:
        pw.stop()


@pytest.fixture()
def page(browser_page: Any, site: str) -> Any:
    browser_page.goto(f"{site}/product.html")
    return browser_page


def html_task(*targets: dict[str, Any]) -> dict[str, Any]:
    return task(["program_html"], program_html=list(targets))


def target(url: str, locator: str, **required: Any) -> dict[str, Any]:
    return {"url": url, "locator": locator, "required_contents": required}


@pytest.mark.browser
def test_html_last_page_full_content(page: Any, site: str) -> None:
    sites = {"__SITE__": site}
    ok = html_task(target("last", "", must_include=["Price: <b>$12.99", "in stock & ready"]))
    result = run(ok, None, page=page, site_urls=sites)
    assert result.score == 1.0, result.details
    assert page.url == f"{site}/product.html"  # "last" does not navigate
    # WebArena's empty locator is the HTML only: a phrase split by a tag is not in it; the
    # page_text deviation adds the visible text
    split = html_task(target("last", "", must_include=["Price: $12.99"]))
    assert run(split, None, page=page).score == 0.0
    assert run(split, None, page=page, deviations=["page_text"]).score == 1.0
    assert run(html_task(target("last", "", must_include=["$99.00"])), None, page=page).score == 0.0
    alt = html_task(target("last", "", must_include=["$99.00 |OR| $12.99"]))
    assert run(alt, None, page=page).score == 1.0
    excluded = html_task(target("last", "", must_exclude=["Out of stock"]))
    assert run(excluded, None, page=page).score == 1.0
    present = html_task(target("last", "", must_exclude=["Acme"]))
    assert run(present, None, page=page).score == 0.0


@pytest.mark.browser
def test_html_query_selector(page: Any) -> None:
    exact = html_task(
        target("last", "document.querySelector('.price').outerText", exact_match="price: $12.99")
    )
    assert run(exact, None, page=page).score == 1.0
    wrong = html_task(
        target("last", "document.querySelector('.price').outerText", exact_match="$12.99")
    )
    assert run(wrong, None, page=page).score == 0.0
    value = html_task(target("last", "document.querySelector('#qty').value", exact_match="2"))
    assert run(value, None, page=page).score == 1.0
    missing = html_task(
        target("last", "document.querySelector('.nope').outerText", must_include=["x"])
    )
    result = run(missing, None, page=page)
    assert result.score == 0.0 and result.details[0]["checks"][0]["selected"] == ""
    prep = {
        **target("last", "document.querySelector('#qty').value", exact_match="5"),
        "prep_actions": ["document.querySelector('#qty').value = '5'"],
    }
    assert run(html_task(prep), None, page=page).score == 1.0
    spread = html_task(
        target(
            "last",
            "[...document.querySelectorAll('p')].map(p => p.outerText).join(' / ')",
            must_include=["price: $12.99 / in stock"],
        )
    )
    assert run(spread, None, page=page).score == 1.0


@pytest.mark.browser
def test_html_navigates_to_target_urls(page: Any, site: str, monkeypatch: Any) -> None:
    import dreamgym_agents.adapters.webarena.evaluation as evaluation

    slept: list[float] = []
    monkeypatch.setattr(evaluation.time, "sleep", slept.append)
    sites = {"__SITE__": site}
    config = html_task(
        target("__SITE__/cart.html", "document.querySelector('.qty').outerText", exact_match="2"),
        target("last", "document.querySelector('h1').outerText", exact_match="acme laptop"),
    )
    result = run(config, None, page=page, site_urls=sites)
    assert result.score == 1.0, result.details
    # as WebArena: the target opens in a new page (then closed), waited on 3 s; "last" is the
    # page the episode ended on, which never moves
    assert page.url == f"{site}/product.html"
    assert len(page.context.pages) == 1
    assert slept == [3.0]
    assert result.details[0]["checks"][0]["url"] == f"{site}/cart.html"
    slept.clear()
    assert run(config, None, page=page, site_urls=sites, deviations=["load_wait"]).score == 1.0
    assert slept == []
    wrong = html_task(target("__SITE__/cart.html", "", must_include=["Zeta"]))
    assert run(wrong, None, page=page, site_urls=sites).score == 0.0
    unreachable = html_task(target("http://127.0.0.1:9/x", "", must_include=["x"]))
    with pytest.raises(EnvError, match="could not open"):
        run(unreachable, None, page=page)
    assert len(page.context.pages) == 1


@pytest.mark.browser
def test_html_func_helpers(page: Any, site: str) -> None:
    config = html_task(
        target("last", "func:get_query_text(__page__, '.name')", exact_match="acme laptop"),
        target("last", "func:get_query_text_lowercase(__page__, '.price')", must_include=["$12"]),
    )
    assert run(config, None, page=page).score == 1.0
    page.goto(f"{site}/f/books/12/comment/3")  # a 404 page: only its URL matters
    post = html_task(
        target("func:reddit_get_post_url('__last_url__')", "", must_include=["Post 12"])
    )
    result = run(post, None, page=page, deviations=["load_wait"])
    assert result.score == 1.0, result.details
    assert result.details[0]["checks"][0]["url"] == f"{site}/f/books/12/"
    assert page.url == f"{site}/f/books/12/comment/3"
    unsupported = html_task(
        target("last", "func:shopping_get_sku_latest_review_author('B01')", must_include=["x"])
    )
    with pytest.raises(TaskError, match="shopping_get_sku_latest_review_author"):
        run(unsupported, None, page=page)


@pytest.mark.browser
def test_url_match_uses_the_final_page_before_html_checks(page: Any, site: str) -> None:
    config = task(
        ["program_html", "url_match"],
        program_html=[target(f"{site}/cart.html", "", must_include=["Acme"])],
        reference_url=f"{site}/product.html",
    )
    result = run(config, None, page=page, deviations=["load_wait"])
    assert [d["type"] for d in result.details] == ["program_html", "url_match"]
    assert result.score == 1.0, result.details
