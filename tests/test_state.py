"""Tests of the abstract state mapper: hand-made trees, render/parse, and real BrowserGym pages."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dreamgym_agents.adapters.webarena.axtree import map_axtree, map_observation
from dreamgym_agents.adapters.webarena.state import (
    AbstractState,
    Element,
    parse_line,
    parse_state,
)

# --------------------------------------------------------------------------------------------
# Hand-made accessibility trees (the shape of BrowserGym's merged CDP tree)
# --------------------------------------------------------------------------------------------


class Tree:
    """Builds a ``{"nodes": [...]}`` tree like ``obs["axtree_object"]``."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.root = self.add(None, "RootWebArea", "Page")

    def add(
        self,
        parent: dict[str, Any] | None,
        role: str,
        name: str | None = None,
        *,
        bid: str | None = None,
        value: str | None = None,
        ignored: bool = False,
        **props: Any,
    ) -> dict[str, Any]:
        node: dict[str, Any] = {
            "nodeId": str(len(self.nodes) + 1),
            "ignored": ignored,
            "role": {"type": "role", "value": role},
            "childIds": [],
            "properties": [
                {"name": k, "value": {"type": "booleanOrUndefined", "value": v}}
                for k, v in props.items()
            ],
        }
        if name is not None:
            node["name"] = {"type": "computedString", "value": name}
        if value is not None:
            node["value"] = {"type": "string", "value": value}
        if bid is not None:
            node["browsergym_id"] = bid
        if parent is not None:
            parent["childIds"].append(node["nodeId"])
            node["parentId"] = parent["nodeId"]
        self.nodes.append(node)
        return node

    def text(self, parent: dict[str, Any], text: str) -> dict[str, Any]:
        node = self.add(parent, "StaticText", text)
        self.add(node, "InlineTextBox", text)
        return node

    @property
    def obj(self) -> dict[str, Any]:
        return {"nodes": self.nodes}


def shop_tree() -> Tree:
    t = Tree()
    body = t.add(t.root, "generic", "", bid="3")
    nav = t.add(body, "navigation", "", bid="4")
    link = t.add(nav, "link", "Laptops", bid="12")
    t.text(link, "Laptops")
    t.text(nav, " ")
    t.add(nav, "link", "Hidden", bid="13")
    t.add(body, "heading", "Acme Laptop", bid="20", level=1)
    para = t.add(body, "paragraph", "", bid="21")
    t.text(para, "Price: ")
    bold = t.add(para, "generic", "", bid="22")
    t.text(bold, "$12.99")
    label = t.add(body, "LabelText", "", bid="14")
    t.text(label, "Search")
    box = t.add(body, "textbox", "Search", bid="15", value="usb", focusable=True)
    t.text(box, "usb")
    sort_label = t.add(body, "LabelText", "", bid="19")
    t.text(sort_label, "Sort by ")
    combo = t.add(sort_label, "combobox", "Sort by", bid="20b", value="Name", expanded=False)
    popup = t.add(combo, "MenuListPopup", "")
    ignored = t.add(popup, "none", ignored=True)
    for i, opt in enumerate(["Name", "Price: Low to High", "Price | High"]):
        t.add(ignored, "option", opt, bid=f"o{i}", selected=(i == 0))
    t.add(body, "checkbox", "Remember me", bid="30", checked="true")
    t.text(body, "Remember me")
    t.add(body, "button", "Add to Cart", bid="31", disabled=True)
    t.text(body, "Price: $12.99")  # repeated text is dropped
    return t


def test_map_hand_made_tree() -> None:
    extra = {"13": {"visibility": 0.0, "bbox": None, "clickable": True}}
    state = map_axtree(
        shop_tree().obj, url="http://shop/p/1", title="  Acme\nShop ", extra_properties=extra
    )
    assert state.render().splitlines() == [
        "URL: http://shop/p/1",
        "Title: Acme Shop",
        "[12] link 'Laptops'",
        "heading 'Acme Laptop'",
        "StaticText 'Price: $12.99'",
        "[15] textbox 'Search' value='usb'",
        "[20b] combobox 'Sort by' value='Name' options='Name|Price: Low to High|Price \\| High'",
        "[30] checkbox 'Remember me' checked",
        "[31] button 'Add to Cart' disabled",
    ]
    assert [e.bid for e in state.elements] == ["12", "15", "20b", "30", "31"]
    combo = state.find("combobox", "Sort by")
    assert combo is not None and combo.options[-1] == "Price | High"


