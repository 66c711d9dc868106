"""The HTTP server of the bundled shopping site and its per-episode instances.

URL map (every shop page lives under an instance base ``/i/<instance_id>``)::

    GET  /                              create a signed-in instance, redirect to it (for humans)
    GET  /__admin__/health              {"ok": true, "seed": 0, "instances": N}
    POST /__admin__/instances           body {"login": true} -> {"base_url": ..., "instance_id"}
    DELETE /__admin__/instances/<id>    forget an instance
    GET  <base>/                        home: categories, featured products, search box
    GET  <base>/category/<slug>         listing; ?sort=name|price_asc|price_desc|rating&page=N
    GET  <base>/search?q=...&page=N     search results
    GET  <base>/product/<sku>           product page; POST .../add (qty), POST .../review
    GET  <base>/cart                    cart; POST <base>/cart/update, POST <base>/cart/remove
    GET  <base>/checkout                checkout form; POST places the order
    GET  <base>/checkout/success?order=<id>
    GET  <base>/login                   sign-in form; POST signs in and sets the session cookie
                                        ``shop_session``; POST <base>/logout
    GET  <base>/account                 account info; GET/POST <base>/account/edit
    GET  <base>/account/orders?page=N   order history; GET <base>/account/orders/<id>

The session cookie ``shop_session`` is valid on every instance: an instance visited with it
starts signed in.

Run standalone: ``python -m dreamgym_agents.adapters.shopping.server --port 7770 --seed 0``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

from dreamgym_agents.adapters.shopping import account_pages as acct
from dreamgym_agents.adapters.shopping import pages
from dreamgym_agents.adapters.shopping.data import Catalog, generate_catalog
from dreamgym_agents.adapters.shopping.layout import NotFound, Redirect, View, esc, page
from dreamgym_agents.adapters.shopping.store import Instance, InstanceStore

logger = logging.getLogger(__name__)

Handler = Callable[..., "str | None"]
# (method, path pattern relative to the instance base, handler(view, *groups, query_or_form))
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = [
    (method, re.compile(f"^{pattern}$"), handler)
    for method, pattern, handler in [
        ("GET", "/?", pages.home),
        ("GET", "/category/([A-Za-z0-9_-]+)", pages.category),
        ("GET", "/search", pages.search),
        ("GET", "/product/([A-Za-z0-9_-]+)", pages.product),
        ("POST", "/product/([A-Za-z0-9_-]+)/add", pages.add_to_cart),
        ("POST", "/product/([A-Za-z0-9_-]+)/review", pages.write_review),
        ("GET", "/cart", acct.cart),
        ("POST", "/cart/update", acct.cart_update),
        ("POST", "/cart/remove", acct.cart_remove),
        ("GET", "/checkout", acct.checkout_page),
        ("POST", "/checkout", acct.checkout),
        ("GET", "/checkout/success", acct.checkout_success),
        ("GET", "/login", acct.login_page),
        ("POST", "/login", acct.login),
        ("POST", "/logout", acct.logout),
        ("GET", "/account", acct.account),
        ("GET", "/account/edit", acct.account_edit_page),
        ("POST", "/account/edit", acct.account_edit),
        ("GET", "/account/orders", acct.orders),
        ("GET", "/account/orders/([0-9]+)", acct.order_view),
    ]
]
_INSTANCE_PATH = re.compile(r"^/i/([0-9a-f]+)(/.*)?$")
SESSION_COOKIE = "shop_session"
_ADMIN_INSTANCE = re.compile(r"^/__admin__/instances/([0-9a-f]+)/?$")
_NOT_FOUND_HTML = ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                   "<title>Page Not Found</title></head><body><main><h1>Page Not Found</h1>"
                   "<p>{message}</p></main></body></html>")


class _SiteServer(ThreadingHTTPServer):
    """The stdlib server, logging a failed request instead of printing its traceback."""

    def handle_error(self, request: object, client_address: tuple) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # the browser went away mid-response
            logger.debug("client %s disconnected: %s", client_address, exc)
        else:
            logger.warning("request from %s failed", client_address, exc_info=True)


class ShoppingSite:
    """The bundled WebArena-compatible shopping site, serving isolated per-episode instances.

    Example::

        with ShoppingSite(seed=0) as site:       # starts on 127.0.0.1, a free port
            base = site.new_instance(login=True)  # http://127.0.0.1:PORT/i/<id>
            ...                                   # browse base + "/category/laptops"
            site.drop_instance(base)

    Args:
        seed: Catalog seed (the task set in ``tasks/webarena_shopping`` uses seed 0).
        max_instances: Live instances kept; creating one more drops the oldest.
    """

    def __init__(self, seed: int = 0, max_instances: int = 256) -> None:
        self.seed = seed
        self.catalog: Catalog = generate_catalog(seed)
        self.store = InstanceStore(self.catalog, max_instances=max_instances)
        self.sessions: dict[str, str] = {}  # session cookie -> the account's email
        self._sessions_lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def root_url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:41234``; raises when the site is not started."""
        if self._server is None:
            raise RuntimeError("ShoppingSite is not started: call start() first")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """Alias of :attr:`root_url`."""
        return self.root_url

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve in a daemon thread; ``port=0`` picks a free port. Returns the root URL."""
        if self._server is not None:
            return self.url
        server = _SiteServer((host, port), _RequestHandler)
        server.daemon_threads = True
        server.site = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="shopping-site",
                                        daemon=True)
        self._thread.start()
        logger.info("shopping site (seed %d) serving at %s", self.seed, self.url)
        return self.url

    def stop(self) -> None:
        """Stop serving and close the socket (instances are kept until the object goes)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server, self._thread = None, None

    def __enter__(self) -> ShoppingSite:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def new_session(self, email: str) -> str:
        """A session token for the account ``email`` (the ``shop_session`` cookie's value)."""
        token = secrets.token_hex(16)
        with self._sessions_lock:
            self.sessions[token] = email
        return token

    def session_user(self, token: str | None) -> str | None:
        with self._sessions_lock:
            return self.sessions.get(token or "")

    def new_instance(self, login: bool = True) -> str:
        """Create a fresh isolated instance and return its base URL (``<root>/i/<id>``)."""
        return f"{self.url}/i/{self.store.create(login=login).instance_id}"

    def drop_instance(self, base_url: str) -> bool:
        """Forget the instance of ``base_url`` (or a bare id); return whether it existed."""
        instance_id = _instance_id(base_url)
        return self.store.drop(instance_id) if instance_id else False

    def instance(self, base_url: str) -> Instance | None:
        """The live :class:`Instance` behind ``base_url`` (for in-process checks)."""
        instance_id = _instance_id(base_url)
        return self.store.get(instance_id) if instance_id else None


