"""The Go tests the bootstrap runs to warm the module and build caches
(scripts/bootstrap-tm.sh) run on a fresh machine: with no test servers (PG_PORT and MY_PORT
unset) and offline (the module cache it has just filled). A loose `-run` pattern once
matched a later test that needs the servers, and a fresh machine's set-up command failed."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def bootstrap_go_pattern() -> str:
    text = (ROOT / "scripts/bootstrap-tm.sh").read_text()
    m = re.search(r"go test -count=1 -run '([^']+)' \.", text)
    assert m, "bootstrap-tm.sh's Go test command not found"
    return m.group(1)


def test_the_bootstraps_go_tests_need_no_servers():
    if not shutil.which("go") and not Path("/usr/local/go/bin/go").exists() and not Path("/usr/lib/go/bin/go").exists():
        pytest.skip("no Go toolchain (scripts/bootstrap-tm.sh installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG_", "MY_", "BARE_"))}
    script = ('source scripts/lib.sh && source scripts/tm-env.sh && cd clients/go && '
              'GOPROXY=off GOFLAGS=-mod=readonly go test -count=1 -v -run "$1" .')
    p = subprocess.run(["bash", "-c", script, "go-test", bootstrap_go_pattern()], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ran = re.findall(r"^--- PASS: (\S+)", p.stdout, re.M)
    assert ran, p.stdout