def test_offscreen_kept_zero_size_dropped_viewport_only() -> None:
    t = Tree()
    t.add(t.root, "link", "Below the fold", bid="1")
    t.add(t.root, "link", "Skip link", bid="2")
    t.add(t.root, "button", "Zero", bid="3")
    t.add(t.root, "button", "No props", bid="4")
    extra = {
        "1": {"visibility": 0.0, "bbox": [8.0, 3000.0, 80.0, 17.0]},
        "2": {"visibility": 0.0, "bbox": [-9999.0, 10.0, 40.0, 17.0]},
        "3": {"visibility": 0.0, "bbox": [10.0, 10.0, 0.0, 0.0]},
    }
    state = map_axtree(t.obj, url="u", title="t", extra_properties=extra)
    assert [e.name for e in state.lines] == ["Below the fold", "No props"]
    state = map_axtree(t.obj, url="u", title="t", extra_properties=extra, viewport_only=True)
    assert [e.name for e in state.lines] == ["No props"]


def test_text_rules() -> None:
    t = Tree()
    main = t.add(t.root, "main", "")
    link = t.add(main, "link", "Read more about it", bid="5")
    t.text(link, "Read more")  # part of the link: not a text line
    t.text(main, "   ")
    t.text(main, "Line   one\n spread")
    t.add(main, "LineBreak", "\n")
    t.text(main, "after break")
    table = t.add(main, "table", "")
    for cells in (["Name", "Qty"], ["Cable", "3"]):
        row = t.add(table, "row", "")
        for c in cells:
            cell = t.add(row, "cell", c)
            t.text(cell, c)
    items = t.add(main, "list", "")
    for word in ["alpha", "beta", "alpha"]:
        li = t.add(items, "listitem", "")
        t.add(li, "ListMarker", "• ")
        t.text(li, word)
    t.add(main, "image", "Logo")
    t.add(main, "heading", "")  # empty heading: no line
    state = map_axtree(t.obj, url="u", title="t")
    assert [e.line() for e in state.lines] == [
        "[5] link 'Read more about it'",
        "StaticText 'Line one spread'",
        "StaticText 'after break'",
        "StaticText 'Name | Qty'",
        "StaticText 'Cable | 3'",
        "StaticText 'alpha'",
        "StaticText 'beta'",
        "image 'Logo'",
    ]
    capped = map_axtree(t.obj, url="u", title="t", max_text_lines=2)
    assert [e.role for e in capped.lines].count("StaticText") == 2


def test_long_names_truncated_and_quotes_escaped() -> None:
    t = Tree()
    t.add(t.root, "link", "x" * 300, bid="1")
    t.add(t.root, "button", "It's a \\ test", bid="2")
    state = map_axtree(t.obj, url="u", title="t")
    first = state.lines[0]
    assert len(first.name) == 120 and first.name.endswith("…")
    assert state.lines[1].line() == "[2] button 'It\\'s a \\\\ test'"
    assert parse_state(state.render()) == state


def test_listbox_options_are_separate_lines() -> None:
    t = Tree()
    box = t.add(t.root, "listbox", "Colors", bid="23", multiselectable=True)
    t.add(box, "option", "Red", bid="24", selected=False)
    t.add(box, "option", "Blue", bid="25", selected=True)
    open_combo = t.add(t.root, "combobox", "City", bid="26", value="", expanded=True)
    t.add(open_combo, "option", "Paris", bid="27")
    state = map_axtree(t.obj, url="u", title="t")
    assert [e.line() for e in state.lines] == [
        "[23] listbox 'Colors'",
        "[24] option 'Red'",
        "[25] option 'Blue' selected",
        "[26] combobox 'City'",
        "[27] option 'Paris'",
    ]


def test_many_options_are_capped() -> None:
    t = Tree()
    combo = t.add(t.root, "combobox", "N", bid="1", value="o0", expanded=False)
    for i in range(30):
        t.add(combo, "option", f"o{i}", bid=f"x{i}")
    (line,) = map_axtree(t.obj, url="u", title="t", max_options=3).lines
    assert line.options == ("o0", "o1", "o2", "+27 more")


def test_empty_tree() -> None:
    state = map_axtree({"nodes": []}, url="about:blank", title="")
    assert state.lines == [] and state.render() == "URL: about:blank\nTitle: "
    assert parse_state(state.render()) == state


# --------------------------------------------------------------------------------------------
# Rendering and parsing
# --------------------------------------------------------------------------------------------


