"""Customer pages: sign in/out, cart, checkout, account, account edit, order history and detail.

Account pages, the checkout and the order pages require a signed-in customer and redirect to
``/login`` otherwise. GET handlers return HTML; POST handlers raise ``Redirect``.
"""

from __future__ import annotations

from dreamgym_agents.adapters.shopping.data import Address, format_date, shipping_for
from dreamgym_agents.adapters.shopping.layout import (
    NotFound,
    Redirect,
    View,
    esc,
    money,
    page,
    pager,
    paginate,
)

Query = dict[str, str]
ORDERS_PER_PAGE = 10
ADDRESS_FIELDS = (
    ("first_name", "First Name"), ("last_name", "Last Name"), ("street", "Street Address"),
    ("city", "City"), ("state", "State"), ("zip_code", "ZIP Code"), ("phone", "Phone Number"),
)


def _require_login(view: View) -> None:
    if view.inst.account is None:
        view.inst.set_flash("Please sign in to continue.", error=True)
        raise Redirect(view.url("/login"))


def _address_block(a: Address) -> str:
    return (f"<p>{esc(a.full_name)}<br>{esc(a.street)}<br>{esc(a.city_line)}<br>"
            f"Phone: {esc(a.phone)}</p>")


def _address_fields(a: Address) -> str:
    return "".join(
        f'<label for="{key}">{label}</label>'
        f'<input type="text" id="{key}" name="{key}" value="{esc(getattr(a, key))}">'
        for key, label in ADDRESS_FIELDS
    )


def _address_from(form: Query) -> Address | None:
    values = {key: form.get(key, "").strip() for key, _ in ADDRESS_FIELDS}
    return Address(**values) if all(values.values()) else None


# ---- sign in / out -------------------------------------------------------------------------
def login_page(view: View, query: Query) -> str:
    body = f"""<h1>Customer Login</h1>
<form method="post" action="{esc(view.url("/login"))}">
<label for="email">Email</label><input type="email" id="email" name="email" autocomplete="off">
<label for="password">Password</label><input type="password" id="password" name="password">
<button type="submit">Sign In</button></form>"""
    return page(view, "Customer Login", body)


def login(view: View, form: Query) -> None:
    if view.inst.login(form.get("email", ""), form.get("password", "")):
        raise Redirect(view.url("/account"))
    view.inst.set_flash("The email or password you entered is incorrect. Please try again.",
                        error=True)
    raise Redirect(view.url("/login"))


def logout(view: View, form: Query) -> None:
    view.inst.logout()
    view.inst.set_flash("You are signed out.")
    raise Redirect(view.url("/"))


# ---- cart and checkout ---------------------------------------------------------------------
def cart(view: View, query: Query) -> str:
    """The cart: ``#cart-items`` lists name, "Qty: N", line total and a remove button per line."""
    lines = view.inst.cart_lines()
    items = "".join(
        f'<li class="cart-item" data-sku="{esc(p.sku)}">'
        f'<a href="{esc(view.url(f"/product/{p.sku}"))}">{esc(p.name)}</a> '
        f"<span>{money(p.price)} each</span> · <span class=\"qty\">Qty: {qty}</span> · "
        f'<span class="line-total">{money(p.price * qty)}</span><br>'
        f'<label for="qty-{esc(p.sku)}" style="display:inline">Qty for {esc(p.name)}</label> '
        f'<input type="number" id="qty-{esc(p.sku)}" name="qty_{esc(p.sku)}" value="{qty}" '
        f'min="0" max="99"> <button type="submit" form="remove-{esc(p.sku)}">'
        f"Remove {esc(p.name)}</button></li>"
        for p, qty in lines
    )
    # Remove buttons submit their own forms (``form=`` attribute), so pressing Enter in a
    # quantity field submits "Update Cart" instead of removing the first line.
    removers = "".join(
        f'<form id="remove-{esc(p.sku)}" method="post" action="{esc(view.url("/cart/remove"))}">'
        f'<input type="hidden" name="sku" value="{esc(p.sku)}"></form>'
        for p, _ in lines
    )
    if not lines:
        content = ('<div id="cart-items"><p>You have no items in your shopping cart.</p></div>')
        return page(view, "Shopping Cart", f"<h1>Shopping Cart</h1>{content}")
    subtotal = sum(p.price * qty for p, qty in lines)
    body = f"""<h1>Shopping Cart</h1>
<form method="post" action="{esc(view.url("/cart/update"))}">
<ul id="cart-items">{items}</ul><button type="submit">Update Cart</button></form>{removers}
<p id="cart-subtotal">Subtotal: {money(subtotal)}</p>
<p><a href="{esc(view.url("/checkout"))}">Proceed to Checkout</a></p>"""
    return page(view, "Shopping Cart", body)