def _instance_id(base_url: str) -> str | None:
    if re.fullmatch(r"[0-9a-f]+", base_url):
        return base_url
    match = _INSTANCE_PATH.match(urlsplit(base_url).path)
    return match.group(1) if match else None


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "OneStopMarket/1.0"
    timeout = 60  # seconds; closes idle keep-alive connections so their threads end

    @property
    def site(self) -> ShoppingSite:
        return self.server.site  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        logger.debug("%s - %s", self.address_string(), format % args)

    # ---- dispatch --------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        body = self._read_body()
        try:
            if parts.path.startswith("/__admin__/"):
                self._admin(method, parts.path, body)
            elif parts.path == "/" and method == "GET":
                instance = self.site.store.create(login=True)
                self._redirect(f"/i/{instance.instance_id}/")
            elif match := _INSTANCE_PATH.match(parts.path):
                self._instance(method, match.group(1), match.group(2) or "/", parts.query, body)
            else:
                self._send(404, _NOT_FOUND_HTML.format(message="There is no page here."))
        except Exception:  # a bug in a page: answer 500 and keep serving other requests
            logger.exception("error while serving %s %s", method, self.path)
            self._send(500, _NOT_FOUND_HTML.format(message="Internal server error.")
                       .replace("Page Not Found", "Server Error"))

    def _instance(self, method: str, instance_id: str, path: str, query: str,
                  body: bytes) -> None:
        inst = self.site.store.get(instance_id)
        if inst is None:
            self._send(404, _NOT_FOUND_HTML.format(
                message=f"Unknown or expired shop instance {esc(instance_id)}."))
            return
        view = View(inst, f"/i/{instance_id}")
        params = query if method == "GET" else body.decode("utf-8", "replace")
        fields = {k: v[0] for k, v in parse_qs(params, keep_blank_values=True).items()}
        cookies = SimpleCookie(self.headers.get("Cookie") or "")
        session = cookies[SESSION_COOKIE].value if SESSION_COOKIE in cookies else None
        with inst.lock:
            email = self.site.session_user(session)
            if email is not None:
                inst.adopt(email)  # a browser signed in before (a saved storage state)
            before = inst.user
            for route_method, pattern, handler in ROUTES:
                match = pattern.match(path)
                if match and route_method == method:
                    try:
                        html = handler(view, *match.groups(), fields)
                    except Redirect as redirect:
                        signed_in = inst.user is not None and inst.user != before
                        token = self.site.new_session(inst.user) if signed_in else None
                        self._redirect(redirect.location, session=token)
                        return
                    except NotFound as missing:
                        html = page(view, "Page Not Found",
                                    f"<h1>Page Not Found</h1><p>{esc(missing)}</p>")
                        self._send(404, html)
                        return
                    self._send(200, html or "")
                    return
            html = page(view, "Page Not Found",
                        "<h1>Page Not Found</h1><p>There is no page at this address.</p>")
        self._send(404 if method == "GET" else 405, html)

    def _admin(self, method: str, path: str, body: bytes) -> None:
        if path.rstrip("/") == "/__admin__/health" and method == "GET":
            self._json(200, {"ok": True, "seed": self.site.seed,
                             "instances": len(self.site.store)})
        elif path.rstrip("/") == "/__admin__/instances" and method == "POST":
            try:
                options = json.loads(body or b"{}")
            except json.JSONDecodeError:
                self._json(400, {"ok": False, "error": "body must be JSON like {\"login\": true}"})
                return
            instance = self.site.store.create(login=bool(options.get("login", True)))
            host = self.headers.get("Host") or self.site.url.split("//", 1)[1]
            self._json(201, {"base_url": f"http://{host}/i/{instance.instance_id}",
                             "instance_id": instance.instance_id})
        elif (match := _ADMIN_INSTANCE.match(path)) and method == "DELETE":
            existed = self.site.store.drop(match.group(1))
            self._json(200 if existed else 404, {"ok": existed})
        else:
            self._json(404, {"ok": False, "error": f"no admin endpoint {method} {path}"})

    # ---- responses ---------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, html: str, content_type: str = "text/html; charset=utf-8") -> None:
        data = html.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload), "application/json")

    def _redirect(self, location: str, session: str | None = None) -> None:
        self.send_response(303)
        self.send_header("Location", location)
        if session:  # a sign-in: the browser keeps it for every instance of the site
            self.send_header("Set-Cookie", f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; "
                                           "SameSite=Lax")
        self.send_header("Content-Length", "0")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()


def main(argv: list[str] | None = None) -> None:
    """Serve the site until interrupted (CLI entry point)."""
    parser = argparse.ArgumentParser(description="Serve the bundled shopping site.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7770)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-instances", type=int, default=256)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    site = ShoppingSite(seed=args.seed, max_instances=args.max_instances)
    url = site.start(args.host, args.port)
    print(f"Shopping site (seed {args.seed}) at {url} — open {url}/ in a browser; Ctrl-C stops.")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()


if __name__ == "__main__":
    main()
