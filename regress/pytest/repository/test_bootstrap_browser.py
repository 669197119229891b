"""The console test's browser on a fresh machine (scripts/bootstrap-browser.sh). Debian's
bookworm-security keeps only its newest chromium build, so the pin in scripts/lib.sh goes
stale within weeks; a stale pin once stopped every fresh machine's set-up command ("no
longer offered by apt: update CHROMIUM_VERSION"), and with it every CI run. Now a stale pin
costs a warning, not a failed set-up. Run on a copy of the two scripts with the pin
edited, so that nothing is installed or removed: these cases need no apt-get at all."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def installed(pkg: str) -> str:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", pkg], capture_output=True, text=True)
    return p.stdout.split()[-1] if p.stdout.startswith("install ok installed") else ""


@pytest.fixture
def browser():
    if os.geteuid() != 0 or not installed("chromium") or not shutil.which("apt-cache"):
        pytest.skip("needs root and Debian's chromium installed (bash scripts/bootstrap-browser.sh)")
    return installed("chromium")


def run_with_pin(tmp_path, pin: str) -> subprocess.CompletedProcess:
    """bootstrap-browser.sh from a copy of scripts/ whose lib.sh pins `pin`."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    lib = (ROOT / "scripts/lib.sh").read_text()
    lib, n = re.subn(r'^CHROMIUM_VERSION="[^"]*"', f'CHROMIUM_VERSION="{pin}"', lib, flags=re.M)
    assert n == 1, "CHROMIUM_VERSION not found in scripts/lib.sh"
    (scripts / "lib.sh").write_text(lib)
    shutil.copy(ROOT / "scripts/bootstrap-browser.sh", scripts)
    return subprocess.run(["bash", str(scripts / "bootstrap-browser.sh")], capture_output=True, text=True,
                          timeout=60)


def test_a_pin_apt_no_longer_offers_keeps_the_newer_browser_installed_with_a_warning(tmp_path, browser):
    stale = "100.0.0.1-1~deb12u1"  # older than any build bookworm has offered since 2026
    p = run_with_pin(tmp_path, stale)
    assert p.returncode == 0, p.stderr
    assert stale in p.stderr and f"update CHROMIUM_VERSION to {browser}" in p.stderr, p.stderr
    assert "installing" not in p.stderr, p.stderr
    assert [installed(x) for x in ("chromium", "chromium-common", "chromium-driver")] == [browser] * 3


def test_the_pinned_browser_installed_is_left_alone_without_a_word(tmp_path, browser):
    p = run_with_pin(tmp_path, browser)
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
