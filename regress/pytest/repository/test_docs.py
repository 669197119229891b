"""The docs name only things that exist. Every Markdown file of the repository is scanned
for the names it gives of pg_co GUCs, views and functions, mysql_co variables, status
variables and INFORMATION_SCHEMA tables, `cotx-coordinator` subcommands, repository paths
and `python -m` modules; each is looked up where it lives: a PostgreSQL server with pg_co
preloaded (SHOW, pg_catalog), a MariaDB server with mysql_co loaded (SHOW VARIABLES /
STATUS, INFORMATION_SCHEMA), the daemon's help text, the checkout, the venv. Each check
also runs on a planted wrong name, so a check that finds nothing cannot pass silently."""
import fnmatch
import importlib.util
import re
import subprocess
from pathlib import Path

import psycopg
from cotest.daemon import find_binary
from cotest.marks import requires_mysql_co, requires_pg_co

ROOT = Path(__file__).resolve().parents[3]
DOCS = sorted(p for p in ROOT.rglob("*.md")
              if not any(part.startswith(".") or part == "target" for part in p.relative_to(ROOT).parts))
FILE_SUFFIXES = ("md", "jsonl", "json", "csv", "png", "so", "control", "c", "h", "rs", "spec", "sql", "conf", "out", "toml", "py", "sh", "cc")


def named(pattern: str, files: bool = False) -> dict[str, list[str]]:
    """name -> docs naming it (pattern's group 1); file names (pg_co.md, co.conf) excluded
    unless `files`."""
    out: dict[str, list[str]] = {}
    rx = re.compile(pattern)
    for doc in DOCS:
        for m in rx.finditer(doc.read_text()):
            name = m.group(1)
            if not files and name.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue
            out.setdefault(name, []).append(str(doc.relative_to(ROOT)))
    return out


def missing(names: dict, exists) -> dict:
    return {n: sorted(set(docs)) for n, docs in names.items() if not exists(n)}


def check(names: dict, exists, planted: str):
    assert names, "the pattern found no names in the docs"
    assert missing({planted: ["(planted)"]}, exists), f"the check accepts a wrong name: {planted}"
    bad = missing(names, exists)
    assert not bad, f"named in the docs but not found: {bad}"


@requires_pg_co
def test_pg_co_gucs(pg):
    def exists(name):
        try:
            pg.sql(f'SHOW "{name}"')     # works for hidden GUCs too (they are not in pg_settings)
            return True
        except psycopg.errors.UndefinedObject:
            return False
    check(named(r"\b(pg_co\.[a-z_]+)\b"), exists, "pg_co.no_such_setting")