def cart_update(view: View, form: Query) -> None:
    """POST: set every line's quantity from its ``qty_<sku>`` field (0 removes the line)."""
    for sku in list(view.inst.cart):
        value = form.get(f"qty_{sku}", "").strip()
        if value.lstrip("-").isdigit():
            view.inst.set_qty(sku, int(value))
    view.inst.set_flash("Your shopping cart was updated.")
    raise Redirect(view.url("/cart"))


def cart_remove(view: View, form: Query) -> None:
    """POST: remove the line ``sku``."""
    sku = form.get("sku", "")
    product = view.inst.catalog.by_sku.get(sku)
    if product is not None and sku in view.inst.cart:
        view.inst.set_qty(sku, 0)
        view.inst.set_flash(f"You removed {product.name} from your shopping cart.")
    raise Redirect(view.url("/cart"))


def checkout_page(view: View, query: Query) -> str:
    _require_login(view)
    lines = view.inst.cart_lines()
    if not lines:
        return page(view, "Checkout", "<h1>Checkout</h1><p>Your cart is empty.</p>")
    subtotal = sum(p.price * qty for p, qty in lines)
    shipping = shipping_for(subtotal)
    items = "".join(f"<li>{esc(p.name)} · Qty: {qty} · {money(p.price * qty)}</li>"
                    for p, qty in lines)
    body = f"""<h1>Checkout</h1>
<section aria-labelledby="sum-h"><h2 id="sum-h">Order Summary</h2><ul>{items}</ul>
<p>Subtotal: {money(subtotal)}</p><p>Shipping: {money(shipping)}</p>
<p>Order Total: {money(subtotal + shipping)}</p></section>
<form method="post" action="{esc(view.url("/checkout"))}">
<fieldset><legend>Shipping Address</legend>{_address_fields(view.inst.account.address)}
</fieldset><button type="submit">Place Order</button></form>"""
    return page(view, "Checkout", body)


def checkout(view: View, form: Query) -> None:
    """POST: place the order (status pending, dated today), empty the cart, show the number."""
    _require_login(view)
    address = _address_from(form)
    if address is None:
        view.inst.set_flash("Please fill in every field of the shipping address.", error=True)
        raise Redirect(view.url("/checkout"))
    if not view.inst.cart:
        raise Redirect(view.url("/cart"))
    order = view.inst.place_order(address)
    raise Redirect(view.url("/checkout/success", order=order.order_id))


def checkout_success(view: View, query: Query) -> str:
    number = esc(query.get("order", ""))
    body = (f"<h1>Thank you for your purchase!</h1><p>Your order number is #{number}</p>"
            f'<p><a href="{esc(view.url(f"/account/orders/{number}"))}">View Order #{number}</a>'
            f' · <a href="{esc(view.url("/"))}">Continue Shopping</a></p>')
    return page(view, "Order Confirmation", body)


