"""Operations files in deploy/, checked with the real tools: the alert rules with promtool
(syntax and unit tests, and a broken rule the unit tests catch), the production config
with the daemon's check-config, the systemd unit with systemd-analyze, and a real
Prometheus (Debian's, started on a free loopback port) scraping a real daemon through
deploy/prometheus/prometheus.yml: after a few transactions every query of the Grafana
dashboard returns data, the rules evaluate, and an unreachable resource makes
CotxResourceDown pending for that resource only."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from cotest.daemon import Daemon, find_binary
from cotest.coord import metrics_text, wait_until
from cotest import free_port
from cotx import Coordinator

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "cotx-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "cotx-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "cotx-dashboard.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")

pytestmark = pytest.mark.skipif(
    not (PROMTOOL and PROMETHEUS) and not os.environ.get("CI"),
    reason="prometheus is not installed (scripts/bootstrap.sh installs it)")


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def dashboard_exprs() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


# --- static checks --------------------------------------------------------------------------

def test_rules_are_valid_and_their_unit_tests_pass():
    r = run(PROMTOOL, "check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(PROMTOOL, "test", "rules", RULE_TESTS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_catch_a_broken_rule(tmp_path):
    """The unit tests can fail: alerting on resources that are up, on any in-doubt
    age instead of an old one, on a daemon with no quarantined record, or on a lease-loss
    count that only fell (a restart) breaks them."""
    for good, bad in [("cotx_resource_up == 0", "cotx_resource_up == 1"),
                      ("cotx_in_doubt_oldest_seconds > 600", "cotx_in_doubt_oldest_seconds > 0"),
                      ("cotx_quarantined > 0", "cotx_quarantined >= 0"),
                      ("increase(cotx_lease_losses_total[15m]) > 0", "cotx_lease_losses_total > 0")]:
        text = RULES.read_text()
        assert good in text
        (tmp_path / RULES.name).write_text(text.replace(good, bad))
        shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
        r = run(PROMTOOL, "test", "rules", tmp_path / RULE_TESTS.name)
        assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr, (bad, r.stdout)


def test_dashboard_uses_only_exported_metrics():
    """Every cotx_* name in the dashboard and the rules is one the daemon exports
    (docs/coordinator.md, "Metrics"; histogram series carry _bucket/_sum/_count)."""
    exported = set(re.findall(r"^# TYPE (cotx_\w+) (\w+)", _sample_metrics(), re.M))
    names = {n for n, _ in exported}
    names |= {n + s for n, t in exported if t == "histogram" for s in ("_bucket", "_sum", "_count")}
    used = set(re.findall(r"\bcotx_\w+", " ".join(e for _, e in dashboard_exprs()) + RULES.read_text()))
    assert used and used <= names, used - names
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and all("gridPos" in p for p in d["panels"])
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "job", "instance"}


def _sample_metrics() -> str:
    with Daemon([]) as d:
        return metrics_text(d)


def test_production_config_passes_check_config(tmp_path):
    token = tmp_path / "token"
    cfg = tmp_path / "coordinator.toml"
    text = (DEPLOY / "coordinator.prod.toml").read_text()
    assert 'token_file = "/etc/cotx/token"' in text
    cfg.write_text(text.replace("/etc/cotx/token", str(token)))
    r = run(find_binary(), "check-config", "--config", cfg)
    assert r.returncode != 0 and "token_file" in r.stdout + r.stderr, r.stderr  # the token file is missing
    token.write_text(os.urandom(24).hex() + "\n")
    r = run(find_binary(), "check-config", "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "prod-a" in r.stdout + r.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_unit_verifies(tmp_path):
    unit = tmp_path / "cotx-coordinator.service"
    text = (DEPLOY / "cotx-coordinator.service").read_text()
    # The unit names the installed path; point it at this machine's build to verify it.
    unit.write_text(text.replace("/usr/local/bin/cotx-coordinator", find_binary()))
    r = run("systemd-analyze", "verify", unit)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr  # no warning either
    broken = tmp_path / "broken.service"
    broken.write_text(unit.read_text().replace("Restart=always", "Restart=sometimes"))
    r = run("systemd-analyze", "verify", broken)
    assert "Failed to parse service restart specifier" in r.stderr, r.stderr


# --- a real Prometheus scraping a real daemon -------------------------------------------------

class Prometheus:
    def __init__(self, workdir: Path, target: str, token_file: Path, bad_token_file: Path):
        self.dir = workdir
        self.port = free_port()
        cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
        cfg["rule_files"] = [str(RULES)]
        job = cfg["scrape_configs"][0]
        assert job["job_name"] == "cotx-coordinator"
        job["authorization"]["credentials_file"] = str(token_file)
        job["static_configs"] = [{"targets": [target]}]
        # The same target with a wrong token: refused, so `up` is 0 there.
        bad = json.loads(json.dumps(job))
        bad["job_name"] = "cotx-wrong-token"
        bad["authorization"]["credentials_file"] = str(bad_token_file)
        cfg["scrape_configs"].append(bad)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.proc = None

    def start(self):
        r = run(PROMTOOL, "check", "config", self.config)
        assert r.returncode == 0, r.stdout + r.stderr
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=self.log, start_new_session=True)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError((self.dir / "prometheus.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(ready, 60, "prometheus ready")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]


@pytest.fixture(scope="module")
def stack(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS ops(id int PRIMARY KEY, v int NOT NULL)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS ops(id int PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
    work = Path(tempfile.mkdtemp(prefix="cotx-prom-"))
    # "gone": a MariaDB resource on a port nothing listens on (its up gauge goes to 0).
    d = Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn},
                {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn},
                {"name": "gone", "kind": "mariadb", "dsn": f"mysql://root@127.0.0.1:{free_port()}/test"}],
               timeouts={"owner_grace_ms": 300})
    token, bad = work / "token", work / "wrong-token"
    token.write_text(d.token + "\n")
    bad.write_text("x" * 32 + "\n")
    prom = Prometheus(work, f"127.0.0.1:{d.port}", token, bad)
    with d:
        prom.start()
        try:
            yield d, prom
        finally:
            prom.stop()
            if not os.environ.get("COTX_KEEP_SERVERS"):
                shutil.rmtree(work, ignore_errors=True)


def run_transactions(pg, mariadb, d) -> int:
    """Two-phase commits across both databases, an abort, a one-phase commit, a refusal."""
    coord = Coordinator(d.url, d.token)
    commits = 0
    with pg.connect() as pc:
        mc = mariadb.connect()
        for i in range(5):
            with coord.transaction() as tx:
                with tx.branch(pc, "pg"):
                    pc.execute("INSERT INTO ops VALUES (%s, %s)", (i, i))
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO ops VALUES (%s, %s)", (i, i))
            assert tx.outcome == "commit"
            commits += 1
        with pytest.raises(ZeroDivisionError):
            with coord.transaction() as tx:
                with tx.branch(pc, "pg"):
                    pc.execute("INSERT INTO ops VALUES (100, 0)")
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO ops VALUES (100, 0)")
                1 / 0
        with coord.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO ops VALUES (200, 0)")
        mc.close()
    with pytest.raises(Exception):
        Coordinator(d.url, d.token).get("no-such-gtid")
    return commits


def test_prometheus_scrapes_the_daemon_and_the_dashboard_has_data(pg, mariadb, stack):
    d, prom = stack
    # A first sample before the transactions, so that rates see them happen.
    wait_until(lambda: prom.query('cotx_transactions_begun_total{job="cotx-coordinator"}'), 60, "a first scrape")
    commits = run_transactions(pg, mariadb, d)

    def scraped():
        r = prom.query('cotx_transactions_total{job="cotx-coordinator", outcome="commit"}')
        return r and float(r[0]["value"][1]) >= commits
    wait_until(scraped, 60, "the commits in Prometheus")
    # The token in prometheus.yml's authorization block is what lets the scrape in.
    def up_by_job():
        up = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
        return up if len(up) == 2 else None
    up = wait_until(up_by_job, 60, "both scrape jobs")
    assert up == {"cotx-coordinator": "1", "cotx-wrong-token": "0"}, up

    # Every dashboard query, with Grafana's variables filled in, returns series.
    empty = []
    for title, expr in dashboard_exprs():
        q = (expr.replace("$__rate_interval", "5m").replace("$__range", "5m")
             .replace('job=~"$job"', 'job="cotx-coordinator"').replace('instance=~"$instance"', 'instance=~".+"'))
        assert "$" not in q, q
        if not prom.query(q):
            empty.append((title, q))
    assert not empty, empty
    # And they show what happened.
    def value(q):
        return float(prom.query(q)[0]["value"][1])
    assert value('sum(increase(cotx_transactions_total{job="cotx-coordinator", outcome="abort"}[5m]))') > 0
    assert value('sum(rate(cotx_transactions_total{job="cotx-coordinator", outcome=~"commit|one_phase"}[5m]))') > 0
    assert value('histogram_quantile(0.99, sum by (le) (rate(cotx_decision_seconds_bucket{job="cotx-coordinator"}[5m])))') > 0
    assert value('cotx_refused_requests_total{job="cotx-coordinator"}') >= 1
    # A query the dashboard does not make, for a metric nobody exports, finds nothing.
    assert prom.query('cotx_no_such_metric{job="cotx-coordinator"}') == []


def test_rules_evaluate_and_an_unreachable_resource_alerts(stack):
    d, prom = stack

    def evaluated():
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["lastEvaluation"] > "2000" for r in rules) else None
    rules = wait_until(evaluated, 60, "every rule evaluated")
    assert {r["health"] for r in rules} == {"ok"}, [(r["name"], r.get("lastError")) for r in rules]
    assert len(rules) == len(yaml.safe_load(RULES.read_text())["groups"][0]["rules"])

    # "gone" listens nowhere: recovery cannot reach it, its up gauge is 0, and the alert
    # (for: 2m) is pending for it and for no other resource.
    def pending():
        return [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "CotxResourceDown"]
    alerts = wait_until(pending, 60, "CotxResourceDown pending")
    assert [(a["labels"]["resource"], a["state"]) for a in alerts] == [("gone", "pending")]
    assert float(prom.query('count(cotx_resource_up{job="cotx-coordinator"} == 0) or vector(0)')[0]["value"][1]) == 1
    assert float(prom.query('cotx_recovery_errors_total{job="cotx-coordinator"}')[0]["value"][1]) > 0
