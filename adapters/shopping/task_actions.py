"""State-changing task templates (graded by ``program_html``): cart, checkout, account, reviews.

They all start signed in as the primary customer, whose saved cart holds a few items; targets
are read from fixed pages of the instance after the episode (``__SHOPPING__/cart``, the next
order's page, ``__SHOPPING__/account``, the product page).
"""

from __future__ import annotations

import random

from dreamgym_agents.adapters.shopping.data import Catalog, Product
from dreamgym_agents.adapters.shopping.taskkit import (
    Draft,
    Step,
    Template,
    click,
    count_of,
    fill,
    pick,
    select,
    stop,
    target,
    text_of,
    to_cart,
    to_product,
)

STREET_NAMES = ["Oak St", "Market St", "Harbor View Rd", "Sunset Blvd", "Maple Ave",
                "Riverside Dr", "Lakeshore Dr", "Hillcrest Ln", "Cedar Ct", "Broadway"]
CITIES = [("Seattle", "WA", "98101"), ("Portland", "OR", "97205"), ("Chicago", "IL", "60614"),
          ("Miami", "FL", "33131"), ("Phoenix", "AZ", "85004"), ("Atlanta", "GA", "30303"),
          ("Columbus", "OH", "43215"), ("Madison", "WI", "53703"), ("Raleigh", "NC", "27601"),
          ("Salt Lake City", "UT", "84111")]
AREA_CODES = ["206", "312", "415", "503", "602", "704", "919", "614"]
NEW_REVIEWS = {
    "positive": (["Great for my home office", "Sturdy and reliable", "Would buy again",
                  "Exactly as described", "Pleasantly surprised"],
                 ["I have used it daily for a month and it still works like new.",
                  "Setup took five minutes and the quality is excellent.",
                  "Good value for the price and it arrived early."]),
    "neutral": (["Good value overall", "Fine but nothing special", "Does what it should"],
                ["It works as described, although the finish could be better.",
                 "Decent product; I would like more options."]),
    "negative": (["Not what I hoped for", "Stopped working quickly", "Poor build quality"],
                 ["It broke after two weeks and I am returning it.",
                  "The description promised more than it delivers."]),
}
CART_ITEMS = "#cart-items"


def _cart_skus(catalog: Catalog) -> set[str]:
    return {sku for sku, _ in catalog.accounts[0].cart}


def _addable(catalog: Catalog) -> list[Product]:
    """Products not already in the saved cart (so "Qty: N" is exactly what the task adds)."""
    in_cart = _cart_skus(catalog)
    return [p for p in catalog.products if p.sku not in in_cart]


def _next_order_id(catalog: Catalog) -> int:
    return 1 + max(o.order_id for a in catalog.accounts for o in a.orders)


def _address(rng: random.Random) -> tuple[str, str, str, str]:
    city, state, zip_code = rng.choice(CITIES)
    return f"{rng.randint(10, 9899)} {rng.choice(STREET_NAMES)}", city, state, zip_code


def _fill_address(street: str, city: str, state: str, zip_code: str) -> list[Step]:
    return [fill("textbox", "Street Address", street), fill("textbox", "City", city),
            fill("textbox", "State", state), fill("textbox", "ZIP Code", zip_code)]


