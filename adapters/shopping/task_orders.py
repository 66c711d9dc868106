"""Task templates about the customer's orders (all need a signed-in customer but one pair that
signs in with given credentials)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

from dreamgym_agents.adapters.shopping.account_pages import ORDERS_PER_PAGE
from dreamgym_agents.adapters.shopping.data import Catalog, Order, format_date, format_money
from dreamgym_agents.adapters.shopping.taskkit import (
    Draft,
    Step,
    Template,
    click,
    fill,
    orders_newest_first,
    pick,
    stop,
    to_order,
    to_order_pages,
)

_MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August",
                "September", "October", "November", "December")


def _order_drafts(catalog: Catalog, rng: random.Random, count: int,
                  answer_of: Callable[[Order], str], kind: str = "exact_match") -> list[Draft]:
    drafts = []
    for order in pick(rng, orders_newest_first(catalog), count):
        answer = answer_of(order)
        answers = {kind: answer if kind == "exact_match" else [answer]}
        drafts.append(Draft({"order_id": str(order.order_id)},
                            [*to_order(catalog, order), stop(answer)],
                            require_login=True, answers=answers, raw=answer))
    return drafts


def order_total(catalog: Catalog, rng: random.Random) -> list[Draft]:
    return _order_drafts(catalog, rng, 20, lambda o: format_money(o.total))


def order_date(catalog: Catalog, rng: random.Random) -> list[Draft]:
    return _order_drafts(catalog, rng, 15, lambda o: format_date(o.date), "must_include")


def order_status(catalog: Catalog, rng: random.Random) -> list[Draft]:
    return _order_drafts(catalog, rng, 15, lambda o: o.status.capitalize())


def order_item_qty(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for order in pick(rng, orders_newest_first(catalog), 15):
        item = rng.choice(order.items)
        drafts.append(Draft({"product": item.name, "order_id": str(order.order_id)},
                            [*to_order(catalog, order), stop(str(item.qty))],
                            require_login=True, answers={"exact_match": str(item.qty)},
                            raw=str(item.qty)))
    return drafts


def status_count(catalog: Catalog, rng: random.Random) -> list[Draft]:
    orders = orders_newest_first(catalog)
    pages = -(-len(orders) // ORDERS_PER_PAGE)
    drafts = []
    for status in ("complete", "pending", "processing", "canceled", "closed"):
        count = str(sum(o.status == status for o in orders))
        drafts.append(Draft({"status": status.capitalize()}, [*to_order_pages(pages), stop(count)],
                            require_login=True, answers={"exact_match": count}, raw=count))
    return drafts


def _months(catalog: Catalog) -> dict[tuple[int, int], list[tuple[int, Order]]]:
    """(year, month) -> [(index in the history, order)], for the primary customer."""
    months: dict[tuple[int, int], list[tuple[int, Order]]] = defaultdict(list)
    for index, order in enumerate(orders_newest_first(catalog)):
        months[(order.date.year, order.date.month)].append((index, order))
    return months


def _month_steps(entries: list[tuple[int, Order]]) -> list[Step]:
    last_page = max(index for index, _ in entries) // ORDERS_PER_PAGE + 1
    return to_order_pages(last_page)


def orders_in_month(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    months = _months(catalog)
    for year, month in pick(rng, sorted(months), 15):
        entries = months[(year, month)]
        count = str(len(entries))
        drafts.append(Draft({"month": f"{_MONTH_NAMES[month - 1]} {year}"},
                            [*_month_steps(entries), stop(count)], require_login=True,
                            answers={"exact_match": count}, raw=count))
    return drafts


def month_spend(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    months = _months(catalog)
    spending = sorted(k for k, v in months.items() if any(o.status != "canceled" for _, o in v))
    for year, month in pick(rng, spending, 15):
        entries = months[(year, month)]
        total = format_money(sum(o.total for _, o in entries if o.status != "canceled"))
        drafts.append(Draft({"month": f"{_MONTH_NAMES[month - 1]} {year}"},
                            [*_month_steps(entries), stop(total)], require_login=True,
                            answers={"must_include": [total]}, raw=total))
    return drafts


def _sign_in(email: str, password: str) -> list[Step]:
    return [click("link", "Sign In"), fill("textbox", "Email", email),
            fill("textbox", "Password", password), click("button", "Sign In"),
            click("link", "My Orders")]


def login_latest_total(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for account in catalog.accounts:
        latest = max(account.orders, key=lambda o: (o.date, o.order_id))
        total = format_money(latest.total)
        drafts.append(Draft({"email": account.email, "password": account.password},
                            [*_sign_in(account.email, account.password), stop(total)],
                            answers={"exact_match": total}, raw=total))
    return drafts


def login_order_count(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for account in catalog.accounts:
        count = str(len(account.orders))
        drafts.append(Draft({"email": account.email, "password": account.password},
                            [*_sign_in(account.email, account.password), stop(count)],
                            answers={"exact_match": count}, raw=count))
    return drafts


def order_page(catalog: Catalog, rng: random.Random) -> list[Draft]:
    drafts = []
    for order in pick(rng, orders_newest_first(catalog), 12):
        path = f"/account/orders/{order.order_id}"
        drafts.append(Draft({"order_id": str(order.order_id)},
                            [*to_order(catalog, order), stop("done")], require_login=True,
                            reference_url=f"__SHOPPING__{path}", raw=path))
    return drafts


TEMPLATES: list[Template] = [
    Template(10, "order_total", "info", "What was the grand total of my order #{{order_id}}?",
             order_total),
    Template(11, "order_date", "info", "On what date did I place order #{{order_id}}?",
             order_date),
    Template(12, "order_status", "info", "What is the status of my order #{{order_id}}?",
             order_status),
    Template(13, "order_item_qty", "info",
             "How many units of {{product}} did I buy in order #{{order_id}}? "
             "Answer with a number.", order_item_qty),
    Template(14, "status_count", "info",
             "How many of my orders have the status {{status}}? Answer with a number.",
             status_count),
    Template(15, "orders_in_month", "info",
             "How many orders did I place in {{month}}? Answer with a number.", orders_in_month),
    Template(16, "month_spend", "info",
             "How much did I spend in total on my orders placed in {{month}}, not counting "
             "canceled orders?", month_spend),
    Template(17, "login_latest_total", "info",
             "Sign in with the email {{email}} and the password {{password}}, then tell me the "
             "grand total of that account's most recent order.", login_latest_total),
    Template(18, "login_order_count", "info",
             "Sign in with the email {{email}} and the password {{password}}, then tell me how "
             "many orders that account has placed. Answer with a number.", login_order_count),
    Template(24, "order_page", "navigation",
             "Open the details page of my order #{{order_id}}.", order_page),
]
