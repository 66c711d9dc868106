"""Building blocks of the task generator: templates, drafts, oracle steps and oracle routes.

Oracle step language, played by the oracle agent and by ``oraclecheck``. ``role`` + ``name``
name the element currently on the page, by an exact accessible-name match unless
``"match": "contains"``::

    {"op": "click", "role": "link", "name": "Laptops"}
    {"op": "fill", "role": "searchbox", "name": "Search", "text": "usb cable"}
    {"op": "press", "role": "searchbox", "name": "Search", "key": "Enter"}
    {"op": "select", "role": "combobox", "name": "Sort by", "option": "Price: Low to High"}
    {"op": "goto", "url": "__SHOPPING__/account/orders"}
    {"op": "stop", "answer": "$12.99"}
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from dreamgym_agents.adapters.shopping.account_pages import ORDERS_PER_PAGE
from dreamgym_agents.adapters.shopping.data import (
    Catalog,
    Order,
    Product,
    rating_summary,
    sort_products,
)
from dreamgym_agents.adapters.shopping.layout import PAGE_SIZE

SITE = "__SHOPPING__"
Step = dict[str, Any]
Kind = Literal["info", "navigation", "action"]


@dataclass
class Draft:
    """One instantiation of a template, before ids and the split are assigned.

    Attributes:
        values: The ``instantiation_dict`` (placeholder -> text).
        oracle: Steps that solve the task, ending with ``stop``.
        start_path: Appended to ``__SHOPPING__`` to form ``start_url``.
        require_login: Whether the episode starts signed in as the primary customer.
        answers: ``reference_answers`` for ``string_match`` (None when not graded by answer).
        reference_url: For ``url_match`` (empty when not graded by URL).
        program_html: Targets for ``program_html``.
        raw: ``reference_answer_raw_annotation``.
    """

    values: dict[str, str]
    oracle: list[Step]
    start_path: str = ""
    require_login: bool = False
    answers: dict[str, Any] | None = None
    reference_url: str = ""
    program_html: list[dict[str, Any]] = field(default_factory=list)
    raw: str = ""


@dataclass(frozen=True)
class Template:
    """An intent template and the function that instantiates it from the catalog.

    ``build(catalog, rng)`` returns the drafts in a deterministic order given ``rng``.
    """

    template_id: int
    name: str
    kind: Kind
    intent_template: str
    build: Callable[[Catalog, random.Random], list[Draft]]


# ---- steps -------------------------------------------------------------------------------------
def click(role: str, name: str, contains: bool = False) -> Step:
    step: Step = {"op": "click", "role": role, "name": name}
    if contains:
        step["match"] = "contains"
    return step


def fill(role: str, name: str, text: str) -> Step:
    return {"op": "fill", "role": role, "name": name, "text": text}


def press(role: str, name: str, key: str) -> Step:
    return {"op": "press", "role": role, "name": name, "key": key}


def select(role: str, name: str, option: str) -> Step:
    return {"op": "select", "role": role, "name": name, "option": option}


def goto(path: str) -> Step:
    return {"op": "goto", "url": f"{SITE}{path}"}


def stop(answer: str) -> Step:
    return {"op": "stop", "answer": answer}


# ---- routes (what a user clicks to reach a page) -----------------------------------------------
def search_for(query: str, enter: bool = True) -> list[Step]:
    """Type ``query`` in the header search box; submit with Enter or the "Search" button."""
    submit = press("searchbox", "Search", "Enter") if enter else click("button", "Search")
    return [fill("searchbox", "Search", query), submit]


def via_search(product: Product, enter: bool = False) -> list[Step]:
    """Search the product's full name and open it from the results."""
    return [*search_for(product.name, enter), click("link", product.name)]


def via_category(catalog: Catalog, product: Product) -> list[Step]:
    """Open the product's category, page forward to it (name order) and open it."""
    listing = sort_products(catalog.in_category(product.category), "name",
                            lambda p: rating_summary(p.reviews)[0])
    pages = listing.index(product) // PAGE_SIZE
    category = catalog.category(product.category)
    assert category is not None
    return [click("link", category.name), *[click("link", "Next page")] * pages,
            click("link", product.name)]


def to_product(catalog: Catalog, product: Product, index: int) -> list[Step]:
    """Rotate by ``index``: search + Enter, category pages, search + "Search" button."""
    if index % 3 == 1:
        return via_category(catalog, product)
    return via_search(product, enter=index % 3 == 0)


def orders_newest_first(catalog: Catalog) -> list[Order]:
    """The primary customer's orders as the order history lists them."""
    return sorted(catalog.accounts[0].orders, key=lambda o: (o.date, o.order_id), reverse=True)


def to_order_pages(page_count: int) -> list[Step]:
    """My Account -> My Orders, then ``page_count - 1`` times "Next page"."""
    return [click("link", "My Account"), click("link", "My Orders"),
            *[click("link", "Next page")] * (page_count - 1)]


def to_order(catalog: Catalog, order: Order) -> list[Step]:
    """Open an order's detail page from the paginated order history."""
    index = orders_newest_first(catalog).index(order)
    return [*to_order_pages(index // ORDERS_PER_PAGE + 1),
            click("link", f"View Order #{order.order_id}")]


def to_cart() -> list[Step]:
    return [click("link", "My Cart", contains=True)]


# ---- program_html targets ----------------------------------------------------------------------
def target(path: str, locator: str, *, must_include: list[str] | None = None,
           exact_match: str | None = None) -> dict[str, Any]:
    """A program_html target on ``__SHOPPING__<path>`` (or ``"last"``)."""
    required: dict[str, Any] = (
        {"must_include": must_include} if must_include is not None
        else {"exact_match": exact_match}
    )
    url = path if path == "last" else f"{SITE}{path}"
    return {"url": url, "locator": locator, "required_contents": required}


def text_of(selector: str) -> str:
    """Locator: the ``outerText`` of the first element matching ``selector``."""
    return f"document.querySelector('{selector}').outerText"


def count_of(selector: str) -> str:
    """Locator: how many elements match ``selector`` (a number, compared as text)."""
    return f"document.querySelectorAll('{selector}').length"


def pick(rng: random.Random, items: list[Any], count: int) -> list[Any]:
    """``count`` distinct items in random order (all of them when fewer)."""
    return rng.sample(items, min(count, len(items)))
