"""The Helm chart (deploy/helm/cotx), checked without a cluster (none can run here):
`helm lint --strict`, `helm template`, and checks on what it renders. Each pod is played
as the kubelet would set it up: its volumes laid out under a throwaway root (the ConfigMap's
files, the projected Secrets' items, with the test's Secrets), its environment resolved
(the pod name, secretKeyRefs), then its own command (the chart's start.sh) run with the
real daemon binary's `check-config` in place of `serve`; and the daemons of two pods run
from their rendered configs on one PostgreSQL store, answering /readyz and /healthz over
the TLS the chart configures. Each check is shown to fail on a chart broken for it
(test_check_fails_on_a_broken_chart). helm is built from its Go module by
scripts/bootstrap-helm.sh."""
import json
import os
import re
import shutil
import ssl
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from cotest.daemon import find_binary

from cotest import PgServer, free_port

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy/helm/cotx"
LIB = (ROOT / "scripts/lib.sh").read_text()
HELM_VERSION = re.search(r'^HELM_VERSION="([^"]+)"', LIB, re.M).group(1)
HELM = Path(os.environ.get("COTX_CACHE", "/var/cache/cotx")) / "tools" / f"helm-{HELM_VERSION}" / "helm"
RELEASE, NAMESPACE = "r1", "prod"
STS = f"{RELEASE}-cotx"
PEERS = f"{RELEASE}-cotx-peers"

pytestmark = pytest.mark.skipif(not HELM.exists() and not os.environ.get("CI"),
                                reason=f"helm is not installed at {HELM} (scripts/bootstrap-helm.sh builds it)")

# The values of a production-like install: every Secret-backed option used once.
VALUES = {
    "replicas": 3,
    "tls": {"secretName": "cotx-tls"},
    "auth": {"secretName": "cotx-auth"},
    "store": {"dsnSecret": {"name": "cotx-store", "key": "dsn"}, "tls": "verify-full",
              "caSecret": {"name": "db-ca", "key": "ca.crt"}},
    "resources": [
        {"name": "orders", "kind": "postgres", "dsnSecret": {"name": "orders-db", "key": "dsn"}},
        {"name": "stock", "kind": "mariadb", "dsn": "mysql://cotx_recovery@stock-db:3306/stock",
         "enforcement": "client", "tls": "verify-full", "caSecret": {"name": "db-ca"}},
    ],
}


def run(cmd, **kw):
    kw.setdefault("timeout", 120)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def helm(*args, chart: Path = CHART, values: dict = VALUES, tmp: Path):
    vf = tmp / "values.yaml"
    vf.write_text(yaml.safe_dump(values))
    return run([HELM, *args[:1], *(["r1"] if args[0] == "template" else []), chart, "-n", NAMESPACE,
                "-f", vf, *args[1:]])


def render(tmp: Path, chart: Path = CHART, values: dict = VALUES) -> dict:
    """kind -> [objects] of `helm template`."""
    r = helm("template", chart=chart, values=values, tmp=tmp)
    assert r.returncode == 0, r.stderr
    out: dict = {}
    for d in yaml.safe_load_all(r.stdout):
        if d:
            out.setdefault(d["kind"], []).append(d)
    return out


def one(objs: dict, kind: str, name: str | None = None) -> dict:
    found = [o for o in objs.get(kind, []) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, rendered {len(found)}"
    return found[0]


def container(objs: dict) -> dict:
    sts = one(objs, "StatefulSet", STS)
    [c] = sts["spec"]["template"]["spec"]["containers"]
    return c


# --- the Secrets a test cluster would hold ---------------------------------------------------

@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> dict:
    """name -> {key: bytes}: a CA and a server certificate naming the Services, the pods
    and 127.0.0.1 (the served test), three role credentials, the DSNs."""
    d = tmp_path_factory.mktemp("certs")
    ossl = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)  # noqa: E731
    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
         "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.pem")
    san = (f"subjectAltName=DNS:{STS}.{NAMESPACE}.svc,DNS:*.{PEERS}.{NAMESPACE}.svc.cluster.local,"
           "IP:127.0.0.1")
    ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=cotx",
         "-addext", san, "-keyout", "tls.key", "-out", "tls.csr")
    ossl("x509", "-req", "-in", "tls.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
         "-copy_extensions", "copy", "-out", "tls.pem")
    ca = (d / "ca.pem").read_bytes()
    return {
        "cotx-tls": {"tls.crt": (d / "tls.pem").read_bytes(), "tls.key": (d / "tls.key").read_bytes(),
                     "ca.crt": ca},
        "cotx-auth": {r: f"{r}-credential-0123456789".encode() for r in ("client", "operator", "metrics")},
        # A password with a quote and a backslash: start.sh must escape it for TOML.
        "cotx-store": {"dsn": b'host=decisions-db port=5432 user=cotx password=a"b\\c dbname=cotx'},
        "orders-db": {"dsn": b"host=orders-db port=5432 user=orders_app password=x dbname=orders"},
        "db-ca": {"ca.crt": ca},
    }