def sample_state() -> AbstractState:
    return AbstractState(
        url="http://127.0.0.1:8000/search?q=usb",
        title="Search results",
        lines=[
            Element("12", "link", "Laptops"),
            Element(None, "heading", "Acme Laptop"),
            Element(None, "StaticText", "Price: $12.99"),
            Element("15", "textbox", "Search", value="usb 'cable'"),
            Element(
                "20", "combobox", "Sort by", value="Name", options=("Name", "A|B", "C\\D", "it's")
            ),
            Element("22", "checkbox", "Remember me", flags=("checked", "disabled")),
            Element("a3", "button", ""),
            Element(None, "image", "Logo [new]"),
            Element(None, "StaticText", "ünïcödé — 😀"),
        ],
    )


def test_line_formats() -> None:
    s = sample_state()
    assert s.lines[0].line() == "[12] link 'Laptops'"
    assert s.lines[1].line() == "heading 'Acme Laptop'"
    assert s.lines[2].line() == "StaticText 'Price: $12.99'"
    assert s.lines[3].line() == "[15] textbox 'Search' value='usb \\'cable\\''"
    assert s.lines[5].line() == "[22] checkbox 'Remember me' checked disabled"
    rendered = s.render().splitlines()
    assert rendered[:2] == ["URL: http://127.0.0.1:8000/search?q=usb", "Title: Search results"]
    assert len(rendered) == 2 + len(s.lines)


def test_round_trip() -> None:
    s = sample_state()
    assert parse_state(s.render()) == s
    assert parse_state(parse_state(s.render()).render()).render() == s.render()


def test_parse_is_tolerant() -> None:
    text = "\n".join(
        [
            "URL: http://x/",
            "Title: T",
            "",
            "[5] link 'Home'",
            "Some free text the model wrote",
            "[7] button 'Buy' weird=attr",
            "[8] button 'Unclosed",
        ]
    )
    s = parse_state(text)
    assert s.url == "http://x/" and s.title == "T"
    assert s.lines[0] == Element("5", "link", "Home")
    assert s.lines[1] == Element(None, "StaticText", "Some free text the model wrote")
    assert s.lines[2].role == "StaticText" and s.lines[3].role == "StaticText"
    assert [e.bid for e in s.elements] == ["5"]
    no_header = parse_state("[1] link 'A'")
    assert no_header.url == "" and no_header.lines == [Element("1", "link", "A")]
    assert parse_line("[9] tab 'Reviews' selected") == Element(
        "9", "tab", "Reviews", flags=("selected",)
    )


def test_elements_and_find() -> None:
    s = sample_state()
    assert [e.bid for e in s.elements] == ["12", "15", "20", "22", "a3"]
    assert s.find("link", "Laptops") == Element("12", "link", "Laptops")
    assert s.find("LINK", " Laptops ") is not None
    assert s.find("link", "laptop") is None
    assert s.find("link", "laptop", match="contains") is not None
    assert s.find(None, "Acme Laptop") == Element(None, "heading", "Acme Laptop")
    assert s.find("button", "nothing") is None
    with pytest.raises(ValueError):
        s.find("link", "x", match="fuzzy")  # type: ignore[arg-type]
    dup = AbstractState("u", "t", [Element(None, "link", "Go"), Element("9", "link", "Go")])
    assert dup.find("link", "Go") == Element("9", "link", "Go")


# --------------------------------------------------------------------------------------------
# Real pages through BrowserGym
# --------------------------------------------------------------------------------------------

