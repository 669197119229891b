"""The command line follows the conventions of its ecosystem (clap): --help and --version
exit 0, every subcommand has its own help, usage errors exit 2 on stderr, the config path
and the token can come from the environment (COTX_CONFIG, COTX_TOKEN)."""
import os
import subprocess

from cotx.daemon import find_binary

SUBCOMMANDS = ["serve", "check-config", "in-doubt", "show", "force", "audit", "bench-store"]
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "coordinator-daemon", "coordinator.example.toml")


def run(*args, env=None):
    return subprocess.run([find_binary(), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0 and all(c in r.stdout for c in SUBCOMMANDS), r
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("cotx-coordinator "), r
    for c in SUBCOMMANDS:
        r = run(c, "--help")
        assert r.returncode == 0 and "Usage: cotx-coordinator " + c in r.stdout, (c, r)


def test_usage_errors_exit_2_on_stderr():
    r = run()
    assert r.returncode == 2 and "Usage" in r.stderr and not r.stdout
    r = run("force", "--config", EXAMPLE, "g.1-1", "maybe", "--reason", "x")
    assert r.returncode == 2 and "possible values: commit, abort" in r.stderr
    r = run("check-config", "--config", "/nonexistent.toml")
    assert r.returncode == 2 and "cannot read /nonexistent.toml" in r.stderr


def test_config_and_token_from_the_environment(tmp_path):
    r = run("check-config", env={"COTX_CONFIG": EXAMPLE})
    assert r.returncode == 0 and "config ok: node c1" in r.stdout, r
    r = run("check-config", env={"COTX_CONFIG": EXAMPLE, "COTX_TOKEN": "short"})
    assert r.returncode == 2 and "COTX_TOKEN" in r.stderr
