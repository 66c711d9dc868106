"""Task templates about the catalog: product facts, category extremes, search, navigation."""

from __future__ import annotations

import random
from urllib.parse import urlencode

from dreamgym_agents.adapters.shopping.data import (
    SORTS,
    Catalog,
    Product,
    format_money,
    rating_summary,
    sort_products,
)
from dreamgym_agents.adapters.shopping.layout import PAGE_SIZE
from dreamgym_agents.adapters.shopping.taskkit import (
    Draft,
    Template,
    click,
    pick,
    search_for,
    select,
    stop,
    to_product,
)
from dreamgym_agents.adapters.shopping.vocab import CATEGORY_SPECS

SEARCH_TERMS = [
    "wireless", "earbuds", "laptop", "gaming", "usb-c", "hdmi", "cable", "stainless steel",
    "air fryer", "coffee", "desk", "chair", "lamp", "wool", "jacket", "tent", "backpack",
    "sunscreen", "lavender", "shampoo", "navy", "silver", "fingerprint reader", "fast charging",
    "lumbar support", "dishwasher-safe", "waterproof", "vegan", "32GB RAM", "1TB SSD", "10 ft",
    "rose gold", "noise cancelling", "kettle", "blender", "sleeping bag", "hoodie", "t-shirt",
    "bookshelf", "braided", "lifetime", "merino", "coconut", "aluminum", "bluetooth",
]
SORT_PHRASES = {"price_asc": "price, lowest first", "price_desc": "price, highest first",
                "rating": "customer rating, best first"}
EXTREMES = {"cheapest": "price_asc", "most expensive": "price_desc"}


def _rating(p: Product) -> str | None:
    return rating_summary(p.reviews)[0]


def _search_terms(catalog: Catalog) -> list[str]:
    brands = sorted({b for spec in CATEGORY_SPECS for b in spec["brands"]})
    return [t for t in SEARCH_TERMS + brands if catalog.search(t)]


