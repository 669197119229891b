"""The daemon's web console (coordinator-daemon/console/; docs/ops.md, "Console") in a real
headless browser: Debian's chromium driven by Selenium through Debian's chromedriver
(scripts/bootstrap-browser.sh), against a real daemon with real PostgreSQL and MariaDB.
Every check reads the page's DOM as the browser built it from the API (elements and their
text), never the HTML source: an empty or broken page fails.

The operator credential sees nodes, resources, the decision rate, an in-doubt transaction
made for real (both branches prepared, its commit never sent), opens its timeline and
forces it committed; the client and metrics credentials see what they may read, get no
force button, and the daemon refuses their force call anyway.

Skipped only when the browser is absent and COTX_REQUIRE_BROWSER is unset (scripts/test.sh
sets it: there a missing browser fails)."""
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request

import pytest
from cotx import Coordinator
from cotest.coord import make_daemon, my_prepared, pg_prepared, wait_until

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CLIENT, OPERATOR, METRICS = "client-" + "k" * 16, "operator-" + "p" * 16, "metrics-" + "q" * 16


def _missing() -> list[str]:
    out = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        out.append("the selenium package (requirements.txt)")
    return out


if _missing() and not os.environ.get("COTX_REQUIRE_BROWSER"):
    pytest.skip(f"no headless browser: {', '.join(_missing())} missing (bash scripts/bootstrap-browser.sh installs "
                "chromium and chromium-driver; COTX_REQUIRE_BROWSER=1 makes this a failure)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def daemon(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS console_t(k text PRIMARY KEY)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS console_t(k varchar(40) PRIMARY KEY) ENGINE=InnoDB")
    d = make_daemon(pg, mariadb, auth={"client_token": CLIENT, "operator_token": OPERATOR,
                                       "metrics_token": METRICS}).start()
    yield d
    d.destroy()


@pytest.fixture(scope="module")
def browser():
    assert not _missing(), f"COTX_REQUIRE_BROWSER is set but {', '.join(_missing())} missing"
    profile = tempfile.mkdtemp(prefix="cotx-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM  # with the driver's path below Selenium looks for (downloads) nothing
    for a in ("--headless=new", "--no-sandbox",  # tests run as root: chromium's sandbox refuses root
              "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run", "--disable-extensions",
              "--window-size=1400,1600", f"--user-data-dir={profile}"):
        opts.add_argument(a)
    # The page's console messages (a CSP violation or a script error lands there).
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


# --- helpers --------------------------------------------------------------------------------

def wait(drv, pred, what, timeout=20):
    try:
        return WebDriverWait(drv, timeout, poll_frequency=0.1).until(lambda d: pred())
    except Exception as e:
        page = drv.execute_script("return document.body ? document.body.innerText : document.documentElement.outerHTML")
        raise AssertionError(f"timed out waiting for {what}; the page shows:\n{page[:3000]}") from e


# The page rebuilds its tables at every poll: each read below is one script run in the page,
# so it sees one version of them (element handles kept across a poll would be stale).

def text(drv, css):
    """The rendered text of an element (innerText: what is visible)."""
    return drv.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : null;", css)


def rows(drv, css, attr=None):
    """The rows of a table as lists of cell texts (with `attr`: only rows with that data-gtid)."""
    return drv.execute_script("""
        return [...document.querySelectorAll(arguments[0] + ' tbody tr')]
          .filter(tr => arguments[1] === null || tr.dataset.gtid === arguments[1])
          .map(tr => [...tr.cells].map(td => td.innerText.trim()));""", css, attr)


def items(drv, css):
    return drv.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim());", css)


def click(drv, css, what):
    """A real click, retried when the poll replaced the element between finding and clicking."""
    def attempt():
        try:
            drv.find_element(By.CSS_SELECTOR, css).click()
            return True
        except (StaleElementReferenceException, NoSuchElementException):
            return False
    wait(drv, attempt, what)


