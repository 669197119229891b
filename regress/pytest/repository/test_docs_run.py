"""The docs' commands are run. Every shell block of README.md, docs/*.md and the
components' READMEs carries a marker (docblocks.py; docs/testing.md, "Docs that are
run"): `doc-run` blocks are executed here as written, in a throwaway directory, against
real servers and the real daemon where they need them; `doc-skip` blocks say why they
cannot be. A new block without a marker fails the first test, so a command that does not
work can no longer be written into the docs unnoticed."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pymysql
import pytest
from cotest import MariaServer, PgServer
from cotx import Coordinator
from cotest.daemon import Daemon, find_binary
from docblocks import ROOT, Block, all_blocks, docs

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.kind == "run"]
VENV_PY = "/var/cache/cotx/venv/bin/python"


def test_every_shell_block_is_marked():
    unmarked = [f"{b.where}: {b.text.splitlines()[0][:70]}" for b in BLOCKS if b.shell and b.kind is None]
    assert not unmarked, ("shell blocks without <!-- doc-run --> or <!-- doc-skip: reason --> "
                          "(docs/testing.md, \"Docs that are run\"); output and diagrams are ```text:\n"
                          + "\n".join(unmarked))
    no_reason = [b.where for b in BLOCKS if b.kind == "skip" and len(b.reason) < 10]
    assert not no_reason, f"doc-skip needs a reason: {no_reason}"
    stray = [b.where for b in BLOCKS if b.kind == "run" and not b.shell and b.lang != "sql"]
    assert not stray, f"doc-run on a block that is neither shell nor SQL: {stray}"
    unknown = [f"{b.where}: {b.args}" for b in RUN if set(b.args) - {"with", "sql", "expect"}
               or b.args.get("with", "") not in (SQL_SETUPS if b.lang == "sql" else SETUPS)
               or b.args.get("sql", "pg") not in ("pg", "mariadb")
               or (b.lang == "sql") != ("sql" in b.args)]
    assert not unknown, f"doc-run options not understood (with={sorted(SETUPS)}, sql=pg|mariadb, expect=STATUS): {unknown}"


def test_the_extractor_sees_every_kind_of_block(tmp_path):
    """The parser is what the marker check stands on: each kind of block is found, and
    four spaces inside a list item are not a code block."""
    doc = tmp_path / "x.md"
    doc.write_text("Intro.\n\n    bash a.sh\n\n- item\n\n    continued item text\n\nText.\n\n"
                   "<!-- doc-skip: needs the moon -->\n```sh\nb\n```\n\n```\nc\n```\n\n"
                   "<!-- doc-run: with=coordinator -->\n```bash\nd\n```\n\n```text\nout\n```\n"
                   "```` ```sh ```` is inline code\n")
    from docblocks import blocks
    got = [(b.lang, b.text.strip(), b.kind, b.reason, b.args) for b in blocks(doc)]
    assert got == [("", "bash a.sh", None, "", {}), ("sh", "b", "skip", "needs the moon", {}),
                   ("", "c", None, "", {}), ("bash", "d", "run", "", {"with": "coordinator"}),
                   ("text", "out", None, "", {})], got


# A bare `python` is whatever the user's PATH has (here a pyenv shim without the project's
# packages): the docs name the venv's interpreter.
BARE_PYTHON = re.compile(r"(?:^|[;&|(]\s*|\s&&\s*)(?:[A-Z_]+=\S+\s+)*python3?\s", re.M)


def test_no_bare_python_in_shell_blocks():
    hits = [b.where for b in BLOCKS if b.shell and BARE_PYTHON.search(re.sub(r"#.*", "", b.text))]
    assert BARE_PYTHON.search("cd x && python -m checker\n")
    assert not hits, f"shell blocks running a bare `python` (use {VENV_PY}): {hits}"


# The same in prose: an inline command (`python -m checker ...`) runs as written only with
# the venv's interpreter (Debian 12 has no `python`; python3 lacks the project's packages).
INLINE_PYTHON = re.compile(r"`python3? (-m |[\w./-]+\.py\b)")


def test_no_bare_python_in_inline_commands():
    assert INLINE_PYTHON.search("run `python -m checker --help`")
    hits = [f"{d.relative_to(ROOT)}: {m.group(0)}" for d in docs() for m in INLINE_PYTHON.finditer(d.read_text())]
    assert not hits, f"inline commands running a bare `python` (use {VENV_PY}): {hits}"


KEYWORDS = {"for", "do", "done", "if", "then", "else", "fi", "while", "in", "cd", "export", "umask", "set",
            "source", ".", "test", "echo", "true", "false"}


def command_words(text: str):
    """The first word of each command of a shell block (after VAR=value assignments, and
    after ; && || | ( and do/then)."""
    for line in re.sub(r"\\\n", " ", text).splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        start = True
        for tok in lex:
            if set(tok) <= set(";&|()"):
                start = True
            elif start and not re.match(r"^[A-Za-z_]\w*=", tok):
                yield tok
                start = tok in ("do", "then", "else")


def provided(earlier: list[Block]) -> set[str]:
    """Commands a doc's earlier blocks make available: `export PATH=DIR:$PATH`, `install
    FILE DIR/`, `apt install ./NAME_VERSION_ARCH.deb`."""
    names = set()
    for b in earlier:
        for d in re.findall(r"export PATH=([^:$\s]+):", b.text):
            names |= {p.name for p in Path(d).glob("*")}
        names |= {Path(f).name for f in re.findall(r"^install (?:-m \d+ )?(\S+) /\S+/\s", b.text, re.M)}
        names |= set(re.findall(r"apt install \./(?:\S*/)?([a-z0-9.+-]+)_[^_\s]+_\w+\.deb", b.text))
        # Debian packages a block installs by name (apt-get install podman runc): their
        # commands exist once it has run, on the machine the block is for.
        for pkgs in re.findall(r"apt(?:-get)? install ((?:[a-z0-9][a-z0-9.+-]* ?)+)", b.text):
            names |= set(pkgs.split())
    return names


# Commands a doc may run that need not be on PATH here, each with why.
NOT_ON_PATH = {
    "helm": "built into $COTX_CACHE/tools by scripts/bootstrap-helm.sh, off PATH (test_helm_chart.py runs it)",
    "kubectl": "a cluster's client: no cluster here (deploy/helm/README.md's blocks are doc-skip)",
}


def test_commands_of_every_shell_block_exist():
    """Skipped blocks are not run, so at least what they run must exist here: a path, a
    command on PATH, or one that an earlier block of the same doc put there (a binary
    named that is not on PATH was the drift that started this)."""
    assert list(command_words("A=1 b x; cd d && e | f\nfor v in 1; do g $v; done  # h i")) == \
        ["b", "cd", "e", "f", "for", "do", "g", "done"]
    missing = []
    for doc in sorted({b.doc for b in BLOCKS}):
        shells = [b for b in BLOCKS if b.doc == doc and b.shell and b.kind]
        for i, b in enumerate(shells):
            have = provided(shells[:i + 1])
            for w in command_words(b.text):
                if w in KEYWORDS or w.startswith("$") or w in have or w in NOT_ON_PATH:
                    continue
                if not (Path(w).exists() if "/" in w else shutil.which(w)):
                    missing.append(f"{b.where}: {w}")
    assert not missing, f"shell blocks run commands that do not exist here: {missing}"


# --- running ----------------------------------------------------------------------------

def workdir(tmp_path: Path) -> Path:
    """A throwaway directory that looks like the checkout (the docs' commands are written
    for its root): every top-level entry linked in, so files a block creates land here."""
    w = tmp_path / "work"
    w.mkdir()
    for p in ROOT.iterdir():
        if not p.name.startswith("."):
            (w / p.name).symlink_to(p)
    return w


def run(block: Block, cwd: Path, env: dict, argv: list[str] | None = None, timeout: int = 240,
        stdin: str | None = None):
    """The block's text, unchanged, through bash with -e: a failing command fails the test
    (as it would stop a user). `expect=N`: the block ends with a command whose documented
    exit status is N (the checker's 1 for a history with cycles); every command before it
    must still succeed."""
    p = subprocess.run(argv or ["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=cwd, env=env,
                       input=stdin, capture_output=True, text=True, timeout=timeout)
    why = (f"{block.where} failed (exit {p.returncode}):\n{block.text}\n"
           f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}")
    assert p.returncode == int(block.args.get("expect", 0)), why
    assert "Traceback (most recent call last)" not in p.stderr, why   # a crash is not the documented status
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


@contextmanager
def plain(block, work, env):
    yield env


@contextmanager
def coordinator(block, work, env, forced_abort=True):
    """What coordinator.md's earlier steps set up: the daemon built and on PATH
    (`export PATH=/var/cache/cotx/bin:$PATH`), running with a config file the CLI reads
    from COTX_CONFIG, and GTID naming a transaction in doubt (a branch prepared, no
    decision), the case the operator commands are for. `forced_abort`: the block ends
    with `force "$GTID" abort`, and that is checked."""
    with PgServer() as pg:
        pg.sql("CREATE TABLE orders (id int PRIMARY KEY)")
        d = Daemon([{"name": "orders", "kind": "postgres", "dsn": pg.dsn}],
                   timeouts={"transaction_ms": 600000}, workdir=str(_mkdir(work / "coord"))).start()
        try:
            conn = pg.connect()
            tx = Coordinator(d.url, d.token).transaction()
            with tx.branch(conn, "orders"):
                conn.execute("INSERT INTO orders VALUES (1)")
            tx.prepare_all()
            conn.close()
            yield {**env, "PATH": f"{Path(find_binary()).parent}:{env['PATH']}",
                   "COTX_CONFIG": str(d.config), "GTID": tx.gtid}
            if not forced_abort:
                return
            # force ... abort was obeyed: the branch is rolled back, nothing left prepared.
            deadline = time.time() + 30
            while pg.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0] and time.time() < deadline:
                time.sleep(0.2)
            assert pg.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0] == 0
            assert pg.sql("SELECT count(*) FROM orders")[0][0] == 0
        finally:
            d.destroy()


@contextmanager
def operator(block, work, env):
    """ops.md's runbooks: the same daemon and GTID as `coordinator`; a runbook looks, and
    may force either outcome (what stays prepared goes with the servers)."""
    with coordinator(block, work, env, forced_abort=False) as e:
        yield e


# A host as ops.md's "Install (systemd)" finds it: no user cotx, nothing in /usr/local/bin,
# /etc/cotx or /var/lib/cotx. The block runs as root in a private mount namespace over a
# copy of /etc without cotx, with empty /usr/local/bin and /var/lib: the real host's files
# and users are not touched.
FRESH_HOST = r"""
set -e
cp -a /etc "$DOC_HOST/etc"
for f in passwd group shadow gshadow; do sed -i '/^cotx:/d' "$DOC_HOST/etc/$f"; done
mount --bind "$DOC_HOST/etc" /etc
mount -t tmpfs tmpfs /usr/local/bin
mount -t tmpfs tmpfs /var/lib
if id cotx >/dev/null 2>&1; then echo 'cotx exists before the block ran'; exit 1; fi
bash -e -o pipefail -c "$DOC_BLOCK"
# what the service needs afterwards
id cotx
test "$(stat -c %U:%G:%a /var/lib/cotx)" = cotx:cotx:750
test "$(stat -c %G:%a /etc/cotx/token)" = cotx:640
runuser -u cotx -- /usr/local/bin/cotx-coordinator check-config --config /etc/cotx/coordinator.toml
"""


@contextmanager
def fresh_host(block, work, env):
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("needs root and unshare --mount (a private mount namespace)")
    (work / "host").mkdir()
    yield {**env, "DOC_HOST": str(work / "host"), "DOC_BLOCK": block.text,
           "DOC_ARGV": "unshare"}


SETUPS = {"": plain, "coordinator": coordinator, "operator": operator, "fresh-host": fresh_host}


def run_sql(block: Block, server, cwd: Path):
    """Typed into psql / the mariadb client (statement by statement, each in its own
    transaction, as pasted), as the server's superuser, stopping at the first error."""
    if isinstance(server, PgServer):
        argv = [str(server.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                "-p", str(server.port), "-U", "postgres", "-d", "postgres", "-f", "-"]
    else:
        argv = ["mariadb", f"--socket={server.socket}", "-uroot"]
    run(block, cwd, dict(os.environ), argv, timeout=60, stdin=block.text)


@pytest.mark.parametrize("block", [b for b in RUN if b.lang != "sql"], ids=lambda b: b.where)
def test_shell_block_runs(block, tmp_path):
    work = workdir(tmp_path)
    with SETUPS[block.args.get("with", "")](block, work, dict(os.environ)) as env:
        argv = ["unshare", "--mount", "bash", "-c", FRESH_HOST] if env.pop("DOC_ARGV", None) else None
        run(block, work, env, argv)


def _pg_co_at_0_1_0(server):
    """pg_co.md's upgrade: a database that has the extension at an old version."""
    server.sql("CREATE EXTENSION pg_co VERSION '0.1.0'")
    yield
    assert server.sql("SELECT e.extversion = a.default_version FROM pg_extension e "
                      "JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'pg_co'") == [(True,)]


def _nothing(server):
    yield


# SQL blocks' `with=`: the state the doc says the block starts from, and what must hold after.
SQL_SETUPS = {"": _nothing, "pg_co-0.1.0": _pg_co_at_0_1_0}


@pytest.mark.parametrize("block", [b for b in RUN if b.lang == "sql"], ids=lambda b: b.where)
def test_sql_block_runs(block, tmp_path):
    """On a fresh server."""
    with (PgServer() if block.args["sql"] == "pg" else MariaServer()) as server:
        if block.args.get("with") and not server.preload:
            pytest.skip("pg_co is not installed (run scripts/build.sh)")
        steps = SQL_SETUPS[block.args.get("with", "")](server)
        next(steps)
        run_sql(block, server, workdir(tmp_path))
        next(steps, None)


# --- the database accounts of ops.md, used -------------------------------------------------

def _ops_sql(kind: str) -> list[Block]:
    got = [b for b in RUN if b.doc.name == "ops.md" and b.args.get("sql") == kind]
    assert got, f"ops.md has no doc-run SQL block for {kind}"
    return got


def _wait(pred, what: str, timeout: float = 30):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_ops_accounts_let_the_daemon_finish_branches(tmp_path):
    """The accounts ops.md creates are enough for the daemon: the decision store as
    cotx_coordinator (it creates its tables), recovery of a PostgreSQL branch the
    application's role prepared, and of a MariaDB XA branch the application prepared,
    through the recovery account. A role of its own on PostgreSQL could not finish the
    branch: that is why ops.md uses the application's role."""
    work = workdir(tmp_path)
    with PgServer() as pg, MariaServer() as my:
        for b in _ops_sql("pg"):
            run_sql(b, pg, work)
        for b in _ops_sql("mariadb"):
            run_sql(b, my, work)
        # What the applications have already: their tables, and on MariaDB their account.
        pg.sql("CREATE TABLE orders (id int PRIMARY KEY)", dbname="orders")
        pg.sql("ALTER TABLE orders OWNER TO orders_app", dbname="orders")
        my.sql("CREATE DATABASE IF NOT EXISTS stock")
        my.sql("CREATE TABLE stock.items (id int PRIMARY KEY) ENGINE=InnoDB")
        my.sql("CREATE USER 'shop_app'@'%' IDENTIFIED BY 'CHANGE-ME'")
        my.sql("GRANT SELECT, INSERT, UPDATE, DELETE ON stock.* TO 'shop_app'@'%'")
        # The trust authentication of the harness's servers ignores passwords; the roles
        # and grants are what is checked.
        pg_dsn = f"host=127.0.0.1 port={pg.port} user=%s password=CHANGE-ME dbname=%s"
        d = Daemon([{"name": "orders", "kind": "postgres", "dsn": pg_dsn % ("orders_app", "orders")},
                    {"name": "stock", "kind": "mariadb",
                     "dsn": f"mysql://cotx_recovery:CHANGE-ME@127.0.0.1:{my.port}/stock"}],
                   store={"kind": "postgres", "dsn": pg_dsn % ("cotx_coordinator", "cotx"), "table": "cotx_decisions"},
                   timeouts={"owner_grace_ms": 200}, workdir=str(_mkdir(work / "coord"))).start()
        try:
            pc = psycopg.connect(pg_dsn % ("orders_app", "orders"), autocommit=True)
            mc = pymysql.connect(host="127.0.0.1", port=my.port, user="shop_app", password="CHANGE-ME",
                                 database="stock", autocommit=True)
            tx = Coordinator(d.url, d.token).transaction()
            with tx.branch(pc, "orders"):
                pc.execute("INSERT INTO orders VALUES (1)")
            with tx.branch(mc, "stock"):
                mc.cursor().execute("INSERT INTO items VALUES (1)")
            # Decided commit, and the owner gone before finishing its branches: the daemon
            # finishes both with its own connections, i.e. with these accounts.
            assert tx._commit_call({"prepared": tx.prepare_all(report=False)}) == "commit"
            pc.close()
            mc.close()
            _wait(lambda: not pg.sql("SELECT gid FROM pg_prepared_xacts") and not my.sql("XA RECOVER"),
                  "the daemon to finish the prepared branches")
            assert pg.sql("SELECT id FROM orders", dbname="orders") == [(1,)]
            assert my.sql("SELECT id FROM stock.items") == ((1,),)
            assert pg.sql("SELECT tableowner FROM pg_tables WHERE tablename = 'cotx_decisions'", dbname="cotx") \
                == [("cotx_coordinator",)]
        finally:
            d.destroy()
        # Why not a recovery role of its own on PostgreSQL: it sees the branch, but may
        # not finish it.
        pg.sql("CREATE ROLE own_recovery LOGIN")
        with psycopg.connect(pg_dsn % ("orders_app", "orders"), autocommit=True) as c:
            c.execute("BEGIN; INSERT INTO orders VALUES (2); PREPARE TRANSACTION 'cotx:x:0'")
        with psycopg.connect(pg_dsn % ("own_recovery", "orders"), autocommit=True) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("COMMIT PREPARED 'cotx:x:0'")
        pg.sql("ROLLBACK PREPARED 'cotx:x:0'", dbname="orders")