def product_price(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for i, p in enumerate(pick(rng, list(catalog.products), 30)):
        price = format_money(p.price)
        drafts.append(Draft({"product": p.name},
                            [*to_product(catalog, p, i), stop(price)],
                            answers={"exact_match": price}, raw=price))
    return drafts


def product_rating(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    rated = [p for p in catalog.products if p.reviews]
    for i, p in enumerate(pick(rng, rated, 25)):
        rating, _ = rating_summary(p.reviews)
        drafts.append(Draft({"product": p.name}, [*to_product(catalog, p, i), stop(rating)],
                            answers={"must_include": [rating]}, raw=f"{rating} out of 5"))
    return drafts


def review_count(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for i, p in enumerate(pick(rng, list(catalog.products), 25)):
        count = str(len(p.reviews))
        drafts.append(Draft({"product": p.name}, [*to_product(catalog, p, i), stop(count)],
                            answers={"exact_match": count}, raw=count))
    return drafts


def product_attribute(catalog: Catalog, rng: random.Random) -> list[Draft]:
    table_attrs = {s["slug"]: list(s["table_attrs"]) for s in CATEGORY_SPECS}
    drafts = []
    for i, p in enumerate(pick(rng, list(catalog.products), 30)):
        attribute = rng.choice(table_attrs[p.category])
        value = p.attribute(attribute) or ""
        drafts.append(Draft({"attribute": attribute.lower(), "product": p.name},
                            [*to_product(catalog, p, i), stop(value)],
                            answers={"exact_match": value}, raw=value))
    return drafts


def _extreme_drafts(catalog: Catalog, answer_price: bool) -> list[Draft]:
    drafts = []
    for category in catalog.categories:
        for extreme, sort in EXTREMES.items():
            best = sort_products(catalog.in_category(category.slug), sort, _rating)[0]
            answer = format_money(best.price) if answer_price else best.name
            steps = [select("combobox", "Sort by", SORTS[sort]), click("button", "Apply"),
                     stop(answer)]
            if answer_price:
                start = f"/category/{category.slug}"
                answers = {"exact_match": answer}
            else:
                start, steps = "", [click("link", category.name), *steps]
                answers = {"must_include": [answer]}
            drafts.append(Draft({"extreme": extreme, "category": category.name}, steps,
                                start_path=start, answers=answers, raw=answer))
    return drafts


def category_extreme(catalog: Catalog, rng: random.Random) -> list[Draft]:
    return _extreme_drafts(catalog, answer_price=False)


def category_extreme_price(catalog: Catalog, rng: random.Random) -> list[Draft]:
    return _extreme_drafts(catalog, answer_price=True)


def search_count(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for i, term in enumerate(pick(rng, _search_terms(catalog), 25)):
        count = str(len(catalog.search(term)))
        drafts.append(Draft({"query": term}, [*search_for(term, i % 2 == 0), stop(count)],
                            answers={"exact_match": count}, raw=count))
    return drafts


def latest_review_author(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    rated = [p for p in catalog.products if p.reviews]
    for i, p in enumerate(pick(rng, rated, 20)):
        author = p.reviews[0].author  # reviews are stored newest first
        drafts.append(Draft({"product": p.name}, [*to_product(catalog, p, i), stop(author)],
                            answers={"must_include": [author]}, raw=author))
    return drafts


# ---- navigation (url_match) ----------------------------------------------------------------
def open_product(catalog: Catalog, rng: random.Random) -> list[Draft]:
    return [
        Draft({"product": p.name}, [*to_product(catalog, p, i), stop("done")],
              reference_url=f"__SHOPPING__/product/{p.sku}", raw=f"/product/{p.sku}")
        for i, p in enumerate(pick(rng, list(catalog.products), 20))
    ]


def sorted_category(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for category in catalog.categories:
        for sort, phrase in SORT_PHRASES.items():
            path = f"/category/{category.slug}?{urlencode({'sort': sort})}"
            drafts.append(Draft(
                {"category": category.name, "order": phrase},
                [click("link", category.name), select("combobox", "Sort by", SORTS[sort]),
                 click("button", "Apply"), stop("done")],
                reference_url=f"__SHOPPING__{path}", raw=path))
    return drafts


def search_page(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for i, term in enumerate(pick(rng, _search_terms(catalog), 20)):
        path = f"/search?{urlencode({'q': term})}"
        drafts.append(Draft({"query": term}, [*search_for(term, i % 2 == 0), stop("done")],
                            reference_url=f"__SHOPPING__{path}", raw=path))
    return drafts


def category_page(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for category in catalog.categories:
        pages = -(-len(catalog.in_category(category.slug)) // PAGE_SIZE)
        for page_no in range(2, min(pages, 3) + 1):
            path = f"/category/{category.slug}?page={page_no}"
            drafts.append(Draft(
                {"page": str(page_no), "category": category.name},
                [click("link", category.name), *[click("link", "Next page")] * (page_no - 1),
                 stop("done")],
                reference_url=f"__SHOPPING__{path}", raw=path))
    return drafts


TEMPLATES: list[Template] = [
    Template(1, "product_price", "info", "What is the price of {{product}}?", product_price),
    Template(2, "product_rating", "info",
             "What is the average customer rating of {{product}}?", product_rating),
    Template(3, "review_count", "info",
             "How many customer reviews does {{product}} have? Answer with a number.",
             review_count),
    Template(4, "product_attribute", "info", "What is the {{attribute}} of {{product}}?",
             product_attribute),
    Template(5, "category_extreme", "info",
             "What is the {{extreme}} product in the {{category}} category?", category_extreme),
    Template(6, "category_extreme_price", "info",
             "How much does the {{extreme}} product in the {{category}} category cost?",
             category_extreme_price),
    Template(7, "search_count", "info",
             "How many results does a search for '{{query}}' return? Answer with a number.",
             search_count),
    Template(8, "latest_review_author", "info",
             "Who wrote the most recent review of {{product}}?", latest_review_author),
    Template(20, "open_product", "navigation", "Open the product page of {{product}}.",
             open_product),
    Template(21, "sorted_category", "navigation",
             "Show the {{category}} category sorted by {{order}}.", sorted_category),
    Template(22, "search_page", "navigation", "Search the store for '{{query}}'.", search_page),
    Template(23, "category_page", "navigation",
             "Go to page {{page}} of the {{category}} category listing.", category_page),
]