PAGES = {
    "index.html": """<!doctype html><html><head><title>Acme Shop</title></head><body>
<nav><a href="/laptops.html">Laptops</a> <a href="/phones.html">Phones</a>
<a href="/x" style="display:none">Hidden link</a></nav>
<h1>Acme Laptop</h1>
<p>Price: <b>$12.99</b></p>
<p>Great   laptop
 for 'work' and play.</p>
<form><label for="q">Search</label><input id="q" name="q" value="usb">
<button type="submit">Go</button></form>
<label>Sort by <select name="sort"><option>Name</option><option>Price: Low to High</option>
<option selected>Price: High to Low</option></select></label>
<label><input type="checkbox" checked> Remember me</label>
<table><tr><th>Name</th><th>Qty</th></tr><tr><td>Cable</td><td>3</td></tr></table>
<div style="height:2500px"></div>
<a href="/bottom.html">Bottom link</a>
<iframe srcdoc="<button>Inside frame</button>"></iframe>
</body></html>""",
    "laptops.html": """<!doctype html><html><head><title>Laptops</title></head><body>
<h1>All laptops</h1><ul><li>Acme Laptop</li><li>Zeta Book</li></ul></body></html>""",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("site")
    for name, body in PAGES.items():
        (root / name).write_text(body, encoding="utf-8")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _make_env(url: str) -> Any:
    from browsergym.core.env import BrowserEnv
    from browsergym.core.task import AbstractBrowserTask

    class StaticPageTask(AbstractBrowserTask):
        """Opens one page; never done."""

        @classmethod
        def get_task_id(cls) -> str:
            return "dg-static-page"

        def __init__(self, seed: int, url: str) -> None:
            super().__init__(seed)
            self.url = url

        def setup(self, page: Any) -> tuple[str, dict]:
            page.goto(self.url)
            return "look at the page", {}

        def validate(self, page: Any, chat_messages: list) -> tuple[float, bool, str, dict]:
            return 0.0, False, "", {}

    return BrowserEnv(
        task_entrypoint=StaticPageTask,
        task_kwargs={"url": url},
        headless=True,
        slow_mo=0,
        pre_observation_delay=0,
        action_mapping=None,  # steps receive WebActionSet.to_python code
    )


@pytest.fixture(scope="module")
def browser_env(site: str) -> Iterator[Any]:
    from dreamgym_agents.adapters.webarena.chromium import (
        find_chromium,
        patch_browsergym_launch,
        stop_thread_playwright,
    )

    exe = find_chromium()
    if exe is None:
        pytest.fail("no Chromium found: install chromium or set DG_CHROMIUM")
    patch_browsergym_launch(exe)
    env = _make_env(f"{site}/index.html")
    try:
        yield env
    finally:
        env.close()
        stop_thread_playwright()


@pytest.mark.browser
def test_real_page_state(browser_env: Any, site: str) -> None:
    obs, _info = browser_env.reset()
    state = map_observation(obs)
    lines = state.render().splitlines()
    assert lines[0] == f"URL: {site}/index.html"
    assert lines[1] == "Title: Acme Shop"
    body = lines[2:]
    assert body[0].endswith("link 'Laptops'") and body[0].startswith("[")
    assert "heading 'Acme Laptop'" in body
    assert "StaticText 'Price: $12.99'" in body
    assert "StaticText 'Great laptop for \\'work\\' and play.'" in body
    assert "StaticText 'Name | Qty'" in body and "StaticText 'Cable | 3'" in body
    assert not any("Hidden link" in line for line in body)
    assert not any(line == "StaticText 'Search'" for line in body)  # label of the textbox
    textbox = state.find("textbox", "Search")
    assert textbox is not None and textbox.value == "usb"
    combo = state.find("combobox", "Sort by")
    assert combo is not None
    assert combo.value == "Price: High to Low"
    assert combo.options == ("Name", "Price: Low to High", "Price: High to Low")
    checkbox = state.find("checkbox", "Remember me")
    assert checkbox is not None and checkbox.flags == ("checked",)
    assert state.find("link", "Bottom link") is not None  # below the fold, still listed
    assert state.find("button", "Inside frame") is not None  # iframe content
    assert parse_state(state.render()) == state
    # Every listed element is a real BrowserGym id.
    assert all(e.bid in obs["extra_element_properties"] for e in state.elements)


@pytest.mark.browser
def test_bids_drive_the_page(browser_env: Any, site: str) -> None:
    from dreamgym_agents.adapters.webarena.actions import WebActionSet

    actions = WebActionSet()
    obs, _ = browser_env.reset()
    state = map_observation(obs)
    textbox = state.find("textbox", "Search")
    assert textbox is not None
    code = actions.to_python(actions.parse(f"fill('{textbox.bid}', \"cable 'x'\")"))
    obs, *_ = browser_env.step(code)
    assert obs["last_action_error"] == ""
    textbox = map_observation(obs).find("textbox", "Search")
    assert textbox is not None and textbox.value == "cable 'x'"
    link = map_observation(obs).find("link", "Laptops")
    assert link is not None
    obs, *_ = browser_env.step(actions.to_python(actions.parse(f"click [{link.bid}]")))
    state = map_observation(obs)
    assert state.url == f"{site}/laptops.html" and state.title == "Laptops"
    assert "StaticText 'Zeta Book'" in state.render().splitlines()


@pytest.mark.browser
def test_envs_in_threads(browser_env: Any, site: str) -> None:
    """Each thread gets its own patched Playwright (sync Playwright is thread-bound)."""
    from dreamgym_agents.adapters.webarena.chromium import stop_thread_playwright

    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            env = _make_env(f"{site}/laptops.html")
            try:
                obs, _ = env.reset()
                results[i] = map_observation(obs).title
            finally:
                env.close()
                stop_thread_playwright()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    assert results == {0: "Laptops", 1: "Laptops"}