# --- a pod, played without a kubelet ---------------------------------------------------------

class Pod:
    """The StatefulSet's pod of one ordinal: its volumes laid out under `root` as the
    kubelet would mount them, its environment resolved, its command runnable."""

    def __init__(self, objs: dict, ordinal: int, root: Path, secrets: dict, env_extra: dict | None = None):
        self.objs, self.root, self.secrets = objs, root, secrets
        sts = one(objs, "StatefulSet", STS)
        self.name = f"{sts['metadata']['name']}-{ordinal}"
        spec = sts["spec"]["template"]["spec"]
        self.c = container(objs)
        volumes = {v["name"]: v for v in spec["volumes"]}
        claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
        # Shallow mounts first: a nested mount (secrets inside the config folder) goes on top.
        for m in sorted(self.c["volumeMounts"], key=lambda m: m["mountPath"].count("/")):
            where = self.host(m["mountPath"])
            where.mkdir(parents=True, exist_ok=True)
            v = volumes.get(m["name"])
            assert v is not None or m["name"] in claims, f"volumeMount {m['name']} has no volume or claim"
            if v and "configMap" in v:
                cm = one(objs, "ConfigMap", v["configMap"]["name"])
                for k, text in cm["data"].items():
                    (where / k).write_text(text)
            elif v and "projected" in v:
                for src in v["projected"]["sources"]:
                    s = src["secret"]
                    assert s["name"] in secrets, f"the pod mounts Secret {s['name']}, which the test cluster lacks"
                    for item in s["items"]:
                        assert item["key"] in secrets[s["name"]], f"Secret {s['name']} has no key {item['key']}"
                        f = where / item["path"]
                        f.parent.mkdir(parents=True, exist_ok=True)
                        f.write_bytes(secrets[s["name"]][item["key"]])
        self.env = {"PATH": os.environ["PATH"]}
        for e in self.c.get("env", []):
            if "value" in e:
                self.env[e["name"]] = self.translate(e["value"])
            elif "fieldRef" in e["valueFrom"]:
                assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e
                self.env[e["name"]] = self.name
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                assert ref["key"] in secrets.get(ref["name"], {}), f"env {e['name']}: no Secret {ref['name']}/{ref['key']}"
                self.env[e["name"]] = secrets[ref["name"]][ref["key"]].decode()
        self.env.update(env_extra or {})

    def host(self, pod_path: str) -> Path:
        return self.root / pod_path.lstrip("/")

    def translate(self, value: str) -> str:
        """A path inside one of the pod's mounts -> the same file under `root`."""
        for m in self.c["volumeMounts"]:
            if value == m["mountPath"] or value.startswith(m["mountPath"] + "/"):
                return str(self.host(value))
        return value

    def command(self, *args: str) -> list[str]:
        """The container's command with `args` in place of its own (serve)."""
        return [self.translate(a) for a in self.c["command"]] + list(args)

    def run(self, *args: str, binary: str | None = None, **kw):
        env = dict(self.env, COTX_BIN=binary or find_binary())
        return run(self.command(*args), env=env, cwd=self.root, **kw)

    def config(self) -> dict:
        return tomllib.loads(Path(self.env["COTX_CONFIG"]).read_text())


# --- the checks (each raises AssertionError; test_check_fails_on_a_broken_chart breaks each) ----

def check_lint(tmp: Path, chart: Path):
    r = helm("lint", "--strict", chart=chart, tmp=tmp)
    assert r.returncode == 0, r.stdout + r.stderr


