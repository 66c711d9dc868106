"""HTML building blocks shared by all pages: escaping, the page shell with its top navigation,
pagination, and the control-flow exceptions page functions raise (redirect, not found).

Pages are plain semantic HTML without JavaScript: every input has a ``<label>``, every button has
text, and link texts are unique on a page where tasks need them, because agents see the page
through Chromium's accessibility tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from urllib.parse import urlencode

from dreamgym_agents.adapters.shopping.data import SORTS, Product, format_money
from dreamgym_agents.adapters.shopping.store import Instance

SITE_NAME = "One Stop Market"
PAGE_SIZE = 12
"""Products per page on category and search listings."""

money = format_money

_STYLE = """
body{font-family:sans-serif;margin:0 auto;max-width:70em;padding:0 1em}
header nav ul{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.8em}
header form{display:inline}table{border-collapse:collapse}td,th{border:1px solid #ccc;
padding:.3em .6em;text-align:left}.message{background:#e6f4e6;padding:.5em}
.error{background:#fbe3e3;padding:.5em}label{display:block;margin-top:.4em}
"""


def esc(text: object) -> str:
    """Escape text for HTML content and attribute values."""
    return escape(str(text), quote=True)


class Redirect(Exception):
    """Raised by a page function to answer ``303 See Other`` to ``location`` (a path)."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class NotFound(Exception):
    """Raised by a page function when the requested object does not exist."""


@dataclass
class View:
    """What a page function needs: the instance and its URL prefix (``/i/<id>``)."""

    inst: Instance
    base: str

    def url(self, path: str = "/", **query: object) -> str:
        """Absolute path of a page of this instance, with the non-empty query parameters."""
        params = {k: v for k, v in query.items() if v not in (None, "")}
        suffix = f"?{urlencode(params)}" if params else ""
        return f"{self.base}{path}{suffix}"


def page(view: View, title: str, body: str, query: str = "") -> str:
    """Wrap ``body`` in the full page: head, top navigation, search box and flash message."""
    inst = view.inst
    categories = "".join(
        f'<li><a href="{esc(view.url(f"/category/{c.slug}"))}">{esc(c.name)}</a></li>'
        for c in inst.catalog.categories
    )
    if inst.account is None:
        sign = f'<li><a href="{esc(view.url("/login"))}">Sign In</a></li>'
    else:
        sign = (f'<li><form method="post" action="{esc(view.url("/logout"))}">'
                '<button type="submit">Sign Out</button></form></li>')
    message, error = inst.pop_flash()
    flash = ""
    if message:
        role, cls = ("alert", "error") if error else ("status", "message")
        flash = f'<p role="{role}" class="{cls}">{esc(message)}</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} | {SITE_NAME}</title>
<style>{_STYLE}</style></head>
<body><header><p><strong>{SITE_NAME}</strong></p>
<nav aria-label="Main"><ul><li><a href="{esc(view.url("/"))}">Home</a></li>{categories}
<li><a href="{esc(view.url("/cart"))}">My Cart ({inst.cart_count})</a></li>
<li><a href="{esc(view.url("/account"))}">My Account</a></li>{sign}</ul></nav>
<form role="search" method="get" action="{esc(view.url("/search"))}">
<label for="search-q" style="display:inline">Search</label>
<input type="search" id="search-q" name="q" value="{esc(query)}">
<button type="submit">Search</button></form></header>
<main>{flash}
{body}
</main></body></html>
"""


def product_list(view: View, products: list[Product]) -> str:
    """A list of product links (named by the full product name) with price and rating."""
    items = []
    for p in products:
        rating, count = view.inst.rating(p)
        rating_text = rating_line(rating, count)
        items.append(
            f'<li class="product-item" data-sku="{esc(p.sku)}">'
            f'<a href="{esc(view.url(f"/product/{p.sku}"))}">{esc(p.name)}</a>'
            f'<br><span class="price">{esc(money(p.price))}</span> · {esc(rating_text)}</li>'
        )
    if not items:
        return "<p>No products found.</p>"
    return f'<ul class="product-list">{"".join(items)}</ul>'


def rating_line(rating: str | None, count: int) -> str:
    """``"Rating: 4.3 out of 5 (12 reviews)"``, or ``"No reviews yet"``."""
    if rating is None:
        return "No reviews yet"
    noun = "review" if count == 1 else "reviews"
    return f"Rating: {rating} out of 5 ({count} {noun})"


def paginate(total: int, page_no: int, size: int) -> tuple[int, int, slice]:
    """Clamp a 1-based page number; return (page, page count, slice of the items)."""
    pages = max(1, math.ceil(total / size))
    page_no = min(max(1, page_no), pages)
    return page_no, pages, slice((page_no - 1) * size, page_no * size)


def pager(view: View, path: str, page_no: int, pages: int, **query: object) -> str:
    """"Page N of M" with "Previous page" / "Next page" links that keep ``query``."""
    links = []
    if page_no > 1:
        prev_url = view.url(path, **query, page=page_no - 1 if page_no > 2 else None)
        links.append(f'<a href="{esc(prev_url)}" rel="prev">Previous page</a>')
    links.append(f"<span>Page {page_no} of {pages}</span>")
    if page_no < pages:
        links.append(f'<a href="{esc(view.url(path, **query, page=page_no + 1))}" '
                     f'rel="next">Next page</a>')
    return f'<nav aria-label="Pagination" class="pager">{" ".join(links)}</nav>'


def sort_form(view: View, path: str, current: str) -> str:
    """The GET form with the "Sort by" select and the "Apply" button."""
    options = "".join(
        f'<option value="{key}"{" selected" if key == current else ""}>{esc(label)}</option>'
        for key, label in SORTS.items()
    )
    return (f'<form method="get" action="{esc(view.url(path))}" class="sort">'
            f'<label for="sort" style="display:inline">Sort by</label> '
            f'<select id="sort" name="sort">{options}</select> '
            f'<button type="submit">Apply</button></form>')
