"""The clients as a service adds them, without this tree (README, "Adding the clients to a
service"): the Python client's wheel installed into a fresh venv and imported from there;
the Python floor it declares is the one tested, and refused below it at install; the Go
client under its module path, used by a throwaway module with the `replace` recipe,
built and vetted offline."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("COTX_VENV", "/var/cache/cotx/venv"))
# The Python every suite runs on: Debian 12's python3 (the venv's).
TESTED = sys.version_info[:2]


def run(cmd, **kw):
    kw.setdefault("timeout", 300)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def release() -> str:
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def declared_floor(pyproject: Path) -> tuple[int, int]:
    spec = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", spec)
    assert m, f"{pyproject}: requires-python {spec!r} is not of the form '>=3.N'"
    return (3, int(m.group(1)))


@pytest.mark.parametrize("part", ["clients/python", "harness", "checker", "bench"])
def test_declared_python_floor_is_the_tested_one(part):
    """A floor below the Python the suites run on would be a promise nothing checks: only
    Debian 12's 3.11 is here (3.9 and 3.10 are past their end of life), and a syntax check
    with an older grammar would not see a newer standard-library call."""
    assert declared_floor(ROOT / part / "pyproject.toml") == TESTED, (
        f"{part}/pyproject.toml declares Python >= 3.{declared_floor(ROOT / part / 'pyproject.toml')[1]}, "
        f"but the suites run on {TESTED[0]}.{TESTED[1]} only: declare that, or test the lower one")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = run(["bash", ROOT / "scripts/build-python-wheel.sh", out])
    assert r.returncode == 0, r.stdout + r.stderr
    whl = Path(r.stdout.strip().splitlines()[-1])
    assert whl.name == f"cotx-{release()}-py3-none-any.whl" and whl.exists(), r.stdout
    return whl


def test_wheel_installs_into_a_fresh_venv_and_imports_from_there(wheel, tmp_path):
    venv = tmp_path / "venv"
    r = run([sys.executable, "-m", "venv", venv])
    assert r.returncode == 0, r.stderr
    # --no-index: the wheel needs nothing from a registry (the drivers are the service's).
    r = run([venv / "bin/pip", "install", "-q", "--no-index", wheel])
    assert r.returncode == 0, r.stdout + r.stderr
    probe = (
        "import importlib.metadata as md, json, cotx, cotx.retry_rules as rr\n"
        "from cotx import Coordinator, RetryableError, Transaction\n"
        "print(json.dumps({'file': cotx.__file__, 'version': md.version('cotx'),\n"
        "  'requires': md.metadata('cotx')['Requires-Python'],\n"
        "  'rules': rr.daemon_action('begin', 429, 'too_many_transactions')}))\n")
    # Outside the checkout, with no PYTHONPATH: only the venv can supply the package.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = run([venv / "bin/python", "-c", probe], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    got = __import__("json").loads(r.stdout)
    assert Path(got["file"]).is_relative_to(venv), f"cotx imported from {got['file']}, not the venv"
    assert got["version"] == release()
    assert got["requires"] == f">={TESTED[0]}.{TESTED[1]}"
    # The retry rules are package data: the wheel carries them (a client without them fails here).
    assert got["rules"], got


def test_wheel_is_refused_below_its_floor(wheel, tmp_path):
    """A service on an older Python is told at install, not by a TypeError at import."""
    older = f"3.{TESTED[1] - 1}"
    r = run([VENV / "bin/pip", "install", "--dry-run", "--no-index", "--no-deps", "--only-binary=:all:",
             "--python-version", older, "--target", tmp_path / "t", wheel])
    assert r.returncode != 0, r.stdout
    assert "requires a different Python" in r.stdout + r.stderr, r.stdout + r.stderr


# --- Go -----------------------------------------------------------------------------------

GO_CACHE = Path(os.environ.get("COTX_CACHE", "/var/cache/cotx")) / "go"
SERVICE_MAIN = """package main

import (
	"fmt"
	"os"

	cotx "%s"
)

func main() {
	c, err := cotx.New("http://127.0.0.1:7420", "0123456789abcdef")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println(c != nil, cotx.Header)
}
"""


def go_module_path() -> str:
    m = re.search(r"^module\s+(\S+)", (ROOT / "clients/go/go.mod").read_text(), re.M)
    return m.group(1)


def go_env() -> dict:
    """As scripts/tm-env.sh: the module cache bootstrap-tm.sh filled, no toolchain download.
    Offline (GOPROXY=off): the checksums were checked when bootstrap downloaded the modules,
    so the checksum database (reached through the proxy) is not asked again."""
    env = dict(os.environ, GOPATH=str(GO_CACHE), GOMODCACHE=str(GO_CACHE / "pkg/mod"),
               GOCACHE=str(GO_CACHE / "build-cache"), GOTOOLCHAIN="local", GOPROXY="off", GOSUMDB="off",
               GOFLAGS="", GOWORK="off")
    env["PATH"] = ":".join(d for d in ("/usr/local/go/bin", "/usr/lib/go/bin") if Path(d).is_dir()) + ":" + env["PATH"]
    return env


def test_go_module_path_is_one_go_get_accepts(tmp_path):
    """Go's own check of the path, asked without the replace (which would accept any path):
    `cotx/client` was refused as malformed (no host in its first element); a valid path is
    only looked up, which the offline proxy setting then declines."""
    mod = go_module_path()
    r = run(["go", "mod", "init", "example.com/svc"], cwd=tmp_path, env=go_env())
    assert r.returncode == 0, r.stderr
    r = run(["go", "get", f"{mod}@v{release()}"], cwd=tmp_path, env=go_env())
    out = r.stdout + r.stderr
    assert "malformed module path" not in out, f"clients/go/go.mod: module {mod}: {out}"
    assert "module lookup disabled by GOPROXY=off" in out, out


def test_go_service_adds_the_client_with_the_replace_recipe(tmp_path):
    """README's recipe, as a new service runs it: go mod init, the replace, go get, build."""
    mod, env = go_module_path(), go_env()
    svc = tmp_path / "svc"
    svc.mkdir()
    (svc / "main.go").write_text(SERVICE_MAIN % mod)
    for cmd in (["go", "mod", "init", "example.com/svc"],
                ["go", "mod", "edit", f"-replace={mod}={ROOT / 'clients/go'}"],
                ["go", "get", f"{mod}@v{release()}"],
                ["go", "build", "-mod=readonly", "-o", "svc", "."],
                ["go", "vet", "./..."]):
        r = run(cmd, cwd=svc, env=env)
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout}{r.stderr}"
    assert f"{mod} v{release()}" in (svc / "go.mod").read_text()
    r = run([svc / "svc"], cwd=svc)
    assert r.returncode == 0 and r.stdout.split() == ["true", "Cotx-Gtid"], r.stdout + r.stderr
