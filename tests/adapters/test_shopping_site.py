"""HTTP-level tests of the bundled shopping site (urllib against a server on a free port)."""

from __future__ import annotations

import html
import json
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from dreamgym_agents.adapters.shopping.data import (
    format_date,
    format_money,
    generate_catalog,
    rating_summary,
    sort_products,
)
from dreamgym_agents.adapters.shopping.server import ShoppingSite
from dreamgym_agents.adapters.shopping.store import InstanceStore


@pytest.fixture(scope="module")
def site():
    with ShoppingSite(seed=0) as running:
        yield running


def fetch(url: str, data: dict | None = None, method: str | None = None) -> tuple[int, str, str]:
    """Return (status, visible text, final URL); follows redirects (POST -> 303 -> GET)."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, _text(resp.read().decode()), resp.url
    except urllib.error.HTTPError as err:
        return err.code, _text(err.read().decode()), url


def _text(page: str) -> str:
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", page, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", page)
    return re.sub(r"\s+", " ", html.unescape(text)).strip()


def cart_qty(text: str) -> int:
    return int(re.search(r"My Cart \((\d+)\)", text).group(1))


# ---- catalog -------------------------------------------------------------------------------
def test_catalog_is_deterministic_and_seed_dependent():
    assert generate_catalog(0) == generate_catalog(0)
    assert generate_catalog(0) != generate_catalog(1)
    assert [p.name for p in generate_catalog(3).products] == [
        p.name for p in generate_catalog(3).products]


def test_catalog_shape():
    catalog = generate_catalog(0)
    assert len(catalog.categories) == 8
    assert len(catalog.products) == 200
    assert len({p.name for p in catalog.products}) == 200
    assert all(1 <= r.rating <= 5 for p in catalog.products for r in p.reviews)
    primary = catalog.accounts[0]
    assert 20 <= len(primary.orders) <= 30
    assert {o.status for o in primary.orders} == {
        "complete", "pending", "processing", "canceled", "closed"}
    assert all(o.total == o.subtotal + o.shipping for o in primary.orders)
    assert all(o.date < catalog.today for a in catalog.accounts for o in a.orders)


def test_formats():
    assert format_money(129900) == "$1,299.00"
    assert format_money(5) == "$0.05"
    import datetime as dt

    assert format_date(dt.date(2025, 3, 5)) == "Mar 5, 2025"
    assert rating_summary([]) == (None, 0)


# ---- pages ---------------------------------------------------------------------------------
def test_pages_render(site):
    catalog = site.catalog
    base = site.new_instance()
    product = catalog.products[0]
    order = catalog.accounts[0].orders[-1]
    expectations = {
        "": "Featured products",
        "/": "Shop by category",
        "/category/laptops": "Page 1 of 3",
        "/search?q=laptop": "results for 'laptop'",
        f"/product/{product.sku}": format_money(product.price),
        "/cart": "Proceed to Checkout",
        "/checkout": "Place Order",
        "/account": "emma.lopez@example.com",
        "/account/edit": "Edit Account Information",
        "/account/orders": f"View Order #{order.order_id}",
        f"/account/orders/{order.order_id}": f"Grand Total: {format_money(order.total)}",
        "/login": "Customer Login",
    }
    for path, expected in expectations.items():
        status, text, _ = fetch(base + path)
        assert status == 200, path
        assert expected in text, (path, expected)
        assert "Home" in text and "My Account" in text and "Sign Out" in text


def test_product_page_shows_rating_and_reviews(site):
    product = next(p for p in site.catalog.products if len(p.reviews) > 1)
    rating, count = rating_summary(product.reviews)
    _, text, _ = fetch(f"{site.new_instance()}/product/{product.sku}")
    assert f"Rating: {rating} out of 5 ({count} reviews)" in text
    newest = product.reviews[0]
    assert f"By {newest.author} on {format_date(newest.date)}" in text


def test_search_counts_and_pagination(site):
    base = site.new_instance(login=False)
    hits = site.catalog.search("laptop")
    assert len(hits) > 12
    _, text, _ = fetch(f"{base}/search?q=LAPTOP")
    assert f"{len(hits)} results for 'LAPTOP'" in text
    assert hits[0].name in text and hits[12].name not in text
    _, text, _ = fetch(f"{base}/search?q=laptop&page=2")
    assert hits[12].name in text and "Previous page" in text


def test_category_sort_and_pages(site):
    base = site.new_instance(login=False)
    products = site.catalog.in_category("kitchen")
    cheapest = min(products, key=lambda p: p.price)
    dearest = max(products, key=lambda p: p.price)
    _, text, _ = fetch(f"{base}/category/kitchen?sort=price_asc")
    assert text.index(cheapest.name) < text.index("Page 1 of 3")
    _, text, _ = fetch(f"{base}/category/kitchen?sort=price_desc&page=3")
    assert "Page 3 of 3" in text and cheapest.name in text and dearest.name not in text
    by_name = sort_products(products, "name", lambda p: None)
    _, text, _ = fetch(f"{base}/category/kitchen?page=2")
    assert by_name[12].name in text and by_name[0].name not in text


# ---- state changes -------------------------------------------------------------------------
def test_cart_add_update_remove(site):
    base = site.new_instance()
    product = site.catalog.products[10]
    _, text, _ = fetch(f"{base}/cart")
    before = cart_qty(text)
    _, text, url = fetch(f"{base}/product/{product.sku}/add", {"qty": "3"})
    assert url.endswith(f"/product/{product.sku}") and "You added 3" in text
    assert cart_qty(text) == before + 3
    _, text, _ = fetch(f"{base}/cart")
    assert product.name in text and "Qty: 3" in text
    fetch(f"{base}/cart/update", {f"qty_{product.sku}": "5"})
    _, text, _ = fetch(f"{base}/cart")
    assert cart_qty(text) == before + 5
    fetch(f"{base}/cart/remove", {"sku": product.sku})
    _, text, _ = fetch(f"{base}/cart")
    assert f"Remove {product.name}" not in text and cart_qty(text) == before


def test_checkout_places_order(site):
    base = site.new_instance()
    catalog = site.catalog
    next_id = 1 + max(o.order_id for a in catalog.accounts for o in a.orders)
    address = {"first_name": "Emma", "last_name": "Lopez", "street": "5 Test Rd",
               "city": "Reno", "state": "NV", "zip_code": "89501", "phone": "(775) 555-0100"}
    _, text, url = fetch(f"{base}/checkout", address)
    assert f"Your order number is #{next_id}" in text
    assert url.endswith(f"/checkout/success?order={next_id}")
    assert cart_qty(text) == 0
    _, text, _ = fetch(f"{base}/account/orders")
    assert f"View Order #{next_id}" in text and "Nov 1, 2026" in text
    _, text, _ = fetch(f"{base}/account/orders/{next_id}")
    assert "Status: Pending" in text and "5 Test Rd" in text and "Reno, NV 89501" in text
    for sku, _qty in catalog.accounts[0].cart:
        assert catalog.by_sku[sku].name in text


def test_account_edit(site):
    base = site.new_instance()
    form = {"first_name": "Emma", "last_name": "Lopez", "street": "9 New St", "city": "Ogden",
            "state": "UT", "zip_code": "84401", "phone": "(801) 555-0199"}
    _, text, url = fetch(f"{base}/account/edit", form)
    assert url.endswith("/account") and "You saved the account information." in text
    assert "9 New St" in text and "Ogden, UT 84401" in text and "(801) 555-0199" in text
    _, text, _ = fetch(f"{base}/account/edit", {**form, "city": ""})
    assert "Please fill in every field." in text


def test_write_review(site):
    base = site.new_instance()
    product = site.catalog.products[5]
    fetch(f"{base}/product/{product.sku}/review",
          {"rating": "2", "title": "Meh title", "text": "Some text here."})
    _, text, _ = fetch(f"{base}/product/{product.sku}")
    rating, count = rating_summary(product.reviews)
    assert f"({count + 1} review" in text
    assert text.index("Meh title") < text.index("Write a review")
    assert "By Emma Lopez on Nov 1, 2026" in text


def test_login_required_and_credentials(site):
    base = site.new_instance(login=False)
    _, text, url = fetch(f"{base}/account")
    assert url.endswith("/login") and "Please sign in" in text and "Sign In" in text
    _, text, url = fetch(f"{base}/login", {"email": "emma.lopez@example.com", "password": "x"})
    assert url.endswith("/login") and "incorrect" in text
    account = site.catalog.accounts[1]
    _, text, url = fetch(f"{base}/login", {"email": account.email, "password": account.password})
    assert url.endswith("/account") and account.email in text and "Sign Out" in text
    _, text, _ = fetch(f"{base}/logout", {})
    assert "Sign In" in text and "Sign Out" not in text


def test_a_sign_in_sets_a_session_cookie_that_signs_in_other_instances(site):
    import http.cookiejar

    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    account = site.catalog.accounts[0]
    first = site.new_instance(login=False)
    body = urllib.parse.urlencode({"email": account.email, "password": account.password})
    browser.open(f"{first}/login", data=body.encode(), timeout=10).read()
    assert [c.name for c in jar] == ["shop_session"]  # a session, not the password
    second = site.new_instance(login=False)
    page = _text(browser.open(f"{second}/", timeout=10).read().decode())
    assert "Sign Out" in page and f"My Cart ({sum(q for _, q in account.cart)})" in page
    browser.open(f"{second}/logout", data=b"", timeout=10).read()
    page = _text(browser.open(f"{second}/", timeout=10).read().decode())
    assert "Sign In" in page and "Sign Out" not in page  # signed out there: not signed in again
    # without the cookie, a new instance starts signed out
    assert "Sign Out" not in fetch(f"{site.new_instance(login=False)}/")[1]


# ---- instances -----------------------------------------------------------------------------
def test_instances_are_isolated_and_start_clean(site):
    first, second = site.new_instance(), site.new_instance()
    product = site.catalog.products[42]
    _, text, _ = fetch(f"{second}/cart")
    baseline = cart_qty(text)
    fetch(f"{first}/product/{product.sku}/add", {"qty": "2"})
    fetch(f"{first}/account/edit", {"first_name": "Changed", "last_name": "Name",
                                     "street": "1 A St", "city": "B", "state": "CC",
                                     "zip_code": "1", "phone": "2"})
    _, text, _ = fetch(f"{first}/cart")
    assert cart_qty(text) == baseline + 2
    _, text, _ = fetch(f"{second}/cart")
    assert cart_qty(text) == baseline and product.name not in text
    _, text, _ = fetch(f"{second}/account")
    assert "Emma Lopez" in text and "Changed" not in text
    _, text, _ = fetch(f"{site.new_instance()}/account")
    assert "Emma Lopez" in text and "1 A St" not in text


def test_guest_instance_is_signed_out_with_empty_cart(site):
    _, text, _ = fetch(site.new_instance(login=False))
    assert "Sign In" in text and cart_qty(text) == 0


def test_admin_endpoints(site):
    with urllib.request.urlopen(f"{site.root_url}/__admin__/health") as resp:
        assert json.load(resp) == {"ok": True, "seed": 0, "instances": len(site.store)}
    request = urllib.request.Request(f"{site.root_url}/__admin__/instances",
                                     data=json.dumps({"login": False}).encode(), method="POST")
    with urllib.request.urlopen(request) as resp:
        assert resp.status == 201
        created = json.load(resp)
    base = created["base_url"]
    assert base.startswith(site.root_url + "/i/")
    status, text, _ = fetch(base)
    assert status == 200 and "Sign In" in text
    delete = f"{site.root_url}/__admin__/instances/{created['instance_id']}"
    assert fetch(delete, method="DELETE")[0] == 200
    assert fetch(delete, method="DELETE")[0] == 404
    assert fetch(base)[0] == 404


def test_not_found(site):
    status, text, _ = fetch(f"{site.root_url}/i/deadbeef00/")
    assert status == 404 and "Page Not Found" in text
    assert fetch(f"{site.root_url}/nothing")[0] == 404
    base = site.new_instance()
    assert fetch(f"{base}/product/NOPE-1")[0] == 404
    assert fetch(f"{base}/account/orders/1")[0] == 404


def test_root_creates_instance_and_redirects(site):
    status, text, url = fetch(site.root_url + "/")
    assert status == 200 and re.search(r"/i/[0-9a-f]+/$", url) and "Featured products" in text


def test_drop_instance(site):
    base = site.new_instance()
    assert site.instance(base) is not None
    assert site.drop_instance(base) is True
    assert site.drop_instance(base) is False
    assert fetch(base)[0] == 404


def test_instance_store_is_bounded():
    store = InstanceStore(generate_catalog(0), max_instances=3)
    made = [store.create() for _ in range(5)]
    assert len(store) == 3
    assert store.get(made[0].instance_id) is None and store.get(made[-1].instance_id)
