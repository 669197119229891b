"""The Debian packages of scripts/package.sh: built from this checkout, read back with
dpkg-deb (fields, paths, modes, conffiles), installed with dpkg into a throwaway root
(dpkg --root, maintainer scripts run chrootless with DPKG_ROOT set), and used from there:
the daemon runs --version and check-config on the packaged config (first the precise
error naming the token placeholder, then with the token written), MariaDB loads the
packaged mysql_co.so through the packaged conf snippet, and each pg_co package holds the
very files the suites test (byte-for-byte; PostgreSQL 15 cannot load an extension's
control and SQL files from another directory). Then remove (edited conffiles stay) and
purge (they go, with /var/lib/cotx); the host's users are never touched. The maintainer
scripts' real-system branch (adduser, ownership, purge) runs against stub commands."""
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
from cotest import MariaServer
from cotest import servers as cotest_servers
from cotest.servers import PG_MAJORS, _pg_config, mysql_co_installed

ROOT = Path(__file__).resolve().parents[3]
DIST = ROOT / "dist"
# One release version for every part (Cargo.toml, [workspace.package]; test_versions.py).
PG_CO_VERSION = COORD_VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
MAJORS = [m for m in PG_MAJORS if not cotest_servers.pg_unavailable(m)]

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-deb") or os.geteuid() != 0,
                                reason="needs dpkg-deb and root (scripts/package.sh runs the build scripts)")


