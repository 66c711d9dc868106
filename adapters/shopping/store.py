"""Per-episode mutable state of the shopping site: instances and the store that holds them.

An :class:`Instance` is one isolated copy of the shop for one episode: its own cart, login state,
account edits, placed orders and written reviews, all initialised from the immutable
:class:`~dreamgym_agents.adapters.shopping.data.Catalog`. Login state belongs to the instance (no
cookies), so two browser tabs on two instance URLs never see each other's changes.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections import OrderedDict

from dreamgym_agents.adapters.shopping.data import (
    Account,
    Address,
    Catalog,
    Order,
    OrderItem,
    Product,
    Review,
    rating_summary,
    shipping_for,
)


class Instance:
    """One isolated copy of the shop. Callers hold :attr:`lock` while reading or mutating."""

    def __init__(self, instance_id: str, catalog: Catalog, login: bool) -> None:
        self.instance_id = instance_id
        self.catalog = catalog
        self.lock = threading.RLock()
        self.accounts: dict[str, Account] = {a.email: a for a in catalog.accounts}
        primary = catalog.accounts[0]
        self.user: str | None = primary.email if login else None
        # The saved cart of the primary account is loaded when the instance starts logged in.
        self.cart: dict[str, int] = dict(primary.cart) if login else {}
        self.new_reviews: dict[str, list[Review]] = {}
        self.flash: str | None = None
        self.flash_error: bool = False
        self.signed_out = False  # signed out here: a session cookie no longer signs it in

    # ---- account -----------------------------------------------------------------------------
    @property
    def account(self) -> Account | None:
        """The signed-in account (with this instance's edits and orders), None for a guest."""
        return self.accounts.get(self.user) if self.user else None

    def login(self, email: str, password: str) -> bool:
        """Sign in when the credentials match an account; return whether they did."""
        account = self.catalog.account(email)
        if account is None or account.password != password:
            return False
        self.user = account.email
        return True

    def adopt(self, email: str) -> None:
        """Sign in the browser's session account (a ``storage_state`` made by a sign-in), as
        an instance created signed in: the account's saved cart loaded; not after a
        sign-out here, nor over another account."""
        account = self.catalog.account(email)
        if self.user is None and not self.signed_out and account is not None:
            self.user = account.email
            self.cart = dict(account.cart)

    def logout(self) -> None:
        self.user = None
        self.signed_out = True

    def update_address(self, address: Address) -> None:
        """Replace the signed-in account's name, address and phone."""
        if self.account is not None:
            self.accounts[self.account.email] = dataclasses.replace(self.account, address=address)

    # ---- catalog as seen by this instance ----------------------------------------------------
    def reviews(self, product: Product) -> list[Review]:
        """Reviews of a product, newest first (reviews written in this instance come first)."""
        return list(reversed(self.new_reviews.get(product.sku, []))) + list(product.reviews)

    def rating(self, product: Product) -> tuple[str | None, int]:
        """Mean rating text (``"4.3"``) and review count, including this instance's reviews."""
        return rating_summary(self.reviews(product))

    def add_review(self, product: Product, rating: int, title: str, text: str) -> None:
        author = self.account.full_name if self.account else "Guest"
        review = Review(author, self.catalog.today, rating, title, text)
        self.new_reviews.setdefault(product.sku, []).append(review)

    # ---- cart and orders ---------------------------------------------------------------------
    @property
    def cart_count(self) -> int:
        return sum(self.cart.values())

    def cart_lines(self) -> list[tuple[Product, int]]:
        """Cart lines in insertion order."""
        return [(self.catalog.by_sku[sku], qty) for sku, qty in self.cart.items()]

    def add_to_cart(self, sku: str, qty: int) -> None:
        self.cart[sku] = self.cart.get(sku, 0) + qty

    def set_qty(self, sku: str, qty: int) -> None:
        """Set a line's quantity; zero or less removes the line."""
        if qty <= 0:
            self.cart.pop(sku, None)
        elif sku in self.cart:
            self.cart[sku] = qty

    def orders(self) -> list[Order]:
        """The signed-in account's orders, newest first."""
        account = self.account
        if account is None:
            return []
        return sorted(account.orders, key=lambda o: (o.date, o.order_id), reverse=True)

    def next_order_id(self) -> int:
        return 1 + max(o.order_id for a in self.accounts.values() for o in a.orders)

    def place_order(self, ship_to: Address) -> Order:
        """Turn the cart into a pending order dated :attr:`Catalog.today` and empty the cart."""
        account = self.account
        if account is None or not self.cart:
            raise ValueError("placing an order needs a signed-in account and a non-empty cart")
        items = tuple(OrderItem(p.sku, p.name, qty, p.price) for p, qty in self.cart_lines())
        subtotal = sum(i.line_total for i in items)
        order = Order(self.next_order_id(), self.catalog.today, items, shipping_for(subtotal),
                      "pending", ship_to)
        self.accounts[account.email] = dataclasses.replace(account,
                                                           orders=account.orders + (order,))
        self.cart.clear()
        return order

    def pop_flash(self) -> tuple[str | None, bool]:
        """Return and clear the one-shot message shown on the next page."""
        message, error = self.flash, self.flash_error
        self.flash, self.flash_error = None, False
        return message, error

    def set_flash(self, message: str, error: bool = False) -> None:
        self.flash, self.flash_error = message, error


class InstanceStore:
    """Thread-safe map of instance id to :class:`Instance`, bounded to ``max_instances``.

    When full, creating an instance drops the oldest one (its URLs then answer 404).
    """

    def __init__(self, catalog: Catalog, max_instances: int = 256) -> None:
        if max_instances < 1:
            raise ValueError(f"max_instances must be >= 1, got {max_instances}")
        self.catalog = catalog
        self.max_instances = max_instances
        self._lock = threading.Lock()
        self._instances: OrderedDict[str, Instance] = OrderedDict()

    def create(self, login: bool = True) -> Instance:
        """Create a fresh instance (signed in as the primary account when ``login``)."""
        with self._lock:
            instance_id = secrets.token_hex(6)
            while instance_id in self._instances:
                instance_id = secrets.token_hex(6)
            instance = Instance(instance_id, self.catalog, login)
            self._instances[instance_id] = instance
            while len(self._instances) > self.max_instances:
                self._instances.popitem(last=False)
            return instance

    def get(self, instance_id: str) -> Instance | None:
        with self._lock:
            return self._instances.get(instance_id)

    def drop(self, instance_id: str) -> bool:
        """Forget an instance; return whether it existed."""
        with self._lock:
            return self._instances.pop(instance_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._instances)