@requires_pg_co
def test_pg_co_views_and_functions(pg):
    pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")

    def exists(name):
        obj = name.split(".", 1)[1]
        return bool(pg.sql("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE n.nspname = 'co' AND c.relname = %s UNION ALL "
                           "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                           "WHERE n.nspname = 'co' AND p.proname = %s", (obj, obj)))
    check(named(r"(?<![\w./-])(co\.[a-z_]+)\b"), exists, "co.no_such_view")


@requires_mysql_co
def test_mysql_co_variables_status_and_tables(mariadb):
    variables = {r[0].lower() for r in mariadb.sql("SHOW GLOBAL VARIABLES LIKE 'mysql\\_co\\_%'")}
    status = {r[0].lower() for r in mariadb.sql("SHOW GLOBAL STATUS LIKE 'mysql\\_co\\_%'")}
    tables = {r[0].upper() for r in mariadb.sql("SELECT TABLE_NAME FROM information_schema.TABLES "
                                                "WHERE TABLE_SCHEMA = 'information_schema' AND TABLE_NAME LIKE 'MYSQL\\_CO\\_%'")}
    plugins = {r[0].lower() for r in mariadb.sql("SELECT PLUGIN_NAME FROM information_schema.PLUGINS")}
    # Lowercase mysql_co_* in the docs: system variables, plugins, or these names of code.
    code = {"mysql_co_plugin": (ROOT / "mysql_co_plugin").is_dir(),           # the folder
            "mysql_co_layout": "mysql_co_layout.h" in (ROOT / "scripts" / "build-mysql-co.sh").read_text(),  # generated header
            "mysql_co_rules": (ROOT / "mysql_co_plugin" / "mysql_co_rules.h").is_file(),            # the rules' header
            "mysql_co_rules_test": (ROOT / "mysql_co_plugin" / "mysql_co_rules_test.cc").is_file(),  # and its unit test
            "mysql_co_server_check": (ROOT / "mysql_co_plugin" / "mysql_co_server_check.h").is_file(),  # the load check
            "mysql_co_server_check_test": (ROOT / "mysql_co_plugin" / "mysql_co_server_check_test.cc").is_file()}
    check(named(r"\b(mysql_co_[a-z_]+)\b"), lambda n: n in variables or n in plugins or code.get(n, False),
          "mysql_co_no_such_variable")
    check(named(r"\b(Mysql_co_[a-z_]+)\b"), lambda n: n.lower() in status, "Mysql_co_no_such_status")
    check(named(r"\b(MYSQL_CO_[A-Z_]+)\b"), lambda n: n in tables, "MYSQL_CO_NO_SUCH_TABLE")


def test_coordinator_subcommands():
    p = subprocess.run([find_binary(), "--help"], capture_output=True, text=True, timeout=30)
    usage = p.stdout + p.stderr
    # Hand-written usage ("cotx-coordinator serve --config FILE") or clap's command list
    # ("  serve  Run the daemon"): a subcommand is a whole word at the start of a line or
    # after the program name.
    listed = set(re.findall(r"(?m)^\s*(?:cotx-coordinator\s+)?([a-z][a-z-]+)\b", usage))
    check(named(r"cotx-coordinator ([a-z][a-z-]*[a-z])\b"), lambda n: n in listed, "no-such-command")


def test_repository_paths():
    top = "scripts|regress|bench|checker|demo|harness|clients|docs|pg_co_ext|mysql_co_plugin|coordinator-daemon|sql"
    # A path ends before a character that makes it a pattern ("test_*.py", "test-<name>.sh").
    paths = named(rf"(?<![\w/.-])((?:{top})/[\w./-]*[\w/])(?![\w*<{{-]|\.[\w*])", files=True)
    check(paths, lambda p: (ROOT / p).exists(), "scripts/no-such-script.sh")


def test_python_modules():
    def exists(mod):
        try:
            return importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            return False
    check(named(r"python3? -m ([a-z_][a-z_.]*[a-z_])\b"), exists, "no_such_module")


# Specs whose rule is switched off elsewhere, and why.
SPEC_OFF_ELSEWHERE = {"wait_mode.spec": "rule B's alternative (wait instead of refuse); rule B off is in rule_b.spec"}


def test_every_isolation_spec_switches_its_rule_off():
    """docs/testing.md: each rule is shown twice, its spec has a permutation with the rule
    off. A step that turns a pg_co setting off must be used by some permutation."""
    specs = [p for p in ROOT.rglob("specs/*.spec") if "upstream" not in p.parts and "target" not in p.parts]
    assert specs, "no isolation specs found"
    without = []
    for spec in specs:
        text = spec.read_text()
        off_steps = set(re.findall(r"(?m)^\s*step\s+(\w+)\s*\{[^}]*SET\s+LOCAL\s+pg_co\.\w+\s*=\s*'?off", text))
        perms = re.findall(r"(?m)^\s*permutation\s+(.*)$", text)
        used = any(off_steps & {s.split("(")[0] for s in p.split()} for p in perms)
        if not used and spec.name not in SPEC_OFF_ELSEWHERE:
            without.append(str(spec.relative_to(ROOT)))
    assert not without, f"isolation specs without a permutation that switches their rule off: {without}"


TRACKER = re.compile(r"\b(issue|ticket|bug) ?#?\d+\b|\bbench\d+\b", re.I)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".rs", ".c", ".h", ".cc", ".toml", ".spec", ".sql", ".conf", ".txt", ".yml", ".json"}


def test_no_references_to_an_outside_tracker():
    """Comments, docs and generated markers say what a thing is, not which ticket asked
    for it: the tracker is not part of the repository."""
    def sources():
        for p in ROOT.rglob("*"):
            parts = p.relative_to(ROOT).parts
            if p.is_file() and p.suffix in TEXT_SUFFIXES and not any(x.startswith(".") or x == "target" for x in parts):
                yield p
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
            for p in sources() if p.name != "test_docs.py"
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if TRACKER.search(line)]
    assert TRACKER.search("see issue 7") and TRACKER.search("<!-- bench7:generated -->")
    assert not hits, "\n".join(hits)


