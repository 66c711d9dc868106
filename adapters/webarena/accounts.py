"""WebArena's site accounts, and the shopping helpers that use the admin one.

The accounts are WebArena's own (its ``browser_env/env_config.py``), each overridable by
``DG_WA_<ACCOUNT>_USERNAME`` / ``DG_WA_<ACCOUNT>_PASSWORD`` (``<ACCOUNT>`` upper-cased:
``SHOPPING_SITE_ADMIN``). Passwords never reach logs, trajectories or reports: an
:class:`Account` prints its username only.

The ``func:`` helpers ``shopping_get_latest_order_url``, ``shopping_get_sku_latest_review_author``
and ``shopping_get_sku_latest_review_rating`` query Magento's REST API as WebArena's do: an admin
token from ``/rest/default/V1/integration/admin/token``, then ``/rest/V1/orders`` (latest by
``created_at``) or ``/rest/V1/products/<sku>/reviews`` (the last review's nickname, or its first
rating's percent).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dreamgym_agents.adapters.webarena.page_helper import Helper
from dreamgym_agents.errors import EnvError

WEBARENA_ACCOUNTS: dict[str, tuple[str, str]] = {
    "reddit": ("MarvelsGrantMan136", "test1234"),
    "gitlab": ("byteblaze", "hello1234"),
    "shopping": ("emma.lopez@gmail.com", "Password.123"),
    "shopping_admin": ("admin", "admin1234"),
    "shopping_site_admin": ("admin", "admin1234"),
}
"""WebArena's accounts by name: (username, password)."""

REST_TIMEOUT_S = 30.0
SHOPPING_REST_HELPERS = ("shopping_get_latest_order_url", "shopping_get_sku_latest_review_author",
                         "shopping_get_sku_latest_review_rating")


@dataclass(frozen=True)
class Account:
    """A site account; ``repr`` shows no password."""

    username: str
    password: str = field(repr=False)


def account(name: str, environ: Mapping[str, str] | None = None) -> Account:
    """The account ``name`` (a :data:`WEBARENA_ACCOUNTS` key), with its environment overrides."""
    env = os.environ if environ is None else environ
    username, password = WEBARENA_ACCOUNTS[name]
    key = f"DG_WA_{name.upper()}"
    return Account(env.get(f"{key}_USERNAME", username), env.get(f"{key}_PASSWORD", password))


def _rest(url: str, *, token: str | None = None, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers,
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=REST_TIMEOUT_S) as response:  # noqa: S310
            return json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        path = urllib.parse.urlparse(url).path
        raise EnvError(f"the shopping site's REST API answered {exc.code} to {path}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EnvError(f"the shopping site's REST API at {url} failed: "
                       f"{getattr(exc, 'reason', exc)}") from None


def shopping_helpers(base_url: str, admin: Account) -> dict[str, Helper]:
    """WebArena's shopping ``func:`` helpers for the Magento site at ``base_url``."""
    base = base_url.rstrip("/")

    def token() -> str:
        return str(_rest(f"{base}/rest/default/V1/integration/admin/token",
                         body={"username": admin.username, "password": admin.password}))

    def reviews(sku: str) -> list[dict[str, Any]]:
        quoted = urllib.parse.quote(sku, safe="")
        return list(_rest(f"{base}/rest/V1/products/{quoted}/reviews", token=token()))

    def shopping_get_latest_order_url() -> str:
        query = urllib.parse.urlencode({
            "searchCriteria[sortOrders][0][field]": "created_at",
            "searchCriteria[sortOrders][0][direction]": "DESC",
            "searchCriteria[pageSize]": "1"})
        items = _rest(f"{base}/rest/V1/orders?{query}", token=token()).get("items") or []
        if not items:
            raise EnvError("the shopping site has no order: no latest order to check")
        return f"{base}/sales/order/view/order_id/{int(items[0]['increment_id'])}/"

    def shopping_get_sku_latest_review_author(sku: str) -> str:
        found = reviews(sku)
        return str(found[-1]["nickname"]) if found else ""

    def shopping_get_sku_latest_review_rating(sku: str) -> str:
        found = reviews(sku)
        return str(found[-1]["ratings"][0]["percent"]) if found else ""

    return {"shopping_get_latest_order_url": shopping_get_latest_order_url,
            "shopping_get_sku_latest_review_author": shopping_get_sku_latest_review_author,
            "shopping_get_sku_latest_review_rating": shopping_get_sku_latest_review_rating}


def reset_sites(hook: str, *, timeout_s: float = 600.0) -> None:
    """Reset the WebArena sites with ``hook``: an ``http(s)://`` URL requested once (the
    convention of BrowserGym's ``WA_FULL_RESET``: it answers when the sites are reset), or a
    command run without a shell.

    Raises:
        EnvError: The URL or the command failed.
    """
    import shlex
    import subprocess

    if hook.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(hook, timeout=timeout_s) as response:  # noqa: S310
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EnvError(f"site reset at {hook} failed: {getattr(exc, 'reason', exc)}") from None
        return
    try:
        done = subprocess.run(shlex.split(hook), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvError(f"site reset command {hook!r} failed: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise EnvError(f"site reset command {hook!r} exited {done.returncode}: {tail[0][:200]}")
