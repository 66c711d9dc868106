"""Signing in like WebArena: each real site's form (served on 127.0.0.1 with that site's
fields, labels and buttons) filled with WebArena's accounts, the session saved as a storage
state and renewed when old; and the bundled shop end to end (its customer signed in through its
form, the cookie loaded into every episode; a signed-out agent fails account tasks)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from pathlib import Path

import pytest
from test_eval_e2e import dg

from dreamgym_agents.adapters.webarena.login import SITE_LOGINS, SignIns, merge_states
from dreamgym_agents.errors import EnvError

pytestmark = pytest.mark.browser

FORMS = {  # the sign-in page of each WebArena site, as its fields and buttons are named
    "/customer/account/login/": (
        '<label for="email">Email</label><input id="email" name="login[username]">'
        '<label for="pass">Password</label><input id="pass" type="password" '
        'name="login[password]"><button type="submit">Sign In</button>',
        ("login[username]", "login[password]"), "emma.lopez@gmail.com", "Password.123",
        "/customer/account/"),
    "/admin": (
        '<input placeholder="user name" name="login[username]">'
        '<input placeholder="password" type="password" name="login[password]">'
        '<button type="submit">Sign in</button>',
        ("login[username]", "login[password]"), "admin", "admin1234", "/admin/dashboard/"),
    "/login": (
        '<label for="u">Username</label><input id="u" name="_username">'
        '<label for="p">Password</label><input id="p" type="password" name="_password">'
        '<button type="submit">Log in</button>',
        ("_username", "_password"), "MarvelsGrantMan136", "test1234", "/"),
    "/users/sign_in": (
        '<input data-testid="username-field" name="user[login]">'
        '<input data-testid="password-field" type="password" name="user[password]">'
        '<button data-testid="sign-in-button" type="submit">Sign in</button>',
        ("user[login]", "user[password]"), "byteblaze", "hello1234", "/"),
}


class Sites(http.server.BaseHTTPRequestHandler):
    def _page(self, body: str, cookie: str | None = None, code: int = 200) -> None:
        data = f"<!doctype html><html><body>{body}</body></html>".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        if cookie:
            self.send_header("Set-Cookie", f"{cookie}; Path=/")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        if path in FORMS:
            return self._page(f'<form method="post" action="{path}">{FORMS[path][0]}</form>')
        return self._page("<h1>Welcome back</h1>")

    def do_POST(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        _, (user_field, pass_field), user, password, after = FORMS[path]
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"]))
                                     .decode())
        if form.get(user_field) == [user] and form.get(pass_field) == [password]:
            self.send_response(303)
            self.send_header("Location", after)
            self.send_header("Set-Cookie", f"session{len(path)}=ok; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self._page(f'<p>Invalid</p><form method="post" action="{path}">'
                          f'{FORMS[path][0]}</form>')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def sites():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sites)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def signins(tmp_path: Path, base: str, **kw) -> SignIns:
    from dreamgym_agents.adapters.webarena.chromium import thread_playwright

    return SignIns(tmp_path, {s: base for s in SITE_LOGINS},
                   lambda: thread_playwright().chromium.launch(headless=True), **kw)


def test_each_real_sites_form_signs_in_with_webarenas_account(tmp_path, sites):
    made = signins(tmp_path, sites, environ={})
    try:
        for site in SITE_LOGINS:
            path, [record] = made.state_for([site])
            cookies = json.loads(Path(path).read_text())["cookies"]
            assert any(c["value"] == "ok" for c in cookies), site
            assert record["site"] == site and not record["renewed"]
        # a task on two sites gets both sessions in one state
        both, records = made.state_for(["reddit", "gitlab"])
        assert len(json.loads(Path(both).read_text())["cookies"]) == 2 and len(records) == 2
        text = json.dumps(made.records)
        assert all(password not in text for *_, password, _ in FORMS.values())
    finally:
        made.close()


def test_gitlab_signs_in_after_browsergym_changed_playwrights_test_id_attribute(tmp_path,
                                                                                sites):
    """BrowserGym sets the Playwright instance's test-id attribute to its own ("bid"): the
    GitLab form's ``data-testid`` fields are still found (a real WebArena run signs in from
    the thread its BrowserGym episodes use)."""
    from dreamgym_agents.adapters.webarena.chromium import thread_playwright

    def launch():
        pw = thread_playwright()
        pw.selectors.set_test_id_attribute("bid")  # what browsergym.core.env does
        return pw.chromium.launch(headless=True)

    made = SignIns(tmp_path, {s: sites for s in SITE_LOGINS}, launch, environ={})
    try:
        path, [record] = made.state_for(["gitlab"])
        assert any(c["value"] == "ok" for c in json.loads(Path(path).read_text())["cookies"])
    finally:
        made.close()  # its thread's Playwright instance, and its setting, end with it


def test_an_old_session_is_renewed_and_a_wrong_account_is_one_clear_error(tmp_path, sites):
    made = signins(tmp_path, sites, environ={}, max_age_s=0.0)
    try:
        made.state_for(["reddit"])
        _, [record] = made.state_for(["reddit"])
        assert record["renewed"]
    finally:
        made.close()
    wrong = signins(tmp_path / "w", sites, environ={"DG_WA_GITLAB_PASSWORD": "nope"})
    try:
        with pytest.raises(EnvError, match="did not accept the account 'byteblaze'") as err:
            wrong.state_for(["gitlab"])
        assert "nope" not in str(err.value)
    finally:
        wrong.close()


def test_merge_states(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"cookies": [{"name": "x"}], "origins": []}))
    b.write_text(json.dumps({"cookies": [{"name": "y"}], "origins": [{"origin": "o"}]}))
    merged = json.loads(merge_states([a, b], tmp_path / "ab.json").read_text())
    assert [c["name"] for c in merged["cookies"]] == ["x", "y"] and len(merged["origins"]) == 1


def test_the_bundled_shop_signs_in_through_its_form_and_a_signed_out_agent_fails(tmp_path):
    tasks = [t for t in json.loads((Path(__file__).resolve().parents[2] / "tasks" /
                                    "webarena_shopping" / "test.json").read_text())
             if t.get("require_login")][:2]
    signed = tmp_path / "signed.json"
    signed.write_text(json.dumps(tasks))
    proc = dg("eval", "--task", "webarena", "--agent", "oracle", "--tasks", str(signed),
              "--out", str(tmp_path / "in"))
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "in" / "trajectories.jsonl").read_text()
    episodes = [json.loads(line) for line in lines.splitlines()]
    assert all(e["success"] for e in episodes)
    assert all("button 'Sign Out'" in e["transitions"][0]["state"] for e in episodes)
    assert json.loads((tmp_path / "in" / "summary.json").read_text())["invalid_actions"] == 0
    [record] = episodes[0]["transitions"][0]["info"]["sign_in"]
    assert record["account"] == "emma.lopez@example.com" and "Password.123" not in lines
    # the same account tasks, signed out: the account's orders are out of reach (the oracle
    # replays the clicks of its recorded solution: they find no "My Orders" link)
    out = tmp_path / "out.json"
    out.write_text(json.dumps([{**t, "require_login": False} for t in tasks]))
    proc = dg("eval", "--task", "webarena", "--agent", "oracle", "--tasks", str(out),
              "--out", str(tmp_path / "signed-out"))
    assert proc.returncode == 0, proc.stderr
    played = [json.loads(line) for line in
              (tmp_path / "signed-out" / "trajectories.jsonl").read_text().splitlines()]
    assert all("button 'Sign Out'" not in e["transitions"][0]["state"] for e in played)
    assert all(any("My Orders" in s["action"] and not s["valid"] for s in e["transitions"])
               for e in played)