def run(*cmd, check=True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    if check:
        assert r.returncode == 0, f"{cmd}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def debs() -> dict[str, Path]:
    """package name -> .deb, built by scripts/package.sh (its builds are no-ops when
    scripts/build.sh ran before, as in scripts/test.sh)."""
    r = run("bash", ROOT / "scripts" / "package.sh")
    names = {f"postgresql-{m}-pg-co": PG_CO_VERSION for m in MAJORS}
    names |= {"mariadb-plugin-mysql-co": PG_CO_VERSION, "cotx-coordinator": COORD_VERSION}
    out = {n: DIST / f"{n}_{v}_amd64.deb" for n, v in names.items()}
    for n, f in out.items():
        assert f.exists() and f.name in r.stdout, f"{f.name} not built:\n{r.stdout}\n{r.stderr}"
    assert f"built {len(out)} packages" in r.stdout, r.stdout
    return out


def field(deb: Path, name: str) -> str:
    return run("dpkg-deb", "--field", deb, name).stdout.strip()


def contents(deb: Path) -> dict[str, str]:
    """path -> mode string (e.g. -rw-r-----) of every file and directory in the package."""
    out = {}
    for line in run("dpkg-deb", "--contents", deb).stdout.splitlines():
        mode, owner, *_, path = line.split()
        assert owner == "root/root", line
        out[path.removeprefix(".").rstrip("/") or "/"] = mode
    return out


def conffiles(deb: Path) -> list[str]:
    r = run("dpkg-deb", "--info", deb, "conffiles", check=False)
    return r.stdout.split() if r.returncode == 0 else []


def test_fields_paths_and_conffiles(debs):
    for major in MAJORS:
        deb = debs[f"postgresql-{major}-pg-co"]
        assert field(deb, "Version") == PG_CO_VERSION
        assert field(deb, "Architecture") == "amd64"
        assert field(deb, "Depends").startswith(f"postgresql-{major}, libc6 ")
        files = contents(deb)
        # Debian's layout for every major (16/17/18 are built here under /var/cache/cotx/pg).
        lib, ext = f"/usr/lib/postgresql/{major}/lib", f"/usr/share/postgresql/{major}/extension"
        assert files[f"{lib}/pg_co.so"] == "-rw-r--r--"
        assert f"{ext}/pg_co.control" in files and f"{ext}/pg_co--{PG_CO_VERSION}.sql" in files
        upgrades = sorted(p.name for p in (ROOT / "pg_co_ext" / "sql").glob("pg_co--*--*.sql"))
        assert upgrades and all(f"{ext}/{u}" in files for u in upgrades), upgrades
        assert not [p for p in files if "/var/cache" in p or p.startswith("/usr/local")]
        assert conffiles(deb) == []

    deb = debs["mariadb-plugin-mysql-co"]
    server = run("dpkg-query", "-W", "-f=${Version}", "mariadb-server").stdout
    assert field(deb, "Depends").startswith(f"mariadb-server (= {server}), ")
    files = contents(deb)
    assert files["/usr/lib/mysql/plugin/mysql_co.so"] == "-rw-r--r--"
    assert conffiles(deb) == ["/etc/mysql/mariadb.conf.d/60-mysql-co.cnf"]

    deb = debs["cotx-coordinator"]
    assert field(deb, "Version") == COORD_VERSION
    assert field(deb, "Depends").startswith("adduser, libc6 ")
    files = contents(deb)
    assert files["/usr/bin/cotx-coordinator"] == "-rwxr-xr-x"
    assert files["/lib/systemd/system/cotx-coordinator.service"] == "-rw-r--r--"
    assert files["/etc/cotx"] == "drwxr-x---"
    assert files["/etc/cotx/coordinator.toml"] == "-rw-r-----"   # DSN passwords
    assert conffiles(deb) == ["/etc/cotx/coordinator.toml"]
    info = run("dpkg-deb", "--info", deb).stdout
    assert all(re.search(rf"\b{s}\b.*\bsh\b", info) for s in ("postinst", "prerm", "postrm")), info


class Root:
    """A throwaway dpkg root: dpkg --root (its own database and log), maintainer scripts
    run by this system's shell with DPKG_ROOT set (--force-script-chrootless), the
    packages' dependencies (servers, libc) not installed there (--force-depends)."""

    def __init__(self, path: Path):
        self.path = path
        for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/log"):
            (path / d).mkdir(parents=True)
        for f in ("status", "available"):
            (path / "var/lib/dpkg" / f).touch()

    def dpkg(self, *args) -> subprocess.CompletedProcess:
        return run("dpkg", f"--root={self.path}", f"--log={self.path}/var/log/dpkg.log",
                   "--force-depends", "--force-script-chrootless", *args)

    def status(self, package: str) -> str:
        return run("dpkg-query", f"--admindir={self.path}/var/lib/dpkg", "-W", "-f=${db:Status-Abbrev}",
                   package, check=False).stdout.strip()

    def __truediv__(self, rel: str) -> Path:
        return self.path / rel.lstrip("/")


@pytest.fixture
def root():
    # Under /tmp and world-traversable: the test MariaDB (user cotx) reads its plugin here.
    path = Path(tempfile.mkdtemp(prefix="cotx-dpkg-root-"))
    path.chmod(0o755)
    yield Root(path)
    shutil.rmtree(path)


def host_accounts() -> str:
    return hashlib.sha256(b"".join(Path(f).read_bytes() for f in ("/etc/passwd", "/etc/group", "/etc/shadow"))).hexdigest()


def test_install_use_remove_purge(debs, root):
    accounts = host_accounts()
    r = root.dpkg("-i", *debs.values())
    assert "installed under" in r.stderr and "system user cotx not created" in r.stderr, r.stderr
    for name in debs:
        assert root.status(name) == "ii", name

    # The daemon, from the installed tree.
    daemon = root / "usr/bin/cotx-coordinator"
    assert run(daemon, "--version").stdout.strip() == f"cotx-coordinator {COORD_VERSION}"
    conf = root / "etc/cotx/coordinator.toml"
    r = run(daemon, "check-config", "--config", conf, check=False)
    assert r.returncode == 2, r
    assert f"field `token_file`: cannot read {root / 'etc/cotx/token'}: No such file" in r.stderr, r.stderr
    (root / "etc/cotx/token").write_text(os.urandom(24).hex() + "\n")
    r = run(daemon, "check-config", "--config", conf)
    assert "prod-a" in r.stdout + r.stderr
    unit = (root / "lib/systemd/system/cotx-coordinator.service").read_text()
    assert "ExecStart=/usr/bin/cotx-coordinator serve --config /etc/cotx/coordinator.toml\n" in unit
    assert "/usr/local" not in unit
    # DPKG_ROOT: the state directory, no user, no ownership change.
    assert (root / "var/lib/cotx").is_dir() and (root / "var/lib/cotx").stat().st_uid == 0
    assert host_accounts() == accounts

    # pg_co: the files the suites load, and the version the extension installs by default.
    for major in MAJORS:
        lib = _pg_config(major, "--pkglibdir")
        ext = _pg_config(major, "--sharedir") / "extension"
        pkg_lib, pkg_ext = root / f"usr/lib/postgresql/{major}/lib", root / f"usr/share/postgresql/{major}/extension"
        assert (pkg_lib / "pg_co.so").read_bytes() == (lib / "pg_co.so").read_bytes(), major
        for f in pkg_ext.iterdir():
            assert f.read_bytes() == (ext / f.name).read_bytes(), (major, f.name)
        control = (pkg_ext / "pg_co.control").read_text()
        assert f"default_version = '{PG_CO_VERSION}'" in control, control
    # mysql_co: the plugin the suites load.
    if mysql_co_installed():
        assert (root / "usr/lib/mysql/plugin/mysql_co.so").read_bytes() == \
            (cotest_servers.MARIADB_PLUGIN_DIR / "mysql_co.so").read_bytes()

    # Remove: binaries go, the conffiles stay (edited ones too), so does the state.
    with conf.open("a") as f:
        f.write("# edited by the operator\n")
    (root / "var/lib/cotx/decisions.db").write_text("x")
    root.dpkg("-r", "cotx-coordinator", "mariadb-plugin-mysql-co")
    assert root.status("cotx-coordinator") == "rc" and root.status("mariadb-plugin-mysql-co") == "rc"
    assert not daemon.exists() and not (root / "usr/lib/mysql/plugin/mysql_co.so").exists()
    assert conf.read_text().endswith("# edited by the operator\n")
    assert (root / "etc/mysql/mariadb.conf.d/60-mysql-co.cnf").exists()
    assert (root / "var/lib/cotx/decisions.db").exists()

    # Purge: conffiles and /var/lib/cotx go; the token (the operator's file) stays.
    (root / "var/lib/cotx/.user-created-by-package").touch()   # even so: not this system's user
    root.dpkg("-P", *debs)
    for name in debs:
        assert root.status(name) in ("", "un"), name
    assert not conf.exists() and not (root / "etc/mysql/mariadb.conf.d/60-mysql-co.cnf").exists()
    assert not (root / "var/lib/cotx").exists()
    assert (root / "etc/cotx/token").exists()
    assert not list((root / "usr").rglob("*.so"))
    assert host_accounts() == accounts


@pytest.mark.skipif(not mysql_co_installed(), reason="mysql_co is not installed (run scripts/build.sh)")
def test_mariadb_loads_the_packaged_plugin(debs, root):
    """The packaged conf snippet and .so: a MariaDB server pointed at the throwaway root's
    plugin dir, with the snippet's plugin-load-add, reports mysql_co healthy."""
    root.dpkg("-i", debs["mariadb-plugin-mysql-co"])
    cnf = (root / "etc/mysql/mariadb.conf.d/60-mysql-co.cnf").read_text()
    groups = re.findall(r"(?m)^\[(\w+)\]", cnf)
    assert groups == ["mariadb"], cnf          # read by the server only
    loads = re.findall(r"(?m)^plugin-load-add=(.+)$", cnf)
    assert loads == ["mysql_co.so"], cnf
    with MariaServer(plugin=False, options=[f"--plugin-dir={root / 'usr/lib/mysql/plugin'}",
                                            f"--plugin-load-add={loads[0]}"]) as my:
        status = dict(my.sql("SHOW GLOBAL STATUS LIKE 'Mysql\\_co\\_health'"))
        assert status == {"Mysql_co_health": "OK"}, status
        plugin_dir = my.sql("SELECT @@plugin_dir")[0][0]
        assert plugin_dir.rstrip("/") == str(root / "usr/lib/mysql/plugin"), plugin_dir


STUBS = ("getent", "adduser", "deluser", "delgroup", "install", "chgrp", "chmod", "touch", "rm", "systemctl")


def run_script(script: Path, tmp: Path, *args, user_exists=False, group_exists=False) -> list[str]:
    """Run a maintainer script as on a real system (DPKG_ROOT empty), every command it may
    call a stub that logs its arguments: PATH holds only the stubs, so a command without
    one fails instead of changing this machine. Returns the calls, one line each."""
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    log = tmp / "calls"
    log.write_text("")
    for name in STUBS:
        body = f'echo "{name} $*" >> {log}\n'
        if name == "getent":
            body += f'case "$1" in passwd) exit {0 if user_exists else 2};; group) exit {0 if group_exists else 2};; esac\nexit 2\n'
        (stubs / name).write_text("#!/bin/sh\n" + body)
        (stubs / name).chmod(0o755)
    r = subprocess.run(["/bin/sh", str(script), *args], capture_output=True, text=True, timeout=30,
                       env={"PATH": str(stubs), "DPKG_ROOT": "", "DPKG_MAINTSCRIPT_PACKAGE": "cotx-coordinator"})
    assert r.returncode == 0, r.stdout + r.stderr
    return [c for c in log.read_text().splitlines() if not c.startswith("getent ")]


def test_maintainer_scripts_on_a_real_system(debs, tmp_path):
    """The branch dpkg --root cannot reach without creating a user on this machine."""
    scripts = tmp_path / "DEBIAN"
    run("dpkg-deb", "--control", debs["cotx-coordinator"], scripts)
    postinst, postrm = scripts / "postinst", scripts / "postrm"

    # First installation, no user: a system user and group, its state directory, the config
    # readable by its group.
    calls = run_script(postinst, tmp_path, "configure", "")
    assert calls[0] == "adduser --system --group --home /var/lib/cotx --no-create-home " \
                       "--shell /usr/sbin/nologin --gecos cotx coordinator cotx", calls
    assert "touch /var/lib/cotx/.user-created-by-package" in calls
    assert "install -d -m 0750 -o cotx -g cotx /var/lib/cotx" in calls
    assert "chgrp cotx /etc/cotx /etc/cotx/coordinator.toml" in calls
    # The group exists already (e.g. made by hand): the user joins it.
    calls = run_script(postinst, tmp_path, "configure", "", group_exists=True)
    assert calls[0].startswith("adduser --system --ingroup cotx "), calls
    # The user exists: not created, not marked as the package's; an upgrade keeps the
    # operator's ownership and modes of /etc/cotx.
    calls = run_script(postinst, tmp_path, "configure", "", user_exists=True, group_exists=True)
    assert not [c for c in calls if c.startswith(("adduser", "touch"))], calls
    calls = run_script(postinst, tmp_path, "configure", "0.0.9", user_exists=True, group_exists=True)
    assert calls == ["install -d -m 0750 -o cotx -g cotx /var/lib/cotx"], calls
    # Purge: the state directory goes; the user stays unless this package created it (no
    # marker on this machine).
    assert not Path("/var/lib/cotx/.user-created-by-package").exists()
    calls = run_script(postrm, tmp_path, "purge", user_exists=True, group_exists=True)
    assert "rm -rf /var/lib/cotx" in calls and not [c for c in calls if c.startswith("del")], calls
    assert run_script(postrm, tmp_path, "remove", user_exists=True) == []
