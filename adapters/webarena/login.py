"""Signing in like WebArena: one browser login per site and run, its cookies saved as a
Playwright ``storage_state`` file, loaded into every episode's browser context.

Each site's form is filled the way WebArena's ``browser_env/auto_login.py`` does (by label,
placeholder, test id and button name), with WebArena's accounts
(:mod:`~dreamgym_agents.adapters.webarena.accounts`). A saved state older than ``max_age_s`` is
made again before the next episode (sessions expire). What a login did is recorded (site,
username, when, how old the state is) for the episode's first transition; passwords never are.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym_agents.adapters.webarena.accounts import Account, account
from dreamgym_agents.errors import EnvError

STATE_MAX_AGE_S = 30 * 60.0
"""A saved sign-in is renewed after this long (sessions of the real sites expire)."""


@dataclass(frozen=True)
class SiteLogin:
    """How to sign in to one kind of site.

    Attributes:
        account: The WebArena account used (:data:`~.accounts.WEBARENA_ACCOUNTS` key).
        path: The sign-in page, relative to the site's base URL.
        fill: Fills the form and submits it: ``fill(page, account)``.
        signed_in: Whether the page after submitting shows a signed-in session.
        fixed: Credentials of this login itself (the bundled shop's own customer), instead of
            the WebArena account.
    """

    account: str
    path: str
    fill: Callable[[Any, Account], None]
    signed_in: Callable[[Any], bool]
    fixed: Account | None = None


def _magento_customer(page: Any, who: Account) -> None:
    page.get_by_label("Email", exact=True).fill(who.username)
    page.get_by_label("Password", exact=True).fill(who.password)
    page.get_by_role("button", name="Sign In").click()


def _magento_admin(page: Any, who: Account) -> None:
    page.get_by_placeholder("user name").fill(who.username)
    page.get_by_placeholder("password").fill(who.password)
    page.get_by_role("button", name="Sign in").click()


def _postmill(page: Any, who: Account) -> None:
    page.get_by_label("Username").fill(who.username)
    page.get_by_label("Password").fill(who.password)
    page.get_by_role("button", name="Log in").click()


def _gitlab(page: Any, who: Account) -> None:
    # GitLab's data-testid attributes, named in CSS: get_by_test_id reads Playwright's test-id
    # attribute, which BrowserGym sets to its own ("bid") for the whole Playwright instance,
    # so after a BrowserGym episode in the process it found no field and timed out
    page.locator('[data-testid="username-field"]').fill(who.username)
    page.locator('[data-testid="password-field"]').fill(who.password)
    page.locator('[data-testid="sign-in-button"]').click()


def _left(path_part: str) -> Callable[[Any], bool]:
    """Signed in when the page after submitting is no longer the sign-in page."""
    return lambda page: path_part not in page.url


SITE_LOGINS: dict[str, SiteLogin] = {
    "shopping": SiteLogin("shopping", "/customer/account/login/", _magento_customer,
                          _left("/customer/account/login")),
    "shopping_admin": SiteLogin("shopping_admin", "/admin", _magento_admin,
                                lambda page: page.get_by_placeholder("user name").count() == 0),
    "reddit": SiteLogin("reddit", "/login", _postmill, _left("/login")),
    "gitlab": SiteLogin("gitlab", "/users/sign_in", _gitlab, _left("/users/sign_in")),
}
"""The sites WebArena signs in to, by WebArena's site name."""


def bundled_shop_login(who: Account) -> SiteLogin:
    """The bundled shop's sign-in: its ``/login`` form (Magento's labels and button), with
    its own customer ``who``."""
    return SiteLogin("shopping", "/login", _magento_customer, _left("/login"), fixed=who)


def sign_in(browser: Any, site: str, base_url: str, path: Path, *,
            login: SiteLogin | None = None, environ: dict[str, str] | None = None,
            timeout_ms: int = 30_000) -> dict[str, Any]:
    """Sign in to ``site`` at ``base_url`` in a fresh context of ``browser`` and save its
    ``storage_state`` to ``path``; return the record of the login (no password).

    Raises:
        EnvError: The form could not be filled, or the site did not accept the account.
    """
    spec = login or SITE_LOGINS[site]
    who = spec.fixed or account(spec.account, environ)
    url = base_url.rstrip("/") + spec.path
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(timeout_ms)
        try:
            page.goto(url)
            spec.fill(page, who)
            page.wait_for_load_state()
        except Exception as exc:  # Playwright's errors: the form is not the expected one
            raise EnvError(f"could not sign in to {site} at {url}: "
                           f"{str(exc).splitlines()[0][:200]}") from None
        if not spec.signed_in(page):
            raise EnvError(f"{site} at {url} did not accept the account {who.username!r} "
                           f"(set DG_WA_{spec.account.upper()}_USERNAME / _PASSWORD)")
        path.parent.mkdir(parents=True, exist_ok=True)
        context.storage_state(path=str(path))
    finally:
        context.close()
    return {"site": site, "url": url, "account": who.username, "made_at": round(time.time(), 1)}


def merge_states(paths: list[Path], target: Path) -> Path:
    """One ``storage_state`` holding the cookies and origins of several (a task on several
    sites, as WebArena's ``gitlab.reddit_state.json``)."""
    cookies: list[Any] = []
    origins: list[Any] = []
    for path in paths:
        data = json.loads(path.read_text())
        cookies += data.get("cookies", [])
        origins += data.get("origins", [])
    target.write_text(json.dumps({"cookies": cookies, "origins": origins}))
    return target


class SignIns:
    """The run's saved sign-ins: made on first need, renewed when older than ``max_age_s``.

    The logins run on a thread of their own (a sync Playwright object belongs to its thread;
    episodes ask from their browsers' threads).

    Args:
        folder: Where the states are written (one file per site and per set of sites).
        sites: WebArena site name → base URL of the sites to sign in to.
        make_browser: Opens a browser for the logins (called on the logins' thread; closed by
            :meth:`close`).
        logins: The sign-in of each site (default :data:`SITE_LOGINS`).
        environ: Account overrides (default ``os.environ``).
        max_age_s: A state older than this is made again.
    """

    def __init__(self, folder: Path, sites: dict[str, str], make_browser: Callable[[], Any],
                 *, logins: dict[str, SiteLogin] | None = None,
                 environ: dict[str, str] | None = None,
                 max_age_s: float = STATE_MAX_AGE_S) -> None:
        self.folder = folder
        self.sites = sites
        self.make_browser = make_browser
        self.logins = logins or SITE_LOGINS
        self.environ = environ
        self.max_age_s = max_age_s
        self.records: dict[str, dict[str, Any]] = {}
        self._made: dict[str, float] = {}  # when each state was made (monotonic seconds)
        self._browser: Any = None
        self._lock = threading.Lock()
        self._worker: Any = None

    def state_for(self, sites: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
        """The storage-state file signing in to every site of ``sites`` that has a login
        (None: none has), and the records of those logins."""
        wanted = sorted(s for s in sites if s in self.logins and s in self.sites)
        if not wanted:
            return None, []
        with self._lock:
            paths = [self._fresh(site) for site in wanted]
            records = [self.records[site] for site in wanted]
            if len(paths) == 1:
                return str(paths[0]), records
            return str(merge_states(paths, self.folder / f"{'.'.join(wanted)}_state.json")), \
                records

    def _fresh(self, site: str) -> Path:
        path = self.folder / f"{site}_state.json"
        record = self.records.get(site)
        if record is None or time.monotonic() - self._made[site] >= self.max_age_s:
            from dreamgym_agents.adapters.webarena.browser import ThreadWorker

            if self._worker is None:
                self._worker = ThreadWorker("sign-in")

            def login() -> dict[str, Any]:
                if self._browser is None:
                    self._browser = self.make_browser()
                return sign_in(self._browser, site, self.sites[site], path,
                               login=self.logins[site], environ=self.environ)

            self.records[site] = {**self._worker.call(login), "renewed": record is not None}
            self._made[site] = time.monotonic()
        return path

    def close(self) -> None:
        if self._worker is None:
            return

        def stop() -> None:
            from dreamgym_agents.adapters.webarena.chromium import stop_thread_playwright

            if self._browser is not None:
                self._browser.close()
                self._browser = None
            stop_thread_playwright()

        try:
            self._worker.call(stop)
        finally:
            self._worker.stop()
            self._worker = None