def check_probes(objs: dict):
    """Readiness on /readyz (lease, store, enforcement), liveness and start-up on /healthz,
    over HTTPS on the API's port."""
    c = container(objs)
    want = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    [port] = [p for p in c["ports"] if p["name"] == "api"]
    for probe, path in want.items():
        assert probe in c, f"the daemon's container has no {probe}"
        get = c[probe]["httpGet"]
        assert get["path"] == path, f"{probe} asks {get['path']}, not {path}"
        assert get["scheme"] == "HTTPS", f"{probe} over {get['scheme']}: the API is TLS only"
        assert get["port"] in ("api", port["containerPort"]), f"{probe} on port {get['port']}"
    # Start-up covers the wait for a node lease a replaced pod's predecessor still held (2 x ttl).
    s = c["startupProbe"]
    ttl_s = VALUES.get("config", {}).get("lease", {}).get("ttl_ms", 10000) / 1000
    assert s["periodSeconds"] * s["failureThreshold"] > 2 * ttl_s, "the start-up probe gives up before 2 x lease ttl"


def check_node_ids(objs: dict, tmp: Path, secrets: dict):
    """Each ordinal its own node id (prefix + ordinal), the same one at every start, and an
    advertise_url that is the pod's name under the headless Service the StatefulSet names."""
    sts = one(objs, "StatefulSet", STS)
    n = sts["spec"]["replicas"]
    peers = one(objs, "Service", sts["spec"]["serviceName"])
    assert peers["spec"].get("clusterIP") == "None", "the StatefulSet's serviceName is not a headless Service"
    assert peers["spec"].get("publishNotReadyAddresses"), "an unready daemon's advertise_url must still resolve"
    ids = []
    for ordinal in range(n):
        for start in range(2):   # a restart renders the same config
            pod = Pod(objs, ordinal, tmp / f"ids-{ordinal}-{start}", secrets)
            r = pod.run("check-config")
            assert r.returncode == 0, f"{pod.name}: {r.stdout}{r.stderr}"
            cfg = pod.config()
            if start == 0:
                ids.append(cfg["node_id"])
            assert cfg["node_id"] == ids[-1], f"{pod.name}: node id {cfg['node_id']} after a restart, was {ids[-1]}"
            host = f"{pod.name}.{peers['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
            assert cfg["advertise_url"] == f"https://{host}:{VALUES.get('port', 7420)}", cfg["advertise_url"]
    prefix = VALUES.get("nodeIdPrefix", "c")
    assert ids == [f"{prefix}{i}" for i in range(n)], f"node ids by ordinal: {ids}"


def check_config_with_the_daemon(objs: dict, tmp: Path, secrets: dict):
    """Every file the config names is one the pod mounts, and the daemon's own check-config
    accepts the config as the pod renders it (Secrets filled in, TOML-escaped)."""
    pod = Pod(objs, 0, tmp / "config", secrets)
    r = pod.run("check-config")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "config ok: node c0" in r.stdout, r.stdout
    cfg = pod.config()
    assert cfg["store"]["dsn"] == secrets["cotx-store"]["dsn"].decode(), "the store's DSN is not the Secret's"
    assert cfg["tls"]["cert_file"] and cfg["allow_non_loopback"] is True
    assert container(objs)["args"] == ["serve"]


def check_pdb(objs: dict):
    """A PodDisruptionBudget over exactly the daemons' pods that leaves one running."""
    sts = one(objs, "StatefulSet", STS)
    pdb = one(objs, "PodDisruptionBudget")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    sel = pdb["spec"]["selector"]["matchLabels"]
    assert sel and all(labels.get(k) == v for k, v in sel.items()), f"the budget's selector {sel} misses the pods {labels}"
    assert pdb["spec"].get("maxUnavailable", 0) < sts["spec"]["replicas"], "the budget lets every daemon go at once"
    for svc in objs["Service"]:
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), f"Service {svc['metadata']['name']} selects no daemon"


def check_tls_from_secret(objs: dict):
    """The API's certificate and key come from the TLS Secret named in the values."""
    sts = one(objs, "StatefulSet", STS)
    [proj] = [v["projected"] for v in sts["spec"]["template"]["spec"]["volumes"] if "projected" in v]
    items = {i["path"]: (s["secret"]["name"], i["key"]) for s in proj["sources"] for i in s["secret"]["items"]}
    tls = VALUES["tls"]["secretName"]
    for path, key in (("tls/tls.crt", "tls.crt"), ("tls/tls.key", "tls.key")):
        assert items.get(path) == (tls, key), f"secrets/{path} is not Secret {tls}'s {key}: {items.get(path)}"
    tpl = tomllib.loads(re.sub(r"@@[A-Za-z0-9_:]+@@", "x", one(objs, "ConfigMap")["data"]["coordinator.toml.in"]))
    assert tpl["tls"]["cert_file"] == "secrets/tls/tls.crt" and tpl["tls"]["key_file"] == "secrets/tls/tls.key", tpl["tls"]