def open_console(drv, d, token):
    """A fresh page, no credential stored, then `token` pasted and submitted."""
    drv.get(d.url + "/console")
    drv.execute_script("sessionStorage.clear()")
    drv.get(d.url + "/console")
    wait(drv, lambda: drv.find_element(By.ID, "token").is_displayed(), "the credential field")
    field = drv.find_element(By.ID, "token")
    field.send_keys(token)
    drv.find_element(By.ID, "connect").click()
    assert field.get_attribute("value") == "", "the pasted credential stays in the field"
    wait(drv, lambda: int(drv.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed") or 0) >= 1, "a first refresh")


def script_errors(drv):
    """The page's errors: a script exception, a CSP violation. Network answers (a 403 to a
    read-only credential, the 401 to the browser's own /favicon.ico) are checked elsewhere."""
    return [m for m in drv.get_log("browser") if m["level"] == "SEVERE" and "Failed to load resource" not in m["message"]]


def make_in_doubt(d, pg, mariadb, key):
    """A transaction with both branches prepared and reported, whose commit never comes
    (the application stopped there): in doubt until someone decides. Its sessions are
    closed, so the daemon's own connections can finish the branches."""
    tx = Coordinator(d.url, CLIENT).transaction(timeout_ms=300000)
    pc, mc = pg.connect(), mariadb.connect()
    with tx.branch(pc, "pg"):
        pc.execute("INSERT INTO console_t VALUES (%s)", (key,))
    with tx.branch(mc, "my"):
        mc.cursor().execute("INSERT INTO console_t VALUES (%s)", (key,))
    assert len(tx.prepare_all(report=True)) == 2
    pc.close()
    mc.close()
    return tx.gtid


def commit_some(d, pg, mariadb, n, prefix):
    c = Coordinator(d.url, CLIENT)
    for i in range(n):
        pc, mc = pg.connect(), mariadb.connect()
        with c.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO console_t VALUES (%s)", (f"{prefix}{i}",))
            with tx.branch(mc, "my"):
                mc.cursor().execute("INSERT INTO console_t VALUES (%s)", (f"{prefix}{i}",))
        assert tx.outcome == "commit"
        pc.close()
        mc.close()


def api(d, method, path, token, body=None):
    req = urllib.request.Request(d.url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def rate(drv):
    try:
        return float(text(drv, "#rate-value"))
    except ValueError:
        return None


# --- the tests ------------------------------------------------------------------------------

def test_console_is_static_with_a_strict_policy(daemon):
    """The page and its files need no credential and hold no data; the policy lets only
    our own script run and talk to this daemon only."""
    for path, ctype in (("/console", "text/html"), ("/console/app.js", "text/javascript"), ("/console/app.css", "text/css")):
        with urllib.request.urlopen(daemon.url + path, timeout=10) as r:
            assert r.status == 200 and r.headers["content-type"].startswith(ctype), (path, r.headers)
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, csp
            assert r.headers["x-content-type-options"] == "nosniff"


def test_operator_sees_the_deployment_and_forces_an_in_doubt_transaction(daemon, pg, mariadb, browser):
    drv = browser
    gtid = make_in_doubt(daemon, pg, mariadb, "doubt-1")
    commit_some(daemon, pg, mariadb, 3, "before-")

    # Before any credential: the page shows nothing (the checks below see data, not a shell).
    drv.get(daemon.url + "/console")
    drv.execute_script("sessionStorage.clear()")
    drv.get(daemon.url + "/console")
    assert rows(drv, "#nodes") == [] and rows(drv, "#in-doubt") == [] and "Paste a credential" in text(drv, "#whoami")

    open_console(drv, daemon, OPERATOR)
    wait(drv, lambda: "Operator credential" in text(drv, "#whoami"), "the operator role to be recognized")

    # Nodes and leases: this daemon's own node, its lease running.
    node = wait(drv, lambda: [r for r in rows(drv, "#nodes") if r and r[0] == daemon.node_id], "this daemon's node row")[0]
    assert node[1].startswith(daemon.node_id + "@") and node[2] == daemon.url and node[4] == "own node", node
    assert node[3].endswith((" s", " min")) and float(node[3].split()[0]) > 0, node
    assert daemon.node_id in text(drv, "#node-id")

    # Resources and their health; the in-doubt transaction's prepared branches are counted.
    res = wait(drv, lambda: {r[0]: r for r in rows(drv, "#resources") if len(r) == 4 and r[2] == "up"} or None, "resources up")
    assert set(res) == {"pg", "my"}, rows(drv, "#resources")
    assert res["pg"][1] == "postgres" and res["my"][1] == "mariadb"
    assert int(res["pg"][3]) >= 1 and int(res["my"][3]) >= 1, res

    # The in-doubt transaction: its row, its age, both branches prepared.
    cells = wait(drv, lambda: rows(drv, "#in-doubt", gtid), "the in-doubt row")[0]
    assert cells[0] == gtid and cells[1].endswith(("s", "min")) and cells[2] == "active", cells
    branches = items(drv, f'#in-doubt tr[data-gtid="{gtid}"] li')
    assert len(branches) == 2 and all(" prepared" in b for b in branches), branches
    assert any(b.startswith("pg/") for b in branches) and any(b.startswith("my/") for b in branches), branches

    # The decision rate: a number once two polls were compared, above zero while
    # transactions are decided.
    wait(drv, lambda: rate(drv) is not None, "a decision rate")
    assert "commit 3" in text(drv, "#rate-totals"), text(drv, "#rate-totals")
    commit_some(daemon, pg, mariadb, 4, "during-")
    wait(drv, lambda: (rate(drv) or 0) > 0, "a decision rate above zero after 4 commits")
    assert "commit 7" in text(drv, "#rate-totals")

    # Its timeline, then force commit with the operator credential.
    click(drv, f'#in-doubt tr[data-gtid="{gtid}"] button.open-timeline', "the Timeline button")
    wait(drv, lambda: drv.find_element(By.ID, "tx").is_displayed(), "the transaction's timeline")
    assert text(drv, "#tx-state") == "active" and text(drv, "#tx-decision") == "none yet"
    events = items(drv, "#tx-events li")
    assert any(e.endswith(" begun") for e in events) and not any("decided" in e for e in events), events
    br = rows(drv, "#tx-branches")
    assert sorted(r[1] for r in br) == ["my", "pg"] and all(r[3] == "prepared" for r in br), br
    assert drv.find_element(By.ID, "force-commit").is_displayed() and drv.find_element(By.ID, "force-abort").is_displayed()

    drv.find_element(By.ID, "force-reason").send_keys("console test: the application never committed")
    drv.find_element(By.ID, "force-commit").click()
    wait(drv, lambda: text(drv, "#force-result").startswith("Forced commit: commit"), "the force call's answer")
    wait(drv, lambda: text(drv, "#tx-state") == "committed" and all(r[3] == "finished" for r in rows(drv, "#tx-branches")),
         "the branches finished after the forced commit")
    assert all(r[4] == "commit" for r in rows(drv, "#tx-branches"))
    events = wait(drv, lambda: [e for e in items(drv, "#tx-events li") if "forced commit" in e] and items(drv, "#tx-events li"),
                  "the forced commit in the timeline")
    assert any("decided commit" in e for e in events) and any("operator console forced commit" in e for e in events), events
    wait(drv, lambda: not rows(drv, "#in-doubt", gtid), "the row to leave in-doubt")
    assert any(r[1] == gtid and r[2] == "commit" and r[3] == "console" for r in rows(drv, "#audit")), rows(drv, "#audit")

    # Real effect: both databases hold the row, nothing is left prepared.
    assert pg.sql("SELECT k FROM console_t WHERE k = 'doubt-1'") and mariadb.sql("SELECT k FROM console_t WHERE k = 'doubt-1'")
    assert not [g for g in pg_prepared(pg) if gtid in g] and not my_prepared(mariadb)
    assert script_errors(drv) == []


@pytest.mark.parametrize("who", ["client", "metrics"])
def test_read_only_credentials_get_no_force(daemon, pg, mariadb, browser, who):
    drv = browser
    token = {"client": CLIENT, "metrics": METRICS}[who]
    gtid = make_in_doubt(daemon, pg, mariadb, f"doubt-{who}")
    try:
        open_console(drv, daemon, token)
        wait(drv, lambda: "Read-only credential" in text(drv, "#whoami"), "the read-only role to be recognized")
        # The operator's lists are refused by the daemon and say so; nothing to click.
        wait(drv, lambda: "Needs the operator credential" in text(drv, "#in-doubt .status"), "in-doubt refused")
        assert rows(drv, "#in-doubt") == [] and rows(drv, "#nodes") == [] and rows(drv, "#audit") == []
        assert not drv.find_elements(By.CSS_SELECTOR, "button.open-timeline")
        # Health is public: shown from /healthz.
        health = wait(drv, lambda: {r[0]: r[2] for r in rows(drv, "#resources")} or None, "resource health")
        assert health == {"pg": "up", "my": "up"}, health
        assert "need the operator credential" in text(drv, "#resources .status")
        assert daemon.node_id in text(drv, "#node-id"), "the node id from /healthz"
        if who == "metrics":
            wait(drv, lambda: rate(drv) is not None, "the decision rate (metrics credential)")
        else:
            wait(drv, lambda: "Needs the metrics or operator credential" in text(drv, "#rate .status"), "the rate refused")

        drv.find_element(By.ID, "gtid").send_keys(gtid)
        drv.find_element(By.ID, "show").click()
        if who == "client":
            # A client may read one transaction: its timeline shows, without the force form.
            wait(drv, lambda: drv.find_element(By.ID, "tx").is_displayed(), "the timeline")
            assert text(drv, "#tx-state") == "active" and len(rows(drv, "#tx-branches")) == 2
        else:
            wait(drv, lambda: "Needs a client or operator credential" in text(drv, "#timeline .status"), "the read refused")
            assert not drv.find_element(By.ID, "tx").is_displayed()
        assert not drv.find_element(By.ID, "force-commit").is_displayed()
        assert not drv.find_element(By.ID, "force-abort").is_displayed()

        # The button's absence is a courtesy: the daemon refuses the call from this page too.
        status = drv.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/v1/admin/force', {method: 'POST', headers: {'Authorization': 'Bearer ' + sessionStorage.getItem('cotx-console-token'),
                  'Content-Type': 'application/json'},
                  body: JSON.stringify({gtid: arguments[0], outcome: 'commit', operator: 'x', reason: 'x', confirm: true})})
              .then(r => done(r.status), e => done(String(e)));""", gtid)
        assert status == 403, status
        assert api(daemon, "GET", f"/v1/transactions/{gtid}", OPERATOR)[1]["state"] == "active"
        assert script_errors(drv) == []
    finally:
        st, body = api(daemon, "POST", "/v1/admin/force", OPERATOR,
                       {"gtid": gtid, "outcome": "abort", "operator": "t", "reason": "cleanup", "confirm": True})
        assert st == 200, body
        wait_until(lambda: not [g for g in pg_prepared(pg) if gtid in g], what="the aborted branches rolled back")


def test_data_is_shown_as_text(daemon, browser):
    """Markup in the data (an operator's name and reason, stored in the audit log and the
    abort reason) is shown as text: no element is built from it, nothing runs."""
    drv = browser
    evil = '<img src=x id=injected onerror="document.title=1">'
    st, begun = api(daemon, "POST", "/v1/transactions", CLIENT, {})
    assert st == 201, begun
    gtid = begun["gtid"]
    st, body = api(daemon, "POST", "/v1/admin/force", OPERATOR,
                   {"gtid": gtid, "outcome": "abort", "operator": evil, "reason": evil, "confirm": True})
    assert st == 200, body
    open_console(drv, daemon, OPERATOR)
    audit = wait(drv, lambda: [r for r in rows(drv, "#audit") if r[1] == gtid], "the audit rows")
    assert all(r[3] == evil and r[4] == evil for r in audit), audit
    drv.find_element(By.ID, "gtid").send_keys(gtid)
    click(drv, "#show", "Show")
    wait(drv, lambda: text(drv, "#tx-state") == "aborted" and evil in (text(drv, "#tx-reason") or ""), "the abort reason")
    assert any(evil in e for e in items(drv, "#tx-events li"))
    assert not drv.find_elements(By.ID, "injected") and not drv.find_elements(By.CSS_SELECTOR, "img")
    assert drv.title == "cotx coordinator"
    assert script_errors(drv) == []


def test_operator_sees_a_lock_wait(daemon, pg, browser):
    """A local transaction holds a row; a global one waits for it past the deadlock
    detector's threshold: the console's "Lock waits" shows the global transaction waiting
    at pg for that session (the detector's last read, /v1/waits), and nothing once the
    local transaction ends."""
    import threading
    drv = browser
    pg.sql("INSERT INTO console_t VALUES ('held') ON CONFLICT DO NOTHING")
    local = pg.connect(autocommit=False)
    local.execute("DELETE FROM console_t WHERE k = 'held'")
    holder = local.execute("SELECT pg_backend_pid()").fetchone()[0]
    tx = Coordinator(daemon.url, CLIENT).transaction()
    conn = pg.connect()

    def waiter():
        try:
            with tx.branch(conn, "pg"):
                conn.execute("UPDATE console_t SET k = 'held2' WHERE k = 'held'")
        except Exception:  # noqa: BLE001 - the wait is what is tested, not how it ends
            pass

    t = threading.Thread(target=waiter)
    t.start()
    try:
        open_console(drv, daemon, OPERATOR)
        wait(drv, lambda: tx.gtid and any(r[0] == tx.gtid for r in rows(drv, "#waits")), "the wait in the console")
        row = next(r for r in rows(drv, "#waits") if r[0] == tx.gtid)
        assert row[1] == f"session {holder} at pg (no global transaction)" and row[2] == "pg", row
        assert "console_t" in row[3], row
    finally:
        local.rollback()
        local.close()
        t.join(30)
        conn.close()
    wait(drv, lambda: not any(r[0] == tx.gtid for r in rows(drv, "#waits")), "the wait gone", timeout=30)
    assert not script_errors(drv)
