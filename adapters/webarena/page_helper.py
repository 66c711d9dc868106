"""WebArena's ``func:`` helpers for ``program_html`` targets, evaluated without ``eval()``.

A target's ``url`` or ``locator`` may be ``func:name(args)``; :func:`call_helper` parses the call,
allows only known helpers with literal arguments (and ``page``/``__page__`` for the Playwright
page), and runs it.
"""

from __future__ import annotations

import ast
import logging
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from dreamgym_agents.errors import TaskError

logger = logging.getLogger(__name__)

Helper = Callable[..., str]
"""A ``func:`` helper of a ``program_html`` target; ``__page__``/``page`` arguments receive the
Playwright page, other arguments are literals from the config."""


def get_query_text(page: Any, selector: str) -> str:
    """Text content of the first element matching a CSS selector ('' if none)."""
    try:
        result = page.evaluate(
            "(sel) => { const el = document.querySelector(sel); return el ? el.textContent : ''; }",
            selector,
        )
    except Exception as exc:  # a page error means the content is not there
        logger.debug("get_query_text(%r) failed: %s", selector, exc)
        return ""
    return str(result or "")


def get_query_text_lowercase(page: Any, selector: str) -> str:
    """:func:`get_query_text`, lowercased."""
    return get_query_text(page, selector).lower()


def reddit_get_post_url(url: str) -> str:
    """Reduce a Postmill comment URL ``/f/<forum>/<id>/…`` to its post URL (else unchanged)."""
    parsed = urllib.parse.urlparse(url)
    parts = parsed.path.split("/")
    if len(parts) < 4 or parts[1] != "f":
        return url
    return f"{parsed.scheme}://{parsed.netloc}/f/{parts[2]}/{parts[3]}/"


def gitlab_get_project_memeber_role(page: Any, account_name: str) -> str:
    """Role of a member on a GitLab project members page ('' if not found).

    The name keeps WebArena's spelling, as task configs call it by that name.
    """
    script = """(account) => {
        const names = document.querySelectorAll(
            "td[data-label='Account'] span.gl-avatar-labeled-sublabel");
        for (let i = 0; i < names.length; i++) {
            if (names[i].outerText === '@' + account) {
                const roles = document.querySelectorAll("td.col-max-role span");
                return roles[i] ? roles[i].outerText : '';
            }
        }
        return '';
    }"""
    try:
        return str(page.evaluate(script, account_name) or "")
    except Exception as exc:
        logger.debug("gitlab_get_project_memeber_role(%r) failed: %s", account_name, exc)
        return ""


BUILTIN_HELPERS: dict[str, Helper] = {
    "get_query_text": get_query_text,
    "get_query_text_lowercase": get_query_text_lowercase,
    "reddit_get_post_url": reddit_get_post_url,
    "gitlab_get_project_memeber_role": gitlab_get_project_memeber_role,
}
"""``func:`` helpers that work on any site. WebArena's shopping helpers
(``shopping_get_latest_order_url`` …) query Magento's admin REST API with the site's admin
account: :func:`~dreamgym_agents.adapters.webarena.accounts.shopping_helpers` makes them for a
site, passed through ``helpers=``."""

_PAGE_NAMES = frozenset({"page", "__page__"})
_FUNC = re.compile(r"func:\s*([A-Za-z_]\w*)\s*\(")


def helper_names(config: Mapping[str, Any]) -> set[str]:
    """The ``func:`` helpers a task config's ``program_html`` targets call."""
    targets = (config.get("eval") or {}).get("program_html") or []
    return {name for t in targets for field in ("url", "locator")
            for name in _FUNC.findall(str(t.get(field) or ""))}


def call_helper(expression: str, *, page: Any, helpers: Mapping[str, Helper] | None = None) -> str:
    """Evaluate a ``func:`` expression such as ``get_query_text(__page__, '.price')`` safely.

    Only a call of a known helper with literal arguments (and ``page``/``__page__``) is allowed.

    Raises:
        TaskError: The expression is not such a call or names an unknown helper.
    """
    table = {**BUILTIN_HELPERS, **(helpers or {})}
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError:
        raise TaskError(f"cannot parse helper call {expression!r}") from None
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name):
        raise TaskError(f"helper expression must be a function call, got {expression!r}")
    name = tree.func.id
    if name not in table:
        raise TaskError(
            f"unsupported evaluation helper {name!r} (supported: {', '.join(sorted(table))}; "
            "pass others with helpers=)"
        )

    def value_of(node: ast.expr) -> Any:
        if isinstance(node, ast.Name) and node.id in _PAGE_NAMES:
            return page
        try:
            return ast.literal_eval(node)
        except ValueError:
            raise TaskError(
                f"helper {name} arguments must be literals or __page__, in {expression!r}"
            ) from None

    args = [value_of(a) for a in tree.args]
    kwargs = {kw.arg: value_of(kw.value) for kw in tree.keywords if kw.arg}
    return str(table[name](*args, **kwargs))