# --- tests ------------------------------------------------------------------------------------

def test_lint_and_render(tmp_path):
    check_lint(tmp_path, CHART)
    objs = render(tmp_path)
    assert set(objs) == {"ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget"}, set(objs)


def test_chart_and_image_carry_the_release_version():
    """The chart is released with the project, and runs the coordinator image of the release."""
    release = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == release and chart["appVersion"] == release, chart
    image = run(["bash", ROOT / "scripts/images.sh", "names"]).stdout.split()[0]
    assert image == f"{yaml.safe_load((CHART / 'values.yaml').read_text())['image']['repository']}:{release}", image


def test_statefulset_probes(tmp_path):
    check_probes(render(tmp_path))


def test_node_ids_from_ordinals(tmp_path, secrets):
    check_node_ids(render(tmp_path), tmp_path, secrets)


def test_rendered_config_passes_the_daemons_check(tmp_path, secrets):
    check_config_with_the_daemon(render(tmp_path), tmp_path, secrets)


def test_pod_disruption_budget_and_selectors(tmp_path):
    check_pdb(render(tmp_path))


def test_tls_from_the_secret(tmp_path):
    check_tls_from_secret(render(tmp_path))


@pytest.mark.parametrize("change, message", [
    ({"nodeIdPrefix": "c.1"}, "nodeIdPrefix"),
    ({"nodeIdPrefix": "abcdefghijklmnop", "replicas": 2}, "over 16 characters"),
    ({"tls": {"secretName": ""}}, "tls.secretName is required"),
    ({"auth": {"secretName": ""}}, "auth.secretName is required"),
    ({"store": {"dsnSecret": {"name": ""}, "dsn": ""}}, "store.dsn or store.dsnSecret.name is required"),
    ({"resources": [{"name": "bad name", "dsn": "x"}]}, "1-64 of"),
])
def test_values_a_daemon_could_not_start_with_are_refused(tmp_path, change, message):
    values = json.loads(json.dumps(VALUES))
    for k, v in change.items():
        values[k] = {**values[k], **v} if isinstance(v, dict) and isinstance(values.get(k), dict) else v
    r = helm("template", values=values, tmp=tmp_path)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_secret_with_a_newline_is_refused_by_the_pod(tmp_path, secrets):
    """A DSN Secret written with `echo` ends in a newline, which a TOML string cannot hold:
    the pod says so instead of starting with a cut or broken DSN."""
    bad = dict(secrets, **{"cotx-store": {"dsn": b"host=db user=cotx dbname=cotx\n"}})
    r = Pod(render(tmp_path), 0, tmp_path / "nl", bad).run("check-config")
    assert r.returncode == 2 and "COTX_STORE_DSN holds a control character" in r.stderr, r.stderr


# Each check, on a copy of the chart broken for it: (file, text, replacement, check, what
# the check must say: the failure is the one meant, not another).
BREAKS = [
    ("templates/statefulset.yaml", "path: /readyz", "path: /healthz", "probes", "asks /healthz, not /readyz"),
    ("templates/statefulset.yaml", "scheme: HTTPS}\n            {{- toYaml $v.probes.readiness",
     "scheme: HTTP}\n            {{- toYaml $v.probes.readiness", "probes", "the API is TLS only"),
    ("files/start.sh", "ordinal=$((ordinal + 0))", "ordinal=0", "node_ids", "node ids by ordinal: ['c0', 'c0', 'c0']"),
    ("templates/configmap.yaml", "@@POD_NAME@@.{{ include \"cotx.peers\" . }}",
     "@@POD_NAME@@.{{ include \"cotx.fullname\" . }}", "node_ids", "https://r1-cotx-0.r1-cotx.prod.svc"),
    ("templates/services.yaml", "clusterIP: None", "type: ClusterIP", "node_ids", "is not a headless Service"),
    ("templates/configmap.yaml", "allow_non_loopback = true", "allow_non_loopback = false", "config",
     "needs allow_non_loopback"),
    ("templates/configmap.yaml", 'key_file = "secrets/tls/tls.key"', 'key_file = "secrets/tls/key.pem"', "config",
     "field `tls.key_file`: cannot read"),
    # start.sh without its TOML escaping: the Secret's quote ends the DSN's string early.
    ("files/start.sh", 'if (c == "\\\\" || c == "\\"") out = out "\\\\" c', 'if (0) out = out', "config",
     "field `dsn`"),
    ("templates/pdb.yaml", "{{- include \"cotx.selectorLabels\" . | nindent 6 }}",
     "app.kubernetes.io/name: other", "pdb", "misses the pods"),
    ("templates/statefulset.yaml", "path: tls/tls.crt}", "path: tls/cert.pem}", "tls", "secrets/tls/tls.crt is not Secret cotx-tls's tls.crt"),
    ("templates/statefulset.yaml", "kind: StatefulSet", "kind: StatefulSet\n  bad: [", "lint", "Linting"),
]


