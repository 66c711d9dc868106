"""Catalog pages: home, category listing, search results, product page (with its two forms).

GET handlers return the page HTML; POST handlers change the instance and raise
:class:`~dreamgym_agents.adapters.shopping.layout.Redirect` (POST + redirect everywhere).
"""

from __future__ import annotations

from dreamgym_agents.adapters.shopping.data import SORTS, format_date, sort_products
from dreamgym_agents.adapters.shopping.layout import (
    PAGE_SIZE,
    SITE_NAME,
    NotFound,
    Redirect,
    View,
    esc,
    money,
    page,
    pager,
    paginate,
    product_list,
    rating_line,
    sort_form,
)

Query = dict[str, str]
RATING_OPTIONS = {5: "5 stars", 4: "4 stars", 3: "3 stars", 2: "2 stars", 1: "1 star"}


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def home(view: View, query: Query) -> str:
    """Home page: categories with their product counts, featured products, search box."""
    catalog = view.inst.catalog
    cats = "".join(
        f'<li><a href="{esc(view.url(f"/category/{c.slug}"))}">{esc(c.name)} '
        f'({len(catalog.in_category(c.slug))} products)</a></li>'
        for c in catalog.categories
    )
    featured = product_list(view, [catalog.by_sku[s] for s in catalog.featured])
    body = (f"<h1>Welcome to {esc(SITE_NAME)}</h1>"
            f'<section aria-labelledby="cats"><h2 id="cats">Shop by category</h2>'
            f"<ul>{cats}</ul></section>"
            f'<section aria-labelledby="feat"><h2 id="feat">Featured products</h2>'
            f"{featured}</section>")
    return page(view, "Home", body)


def category(view: View, slug: str, query: Query) -> str:
    """Category listing, sorted (``sort``) and paginated (``page``)."""
    cat = view.inst.catalog.category(slug)
    if cat is None:
        raise NotFound(f"no category {slug!r}")
    sort = query.get("sort", "name")
    sort = sort if sort in SORTS else "name"
    products = sort_products(view.inst.catalog.in_category(slug), sort,
                             lambda p: view.inst.rating(p)[0])
    page_no, pages, window = paginate(len(products), _int(query.get("page"), 1), PAGE_SIZE)
    path = f"/category/{slug}"
    sort_q = None if sort == "name" else sort
    body = (f"<h1>{esc(cat.name)}</h1><p>{len(products)} products</p>"
            f"{sort_form(view, path, sort)}{product_list(view, products[window])}"
            f"{pager(view, path, page_no, pages, sort=sort_q)}")
    return page(view, cat.name, body)


def search(view: View, query: Query) -> str:
    """Search results for ``q`` (name, brand or description, case-insensitive), paginated."""
    q = query.get("q", "").strip()
    if not q:
        body = "<h1>Search</h1><p>Enter a search term.</p>"
        return page(view, "Search", body)
    hits = view.inst.catalog.search(q)
    page_no, pages, window = paginate(len(hits), _int(query.get("page"), 1), PAGE_SIZE)
    noun = "result" if len(hits) == 1 else "results"
    body = (f"<h1>Search results for '{esc(q)}'</h1>"
            f'<p id="result-count">{len(hits)} {noun} for \'{esc(q)}\'</p>'
            f"{product_list(view, hits[window])}"
            f"{pager(view, '/search', page_no, pages, q=q)}")
    return page(view, f"Search results for '{q}'", body, query=q)


def product(view: View, sku: str, query: Query) -> str:
    """Product page: name, price, attributes, rating, reviews, add-to-cart and review forms."""
    inst = view.inst
    p = inst.catalog.by_sku.get(sku)
    if p is None:
        raise NotFound(f"no product {sku!r}")
    cat = inst.catalog.category(p.category)
    rating, count = inst.rating(p)
    rows = "".join(f"<tr><th scope=\"row\">{esc(k)}</th><td>{esc(v)}</td></tr>"
                   for k, v in (("Brand", p.brand), *p.attributes))
    reviews = "".join(
        f'<article class="review"><h3>{esc(r.title)}</h3>'
        f"<p>Rated {r.rating} out of 5</p>"
        f'<p class="review-meta">By <span class="author">{esc(r.author)}</span> on '
        f"{format_date(r.date)}</p><p>{esc(r.text)}</p></article>"
        for r in inst.reviews(p)
    ) or "<p>There are no reviews for this product yet.</p>"
    options = "".join(f'<option value="{k}">{v}</option>' for k, v in RATING_OPTIONS.items())
    body = f"""<h1>{esc(p.name)}</h1>
<p>SKU: {esc(p.sku)}</p><p>Category: {esc(cat.name if cat else p.category)}</p>
<p class="price">{money(p.price)}</p>
<p class="rating">{esc(rating_line(rating, count))}</p>
<form method="post" action="{esc(view.url(f"/product/{p.sku}/add"))}">
<label for="qty">Qty</label><input type="number" id="qty" name="qty" value="1" min="1" max="99">
<button type="submit">Add to Cart</button></form>
<h2>Details</h2><p>{esc(p.description)}</p>
<table id="product-attributes"><caption>More Information</caption>{rows}</table>
<section id="reviews" aria-labelledby="reviews-h"><h2 id="reviews-h">Customer Reviews</h2>
{reviews}</section>
<section aria-labelledby="write-h"><h2 id="write-h">Write a review</h2>
<form method="post" action="{esc(view.url(f"/product/{p.sku}/review"))}">
<label for="rating">Rating</label><select id="rating" name="rating">{options}</select>
<label for="title">Review title</label><input type="text" id="title" name="title">
<label for="text">Review text</label><textarea id="text" name="text" rows="4"></textarea>
<button type="submit">Submit Review</button></form></section>"""
    return page(view, p.name, body)


def add_to_cart(view: View, sku: str, form: Query) -> None:
    """POST: add ``qty`` of the product to the cart, then show the product page again."""
    p = view.inst.catalog.by_sku.get(sku)
    if p is None:
        raise NotFound(f"no product {sku!r}")
    qty = _int(form.get("qty"), 1)
    if not 1 <= qty <= 99:
        view.inst.set_flash("Please enter a quantity between 1 and 99.", error=True)
    else:
        view.inst.add_to_cart(sku, qty)
        view.inst.set_flash(f"You added {qty} × {p.name} to your shopping cart.")
    raise Redirect(view.url(f"/product/{sku}"))


def write_review(view: View, sku: str, form: Query) -> None:
    """POST: add a review (author: the signed-in customer, or Guest)."""
    p = view.inst.catalog.by_sku.get(sku)
    if p is None:
        raise NotFound(f"no product {sku!r}")
    rating = _int(form.get("rating"), 0)
    title, text = form.get("title", "").strip(), form.get("text", "").strip()
    if rating not in RATING_OPTIONS or not title or not text:
        view.inst.set_flash("Please choose a rating and fill in the title and the text.",
                            error=True)
    else:
        view.inst.add_review(p, rating, title, text)
        view.inst.set_flash("Thank you for your review.")
    raise Redirect(view.url(f"/product/{sku}"))