def add_to_cart(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for i, p in enumerate(pick(rng, _addable(catalog), 25)):
        qty = rng.randint(2, 5)
        drafts.append(Draft(
            {"qty": str(qty), "product": p.name},
            [*to_product(catalog, p, i), fill("spinbutton", "Qty", str(qty)),
             click("button", "Add to Cart"), stop("done")],
            require_login=True,
            program_html=[
                target("/cart", text_of(CART_ITEMS), must_include=[p.name]),
                target("/cart", text_of(f'{CART_ITEMS} [data-sku="{p.sku}"] .qty'),
                       exact_match=f"Qty: {qty}"),
            ],
            raw=f"{p.name} with Qty: {qty} in the cart"))
    return drafts


def add_two(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    products = pick(rng, _addable(catalog), 30)
    for i in range(15):
        first, second = products[2 * i], products[2 * i + 1]
        drafts.append(Draft(
            {"product1": first.name, "product2": second.name},
            [*to_product(catalog, first, i), click("button", "Add to Cart"),
             *to_product(catalog, second, i + 1), click("button", "Add to Cart"), stop("done")],
            require_login=True,
            program_html=[target("/cart", text_of(CART_ITEMS),
                                 must_include=[first.name, second.name])],
            raw=f"{first.name}; {second.name}"))
    return drafts


def remove_from_cart(catalog: Catalog, rng: random.Random) -> list[Draft]:
    cart = [catalog.by_sku[sku] for sku, _ in catalog.accounts[0].cart]
    drafts = []
    for p in cart:
        others = [o.name for o in cart if o.sku != p.sku]
        drafts.append(Draft(
            {"product": p.name},
            [*to_cart(), click("button", f"Remove {p.name}"), stop("done")],
            require_login=True,
            program_html=[
                target("/cart", count_of(f'{CART_ITEMS} [data-sku="{p.sku}"]'), exact_match="0"),
                target("/cart", text_of(CART_ITEMS), must_include=others),
            ],
            raw=f"cart without {p.name}"))
    return drafts


def change_cart_qty(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for sku, current in catalog.accounts[0].cart:
        p = catalog.by_sku[sku]
        for qty in sorted(rng.sample([q for q in range(2, 8) if q != current], 2)):
            drafts.append(Draft(
                {"product": p.name, "qty": str(qty)},
                [*to_cart(), fill("spinbutton", f"Qty for {p.name}", str(qty)),
                 click("button", "Update Cart"), stop("done")],
                require_login=True,
                program_html=[target("/cart", text_of(f'{CART_ITEMS} [data-sku="{sku}"] .qty'),
                                     exact_match=f"Qty: {qty}")],
                raw=f"Qty: {qty}"))
    return drafts


def buy_product(catalog: Catalog, rng: random.Random) -> list[Draft]:
    order_path = f"/account/orders/{_next_order_id(catalog)}"
    drafts = []
    for i, p in enumerate(pick(rng, _addable(catalog), 20)):
        qty = rng.randint(1, 3)
        drafts.append(Draft(
            {"qty": str(qty), "product": p.name},
            [*to_product(catalog, p, i), fill("spinbutton", "Qty", str(qty)),
             click("button", "Add to Cart"), *to_cart(), click("link", "Proceed to Checkout"),
             click("button", "Place Order"), stop("done")],
            require_login=True,
            program_html=[
                target(order_path, text_of("#order-view"), must_include=[p.name, "Pending"]),
                target(order_path, text_of(f'#order-view tr[data-sku="{p.sku}"] .qty'),
                       exact_match=str(qty)),
            ],
            raw=f"new order {order_path} with {qty} x {p.name}"))
    return drafts


def checkout_address(catalog: Catalog, rng: random.Random) -> list[Draft]:
    order_path = f"/account/orders/{_next_order_id(catalog)}"
    names = [catalog.by_sku[sku].name for sku, _ in catalog.accounts[0].cart]
    drafts = []
    for _ in range(10):
        street, city, state, zip_code = _address(rng)
        city_line = f"{city}, {state} {zip_code}"
        drafts.append(Draft(
            {"address": f"{street}, {city_line}"},
            [*to_cart(), click("link", "Proceed to Checkout"),
             *_fill_address(street, city, state, zip_code), click("button", "Place Order"),
             stop("done")],
            require_login=True,
            program_html=[target(order_path, text_of("#order-view"),
                                 must_include=[street, city_line, *names])],
            raw=f"new order {order_path} shipped to {street}, {city_line}"))
    return drafts


def change_address(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for _ in range(15):
        street, city, state, zip_code = _address(rng)
        city_line = f"{city}, {state} {zip_code}"
        drafts.append(Draft(
            {"address": f"{street}, {city_line}"},
            [click("link", "My Account"), click("link", "Edit Account"),
             *_fill_address(street, city, state, zip_code), click("button", "Save"),
             stop("done")],
            require_login=True,
            program_html=[target("/account", text_of("#account-info"),
                                 must_include=[street, city_line])],
            raw=f"{street}, {city_line}"))
    return drafts


def change_phone(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for _ in range(12):
        phone = f"({rng.choice(AREA_CODES)}) 555-{rng.randint(100, 9999):04d}"
        drafts.append(Draft(
            {"phone": phone},
            [click("link", "My Account"), click("link", "Edit Account"),
             fill("textbox", "Phone Number", phone), click("button", "Save"), stop("done")],
            require_login=True,
            program_html=[target("/account", text_of("#account-info"), must_include=[phone])],
            raw=phone))
    return drafts


def write_review(catalog: Catalog, rng: random.Random) -> list[Draft]:
    author = catalog.accounts[0].full_name
    drafts = []
    for i, p in enumerate(pick(rng, list(catalog.products), 20)):
        rating = rng.randint(1, 5)
        mood = "positive" if rating >= 4 else "neutral" if rating == 3 else "negative"
        titles, texts = NEW_REVIEWS[mood]
        title, text = rng.choice(titles), rng.choice(texts)
        option = "1 star" if rating == 1 else f"{rating} stars"
        drafts.append(Draft(
            {"rating": str(rating), "product": p.name, "title": title, "text": text},
            [*to_product(catalog, p, i), select("combobox", "Rating", option),
             fill("textbox", "Review title", title), fill("textbox", "Review text", text),
             click("button", "Submit Review"), stop("done")],
            require_login=True,
            program_html=[target(f"/product/{p.sku}", text_of("#reviews .review"),
                                 must_include=[title, text, f"Rated {rating} out of 5", author])],
            raw=f"{rating}-star review '{title}' by {author}"))
    return drafts


TEMPLATES: list[Template] = [
    Template(30, "add_to_cart", "action", "Add {{qty}} units of {{product}} to my shopping cart.",
             add_to_cart),
    Template(31, "add_two", "action",
             "Add one {{product1}} and one {{product2}} to my shopping cart.", add_two),
    Template(32, "remove_from_cart", "action", "Remove {{product}} from my shopping cart.",
             remove_from_cart),
    Template(33, "change_cart_qty", "action",
             "Change the quantity of {{product}} in my shopping cart to {{qty}}.", change_cart_qty),
    Template(34, "buy_product", "action",
             "Add {{qty}} units of {{product}} to my cart, then place an order for everything "
             "in the cart.", buy_product),
    Template(35, "checkout_address", "action",
             "Place an order for the items currently in my cart and ship it to {{address}}.",
             checkout_address),
    Template(36, "change_address", "action",
             "Change the address of my account to {{address}}.", change_address),
    Template(37, "change_phone", "action",
             "Change the phone number of my account to {{phone}}.", change_phone),
    Template(38, "write_review", "action",
             "Write a {{rating}}-star review of {{product}} with the title \"{{title}}\" and the "
             "text \"{{text}}\".", write_review),
]