@pytest.mark.parametrize("path, text, replacement, check, expect", BREAKS,
                         ids=[f"{b[3]}-{i}" for i, b in enumerate(BREAKS)])
def test_check_fails_on_a_broken_chart(tmp_path, secrets, path, text, replacement, check, expect):
    broken = tmp_path / "cotx"
    shutil.copytree(CHART, broken)
    f = broken / path
    assert text in f.read_text(), f"{path} no longer holds {text!r}: update this case"
    f.write_text(f.read_text().replace(text, replacement))
    with pytest.raises(AssertionError) as caught:
        if check == "lint":
            check_lint(tmp_path, broken)
        else:
            objs = render(tmp_path, broken)
            {"probes": lambda: check_probes(objs),
             "node_ids": lambda: check_node_ids(objs, tmp_path, secrets),
             "config": lambda: check_config_with_the_daemon(objs, tmp_path, secrets),
             "pdb": lambda: check_pdb(objs),
             "tls": lambda: check_tls_from_secret(objs),
             }[check]()
    assert expect in str(caught.value), f"{check} failed for another reason: {caught.value}"


# --- two pods' daemons, served ---------------------------------------------------------------

def https_get(url: str, ca: Path) -> tuple[int, dict]:
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_two_pods_serve_and_are_ready_on_one_store(tmp_path, secrets):
    """The rendered config run as `serve` (the container's own args): each pod's daemon on
    its own port, both on one PostgreSQL store under their ordinals' node ids, ready and
    live over the Secret's TLS. /readyz of a daemon whose store is gone turns 503."""
    with PgServer() as pg:
        values = json.loads(json.dumps(VALUES))
        values["store"] = {"dsnSecret": {"name": "cotx-store", "key": "dsn"}}
        values["resources"] = []
        sec = dict(secrets, **{"cotx-store": {"dsn": pg.dsn.encode()}})
        procs, ports = [], []
        try:
            for ordinal in range(2):
                port = free_port()
                values["port"] = port   # two pods on one host: a port each
                objs = render(tmp_path, values=values)
                pod = Pod(objs, ordinal, tmp_path / f"serve-{ordinal}", sec)
                # The witness file's folder (the pod's volume at /var/lib/cotx) under this pod's root.
                tpl = Path(pod.env["COTX_CONFIG_TEMPLATE"])
                tpl.write_text(tpl.read_text().replace('"/var/lib/cotx/', f'"{pod.host("/var/lib/cotx")}/'))
                log = open(tmp_path / f"serve-{ordinal}.log", "w")
                procs.append(subprocess.Popen(pod.command(*container(objs)["args"]), cwd=pod.root, stdout=log,
                                              stderr=subprocess.STDOUT, env=dict(pod.env, COTX_BIN=find_binary())))
                ports.append(port)
            ca = tmp_path / "ca.pem"
            ca.write_bytes(secrets["cotx-tls"]["ca.crt"])
            deadline = time.time() + 60
            for ordinal, port in enumerate(ports):
                while True:
                    try:
                        status, body = https_get(f"https://127.0.0.1:{port}/readyz", ca)
                    except OSError:
                        status, body = 0, {}
                    if status == 200 or time.time() > deadline:
                        break
                    assert procs[ordinal].poll() is None, (tmp_path / f"serve-{ordinal}.log").read_text()
                    time.sleep(0.3)
                assert status == 200 and body["node_id"] == f"c{ordinal}", (status, body)
                assert https_get(f"https://127.0.0.1:{port}/healthz", ca)[0] == 200
            nodes = {r[0] for r in pg.sql("SELECT node FROM cotx_decisions_nodes")}
            assert {"c0", "c1"} <= nodes, nodes
            pg.stop()
            deadline = time.time() + 30
            while https_get(f"https://127.0.0.1:{ports[0]}/readyz", ca)[0] == 200 and time.time() < deadline:
                time.sleep(0.5)
            status, body = https_get(f"https://127.0.0.1:{ports[0]}/readyz", ca)
            assert status == 503, (status, body)
            assert https_get(f"https://127.0.0.1:{ports[0]}/healthz", ca)[0] == 200
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