def test_no_import_path_hacks():
    """The project's packages are installed (scripts/install-python-packages.sh): nothing
    may make them importable by editing the import path."""
    hack = re.compile(r"sys\.path\.(insert|append)|PYTHONPATH=")
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in ROOT.rglob("*")
            if p.suffix in (".py", ".sh", ".md") and p.name != "test_docs.py"
            and not any(x.startswith(".") or x == "target" for x in p.relative_to(ROOT).parts)
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if hack.search(line)]
    assert not hits, hits


# Component folders whose README.md names every tracked file of the folder: by its name
# (or its path from the folder), or by a glob the README writes in backquotes (`t/*.test`,
# `plots/*.png`, `include/*` for a whole folder; a bare `folder/` names the folder, not its
# files). coordinator-daemon/README.md has its own module table and is not in this list.
COMPONENT_READMES = ["pg_co_ext", "mysql_co_plugin", "clients/python", "clients/go", "clients/java",
                     "clients/java/client", "clients/java/spring-boot-starter", "clients/java/example", "harness",
                     "checker", "bench", "regress", "scripts", "deploy", "deploy/images", "demo", "docs", "sql"]
# A README that links a docs page's table of its files instead of copying it: the page's
# text counts as the README's.
README_TABLES = {"regress": "docs/testing.md"}
# Files no README has to name: package markers and lock files, which say nothing of their own.
UNNAMED_FILES = {"README.md", "__init__.py", "Cargo.lock", "go.sum", ".gitignore"}


def unnamed_in_readme(text: str, files: list[str]) -> list[str]:
    """The files (paths relative to the README's folder) that the README's text does not
    name."""
    globs = [p.removeprefix("./") for p in re.findall(r"`([^`\s]+)`", text) if "*" in p]

    def named_here(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text):
            return True              # by its name (or its path, which ends with it)
        return any(fnmatch.fnmatch(rel, p) or ("/" not in p and fnmatch.fnmatch(name, p)) for p in globs)
    return [rel for rel in files if rel.rsplit("/", 1)[-1] not in UNNAMED_FILES and not named_here(rel)]


def test_component_readmes_name_every_file():
    """Each component folder's README.md says what every one of its files is: a file added,
    moved or renamed without a line there fails (files under a subfolder with a README of
    its own are that README's)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    bad = {}
    for d in COMPONENT_READMES:
        folder = ROOT / d
        if not (folder / "README.md").is_file():
            bad[d] = "no README.md"
            continue
        files = []
        for f in tracked:
            if not f.startswith(d + "/"):
                continue
            rel = f[len(d) + 1:]
            parents = ["/".join(rel.split("/")[:i]) for i in range(1, rel.count("/") + 1)]
            if any((folder / p / "README.md").is_file() for p in parents):
                continue             # a subfolder's README names it
            files.append(rel)
        text = (folder / "README.md").read_text()
        if d in README_TABLES:
            text += (ROOT / README_TABLES[d]).read_text()
        if unnamed := unnamed_in_readme(text, files):
            bad[d] = unnamed
    # The check itself: a file named by its name or a glob passes, others do not.
    planted = unnamed_in_readme("`t/*.test` with `r/*.result`; `mysql_co.cc`, `include/*`, `src/`, test_x.py",
                                ["t/a.test", "r/a.result", "mysql_co.cc", "include/a.inc", "mysql_co.h", "x.py",
                                 "t/a.opt", "src/a.rs"])
    assert planted == ["mysql_co.h", "x.py", "t/a.opt", "src/a.rs"], planted
    assert not bad, f"files the component README does not name: {bad}"
