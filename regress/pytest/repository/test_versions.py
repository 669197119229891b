"""Every released part carries the one release version (CHANGELOG.md): the workspace's
`[workspace.package] version`. Checked from the files that declare each part's version,
so a release cannot ship parts that disagree."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def release() -> str:
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def test_every_part_has_the_release_version():
    v = release()
    major, minor, _ = (int(x) for x in v.split("."))
    for crate in ["pg_co_ext", "pg_co_ext/rules", "coordinator-daemon", "coordinator-daemon/protocol", "coordinator-daemon/model"]:
        pkg = tomllib.loads((ROOT / crate / "Cargo.toml").read_text())["package"]
        assert pkg["version"] == {"workspace": True}, f"{crate}/Cargo.toml must take the workspace's version"
    assert tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())["project"]["version"] == v
    # clients/java: the parent pom's own version, and each module's reference to it.
    for pom in ["clients/java/pom.xml", "clients/java/client/pom.xml", "clients/java/spring-boot-starter/pom.xml",
                "clients/java/example/pom.xml"]:
        text = (ROOT / pom).read_text()
        m = re.search(r"<artifactId>cotx-java</artifactId>\s*<version>([^<]+)</version>", text)
        assert m and m.group(1) == v, f"{pom} must name version {v} of io.cotx:cotx-java"
    h = (ROOT / "mysql_co_plugin/version.h").read_text()
    assert re.search(r'#define MYSQL_CO_VERSION "([^"]+)"', h).group(1) == v
    assert int(re.search(r"#define MYSQL_CO_VERSION_HEX (0x[0-9a-fA-F]+)", h).group(1), 16) == (major << 8 | minor)


def test_pg_co_ships_an_install_script_for_the_release():
    """pg_co's SQL surface is versioned with the release: its install script exists."""
    v = release()
    assert (ROOT / "pg_co_ext/sql" / f"pg_co--{v}.sql").exists() or any(
        p.name.endswith(f"--{v}.sql") for p in (ROOT / "pg_co_ext/sql").iterdir()), f"no pg_co SQL for {v}"
