"""mysql_co refuses to load into a server build it was not compiled for.

mysql_co.so reads private server structures at offsets right for one exact mariadbd build
(scripts/build-mysql-co.sh records that build's GNU build-id and version string). Another
build is made here by copying the installed mariadbd and changing the bytes of its build-id
note: nothing at run time reads them, so the copy runs exactly like the original, but it is
"another build" to the check, as a mariadbd after a Debian security update would be.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

from cotest import MariaServer
from cotest.servers import mysql_co_installed

pytestmark = pytest.mark.skipif(not mysql_co_installed(),
                                reason="mysql_co is not installed (run scripts/build.sh)")

MARIADBD = Path(shutil.which("mariadbd") or "/usr/sbin/mariadbd")
REFUSAL = "mysql_co: refusing to load: this mysql_co.so was built for MariaDB"


def build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    ids = [line.split()[-1] for line in out.splitlines() if "Build ID:" in line]
    assert len(ids) == 1, f"{path} has no (or several) build-id notes:\n{out}"
    return ids[0]


def other_build(dest: Path) -> str:
    """Copy mariadbd to dest with a different build-id; returns the new id."""
    data = bytearray(MARIADBD.read_bytes())
    old = bytes.fromhex(build_id(MARIADBD))
    # The note: namesz=4, descsz, type=3 (NT_GNU_BUILD_ID), "GNU\0", then the id itself.
    note = len(old).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"GNU\0" + old
    at = data.find(note)
    assert at >= 0 and data.find(note, at + 1) < 0, "build-id note not found exactly once"
    new = bytes(b ^ 0x5A for b in old)
    start = at + len(note) - len(old)
    data[start:start + len(old)] = new
    dest.write_bytes(bytes(data))
    dest.chmod(0o755)
    assert build_id(dest) == new.hex()
    return new.hex()


class OtherBuildServer(MariaServer):
    """A MariaServer run from a copy of mariadbd whose build-id differs."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.binary = self.dir / "mariadbd-other-build"
        self.other_id = other_build(self.binary)

    def server_args(self) -> list[str]:
        return [str(self.binary)] + super().server_args()[1:]


def mysql_co_plugins(server) -> dict[str, str]:
    rows = server_rows(server, "SELECT PLUGIN_NAME, PLUGIN_STATUS FROM information_schema.PLUGINS "
                               "WHERE PLUGIN_NAME LIKE 'mysql_co%' OR PLUGIN_NAME LIKE 'MYSQL_CO%'")
    return {name: status for name, status in rows}


def server_rows(server, sql: str):
    c = server._root_socket_conn()
    try:
        with c.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        c.close()


def log_text(server) -> str:
    return Path(server.log_file).read_text(errors="replace")


def test_another_build_of_mariadbd_is_refused_with_the_rebuild_command():
    with OtherBuildServer(plugin=True) as s:
        # The server runs (a refused plugin is not fatal), without any of mysql_co's plugins.
        assert mysql_co_plugins(s) == {}
        log = log_text(s)
        assert REFUSAL in log, log
        line = next(ln for ln in log.splitlines() if REFUSAL in ln)
        # Both builds named, and the fix.
        assert f"build-id {build_id(MARIADBD)}" in line
        assert f"build-id {s.other_id}" in line
        assert "10.11" in line
        assert "scripts/build-mysql-co.sh" in line
        # Logged once, not once per plugin of the library.
        assert log.count(REFUSAL) == 1
        # No Mysql_co_* status: nothing of the plugin is active.
        assert server_rows(s, "SHOW GLOBAL STATUS LIKE 'Mysql_co_health'") == ()


def test_the_build_it_was_made_for_loads_it():
    with MariaServer(plugin=True) as s:
        plugins = mysql_co_plugins(s)
        assert plugins == {"mysql_co": "ACTIVE", "mysql_co_audit": "ACTIVE",
                           "MYSQL_CO_LOST_BRANCHES": "ACTIVE", "MYSQL_CO_RECOVERED_XIDS": "ACTIVE"}
        assert REFUSAL not in log_text(s)
        assert server_rows(s, "SHOW GLOBAL STATUS LIKE 'Mysql_co_health'") == (("Mysql_co_health", "OK"),)


def test_another_version_string_is_refused():
    """The version is checked too: --version sets the string the server reports (the same
    binary, so only the version differs)."""
    with MariaServer(plugin=True, options=["--version=10.11.17-MariaDB-0+deb12u1"]) as s:
        assert mysql_co_plugins(s) == {}
        line = next(ln for ln in log_text(s).splitlines() if REFUSAL in ln)
        assert "but the running server is MariaDB 10.11.17-MariaDB-0+deb12u1" in line


def test_the_suffix_the_binary_log_adds_to_the_version_is_accepted():
    """With log-bin the server reports <version>-log: still the same build."""
    with MariaServer(plugin=True, binlog=True) as s:
        assert server_rows(s, "SELECT @@version")[0][0].endswith("-log")
        assert mysql_co_plugins(s).get("mysql_co") == "ACTIVE"