# ---- account and orders --------------------------------------------------------------------
def account(view: View, query: Query) -> str:
    _require_login(view)
    acc = view.inst.account
    body = f"""<h1>My Account</h1>
<div id="account-info"><h2>Contact Information</h2><p>{esc(acc.full_name)}<br>{esc(acc.email)}</p>
<h2>Default Address</h2>{_address_block(acc.address)}</div>
<p><a href="{esc(view.url("/account/orders"))}">My Orders</a> ·
<a href="{esc(view.url("/account/edit"))}">Edit Account</a></p>"""
    return page(view, "My Account", body)


def account_edit_page(view: View, query: Query) -> str:
    _require_login(view)
    body = f"""<h1>Edit Account Information</h1>
<form method="post" action="{esc(view.url("/account/edit"))}">
{_address_fields(view.inst.account.address)}<button type="submit">Save</button></form>"""
    return page(view, "Edit Account Information", body)


def account_edit(view: View, form: Query) -> None:
    _require_login(view)
    address = _address_from(form)
    if address is None:
        view.inst.set_flash("Please fill in every field.", error=True)
        raise Redirect(view.url("/account/edit"))
    view.inst.update_address(address)
    view.inst.set_flash("You saved the account information.")
    raise Redirect(view.url("/account"))


def orders(view: View, query: Query) -> str:
    """Order history, newest first, ``ORDERS_PER_PAGE`` per page."""
    _require_login(view)
    all_orders = view.inst.orders()
    try:
        requested = int(query.get("page") or 1)
    except ValueError:
        requested = 1
    page_no, pages, window = paginate(len(all_orders), requested, ORDERS_PER_PAGE)
    rows = "".join(
        f"<tr><td>{o.order_id}</td><td>{format_date(o.date)}</td><td>{money(o.total)}</td>"
        f"<td>{o.status.capitalize()}</td><td><a href=\""
        f"{esc(view.url(f'/account/orders/{o.order_id}'))}\">View Order #{o.order_id}</a>"
        "</td></tr>"
        for o in all_orders[window]
    )
    body = f"""<h1>My Orders</h1><p>{len(all_orders)} orders</p>
<table id="order-history"><thead><tr><th scope="col">Order #</th><th scope="col">Date</th>
<th scope="col">Order Total</th><th scope="col">Status</th><th scope="col">Action</th></tr>
</thead><tbody>{rows}</tbody></table>{pager(view, "/account/orders", page_no, pages)}"""
    return page(view, "My Orders", body)


def order_view(view: View, order_id: str, query: Query) -> str:
    """One order: date, status, items with qty and prices, subtotal, shipping, grand total."""
    _require_login(view)
    order = next((o for o in view.inst.orders() if str(o.order_id) == order_id), None)
    if order is None:
        raise NotFound(f"no order {order_id!r} for this customer")
    rows = "".join(
        f'<tr data-sku="{esc(i.sku)}"><td>{esc(i.name)}</td><td>{esc(i.sku)}</td>'
        f'<td>{money(i.unit_price)}</td><td class="qty">{i.qty}</td>'
        f"<td>{money(i.line_total)}</td></tr>"
        for i in order.items
    )
    body = f"""<h1>Order #{order.order_id}</h1>
<div id="order-view"><p>Order Date: {format_date(order.date)}</p>
<p>Status: {order.status.capitalize()}</p>
<table><caption>Items Ordered</caption><thead><tr><th scope="col">Product Name</th>
<th scope="col">SKU</th><th scope="col">Price</th><th scope="col">Qty</th>
<th scope="col">Subtotal</th></tr></thead><tbody>{rows}</tbody></table>
<p>Subtotal: {money(order.subtotal)}</p><p>Shipping &amp; Handling: {money(order.shipping)}</p>
<p><strong>Grand Total: {money(order.total)}</strong></p>
<h2>Shipping Address</h2>{_address_block(order.ship_to)}</div>
<p><a href="{esc(view.url("/account/orders"))}">Back to My Orders</a></p>"""
    return page(view, f"Order #{order.order_id}", body)
