"""Every WebArena task scorable or refused before it runs: the up-front check on WebArena's and
WebArena-Lite's own files, WebArena's accounts, and the shopping REST helpers against a Magento
REST stand-in served on 127.0.0.1."""

from __future__ import annotations

import collections
import http.server
import json
import threading
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, dg

from dreamgym_agents.adapters.webarena.accounts import Account, account, shopping_helpers
from dreamgym_agents.adapters.webarena.family import WebArenaFamily, load_config_file
from dreamgym_agents.adapters.webarena.page_helper import helper_names
from dreamgym_agents.episodes.env import EnvConfig
from dreamgym_agents.errors import EnvError

WEBARENA = Path(__file__).resolve().parents[3] / "shared" / "data" / "webarena"
REST_TASKS = [436, 437, 438, 439, 440, 506, 507, 508, 509, 510, 585, 586, 587, 588, 589]


def shared(name: str) -> Path:
    path = WEBARENA / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    return path


def test_every_task_of_both_files_is_scorable_or_refused_with_its_reason():
    family = WebArenaFamily(environ={})  # no site variables: the bundled shop
    full = load_config_file(shared("test.raw.json"))
    lite = load_config_file(shared("test_webarena_lite.raw.json"))
    assert (len(full), len(lite)) == (812, 165)
    refused = family.unscorable(full, EnvConfig())
    reasons = collections.Counter(refused.values())
    # 82 fuzzy_match tasks need the judge; the 36 unachievable (N/A) ones do not
    assert reasons["needs an LLM judge (pass --judge MODEL)"] == 82
    rest = sorted(int(k) for k, v in refused.items() if "REST API" in v)
    assert rest == REST_TASKS  # the Magento admin API helpers, on no real shop
    assert len(refused) == 82 + 15
    # a judge and a real shopping site leave nothing unscorable
    real = WebArenaFamily(environ={"SHOPPING": "http://127.0.0.1:9"})
    assert real.unscorable(full + lite, EnvConfig(judge_model="openai/judge")) == {}
    lite_refused = family.unscorable(lite, EnvConfig())
    assert {int(k) for k in lite_refused} >= {123, 139, 140, 142}  # fuzzy_match in program_html


def test_eval_refuses_unscorable_tasks_in_one_line_before_a_step(tmp_path):
    proc = dg("eval", "--task", "webarena", "--tasks", str(shared("test.raw.json")),
              "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "97 of 812 task(s) cannot be scored here",
                          "82 needs an LLM judge", "15 checks the shopping site's admin REST API",
                          "--skip-unscorable")
    assert not (tmp_path / "o").exists()
    # every task scorable (a judge, a real shop) but the sites down: one line, before a step
    down = {v: "http://127.0.0.1:9" for v in ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB",
                                             "MAP", "WIKIPEDIA")}
    args = ("eval", "--task", "webarena", "--tasks", str(shared("test.raw.json")))
    proc = dg(*args, "--judge", "openai/judge", "--out", str(tmp_path / "o2"), env=down)
    assert_one_line_error(proc, "is unreachable")
    # --skip-unscorable: the others are named in a warning and left out
    proc = dg(*args, "--skip-unscorable", "--out", str(tmp_path / "o3"), env=down)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    warning, error = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "82 of 812 task(s) cannot be scored" in warning and "left out" in warning
    assert "is unreachable" in error


def test_helper_names_and_accounts():
    config = {"eval": {"program_html": [
        {"url": "func:shopping_get_latest_order_url()", "locator": ""},
        {"url": "last", "locator": "func:get_query_text(__page__, '.x')"}]}}
    assert helper_names(config) == {"shopping_get_latest_order_url", "get_query_text"}
    admin = account("shopping_site_admin", {})
    assert (admin.username, admin.password) == ("admin", "admin1234")
    assert "admin1234" not in repr(admin)  # a password never reaches a log line
    other = account("shopping_site_admin", {"DG_WA_SHOPPING_SITE_ADMIN_PASSWORD": "s3cret"})
    assert other.password == "s3cret" and other.username == "admin"


class Magento(http.server.BaseHTTPRequestHandler):
    """The three REST routes WebArena's shopping helpers call, with one admin account."""

    token = "tok-123"

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/rest/default/V1/integration/admin/token" and body == {
                "username": "admin", "password": "admin1234"}:
            return self._send(200, self.token)
        return self._send(401, {"message": "The account sign-in was incorrect"})

    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(401, {"message": "unauthorized"})
        if self.path.startswith("/rest/V1/orders?") and "DESC" in self.path:
            return self._send(200, {"items": [{"increment_id": "000000190"}]})
        if self.path == "/rest/V1/products/B07%2FX/reviews":
            return self._send(200, [
                {"nickname": "Emma", "ratings": [{"rating_name": "Rating", "percent": 60}]},
                {"nickname": "Lily", "ratings": [{"rating_name": "Rating", "percent": 80}]}])
        if self.path == "/rest/V1/products/EMPTY/reviews":
            return self._send(200, [])
        return self._send(404, {"message": "no route"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def magento():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Magento)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_shopping_rest_helpers_query_magentos_api_as_webarena_does(magento):
    helpers = shopping_helpers(magento + "/", account("shopping_site_admin", {}))
    assert helpers["shopping_get_latest_order_url"]() == (
        f"{magento}/sales/order/view/order_id/190/")
    assert helpers["shopping_get_sku_latest_review_author"]("B07/X") == "Lily"  # the last one
    assert helpers["shopping_get_sku_latest_review_rating"]("B07/X") == "80"
    assert helpers["shopping_get_sku_latest_review_author"]("EMPTY") == ""
    wrong = shopping_helpers(magento, Account("admin", "nope"))
    with pytest.raises(EnvError, match="answered 401") as err:
        wrong["shopping_get_latest_order_url"]()
    assert "nope" not in str(err.value)


def test_the_site_reset_hook_is_a_url_or_a_command(tmp_path, magento):
    import sys

    from dreamgym_agents.adapters.webarena.accounts import reset_sites

    marker = tmp_path / "reset"
    reset_sites(f"{sys.executable} -c \"open('{marker}', 'w').write('done')\"")
    assert marker.read_text() == "done"
    with pytest.raises(EnvError, match="exited 3"):
        reset_sites(f"{sys.executable} -c \"raise SystemExit(3)\"")
    with pytest.raises(EnvError, match="site reset at"):
        reset_sites(f"{magento}/no-such-reset")  # the stand-in answers 401: no reset there


def test_real_webarena_tasks_run_on_the_bundled_shop_only_when_asked():
    from dreamgym_agents.errors import ConfigError

    shop = [t for t in load_config_file(shared("test.raw.json"))
            if t.config["sites"] == ["shopping"]][:2]
    family = WebArenaFamily(environ={})
    with pytest.raises(ConfigError, match="real WebArena tasks .* DG_WEBARENA_ON_BUNDLED_SHOP"):
        family.prepare(EnvConfig(), shop)
    asked = WebArenaFamily(environ={"DG_WEBARENA_ON_BUNDLED_SHOP": "1"})
    try:
        assert "bundled shopping site" in asked.prepare(EnvConfig(), shop)
    finally:
        asked.close()
