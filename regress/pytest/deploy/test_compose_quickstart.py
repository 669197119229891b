"""The quickstart on containers (deploy/compose, README "Quickstart on containers"): the
compose file's images are scripts/images.sh's, its settings agree with the coordinator's
config (which the daemon's check-config accepts) and with scripts/quickstart.sh, its
environment is what the images' entrypoints read; then README's command run for real with
Debian's podman-compose on the images (as test_images.py runs them): PostgreSQL with pg_co,
MariaDB with mysql_co and the coordinator start, the overdraft demo runs against them and
holds the invariant with no cycle, and nothing of the project is left behind."""
import os
import re
import subprocess
from pathlib import Path

import pytest
import tomllib
import yaml
from cotest.daemon import find_binary

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "deploy/compose"
SPEC = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
CONFIG = COMPOSE / "coordinator.toml"
SCRIPT = (ROOT / "scripts/quickstart.sh").read_text()


def run(*cmd, timeout=120, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def script_var(name: str) -> str:
    return re.search(rf"\b{name}=(\S+)", SCRIPT).group(1)


def env(service: str) -> dict:
    return {k: str(v) for k, v in SPEC["services"][service]["environment"].items()}


def test_images_are_the_ones_images_sh_builds():
    names = run("bash", ROOT / "scripts/images.sh", "names").stdout.split()
    got = sorted(s["image"] for s in SPEC["services"].values())
    assert got == sorted(f"localhost/{n}" for n in names), f"compose.yaml's images {got}, images.sh builds {names}"


def test_settings_agree_and_the_daemon_accepts_its_config():
    r = run(find_binary(), "check-config", "--config", CONFIG)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = tomllib.loads(CONFIG.read_text())
    pg, my = env("postgres"), env("mariadb")
    by_name = {r["name"]: r for r in cfg["resources"]}
    assert f"port={pg['PGPORT']} " in by_name["savings"]["dsn"] and f"password={pg['POSTGRES_PASSWORD']} " in \
        by_name["savings"]["dsn"], "the savings resource is not the compose file's PostgreSQL"
    assert f":{my['MARIADB_ROOT_PASSWORD']}@127.0.0.1:{my['MARIADB_PORT']}/" in by_name["checking"]["dsn"], \
        "the checking resource is not the compose file's MariaDB"
    assert script_var("PG_PORT") == pg["PGPORT"] and script_var("MY_PORT") == my["MARIADB_PORT"]
    assert script_var("DB_PASSWORD") == pg["POSTGRES_PASSWORD"] == my["MARIADB_ROOT_PASSWORD"]
    assert script_var("COORD_URL") == f"http://{cfg['listen']}"
    assert script_var("CLIENT_TOKEN") == cfg["auth"]["client_token"]
    assert script_var("OPERATOR_TOKEN") == cfg["auth"]["operator_token"]
    # Engine mode: the images load pg_co and mysql_co; the demo shows their refusals.
    assert {r["enforcement"] for r in cfg["resources"]} == {"engine"}
    mounts = SPEC["services"]["coordinator"]["volumes"]
    assert "./coordinator.toml:/etc/cotx/coordinator.toml:ro" in mounts, mounts


def test_environment_is_what_the_entrypoints_read():
    """Each variable the compose file sets is one its image's entrypoint documents."""
    for service, entry in (("postgres", "postgres-entrypoint.sh"), ("mariadb", "mariadb-entrypoint.sh")):
        header = (ROOT / "deploy/images" / entry).read_text().split("set -euo pipefail")[0]
        for var in env(service):
            assert re.search(rf"^#\s+{var}\b", header, re.M), f"{service}: {var} is not a variable of {entry}"
    for s in SPEC["services"].values():
        assert s["network_mode"] == "host", "the images run on the host's network (scripts/quickstart.sh)"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (podman, scripts/images.sh)")
def test_quickstart_runs_the_demo(tmp_path):
    r = run("bash", ROOT / "scripts/quickstart.sh", timeout=1800, env=dict(os.environ, DEMO_ROUNDS="6"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"invariant savings \+ checking >= 0\s+held", out), out[-3000:]
    assert re.search(r"cycles found by the history checker\s+0\n", out), out[-3000:]
    assert "using PostgreSQL on 127.0.0.1:15432 and MariaDB on 127.0.0.1:13306" in out, out[-3000:]
    # Nothing of the project left: containers and volumes removed by `down`.
    podman = run("bash", "-c", f'source "{ROOT}/scripts/lib.sh"; printf "%s\\0" "${{PODMAN[@]}}"').stdout
    podman = podman.rstrip("\0").split("\0")
    label = "label=io.podman.compose.project=cotx-quickstart"
    assert run(*podman, "ps", "-a", "-q", "--filter", label).stdout.strip() == ""
    assert run(*podman, "volume", "ls", "-q", "--filter", label).stdout.strip() == ""
