"""Rule S on real servers, every major. PostgreSQL's SSI ignores the read locks of the
committed transactions it summarized (when its pool of serializable transactions is
full), so a write skew whose reader was summarized before the writer wrote commits at
SERIALIZABLE: the committed G2 of the list-append upsert workload
(`python -m checker.list_append`). Shown four ways on one schedule: PostgreSQL alone
catches it while nothing is summarized; with a summarization in between it lets both
commit; pg_co's rule S refuses the writer's COMMIT; observe-only counts and logs that
refusal and lets it commit. Cause and code: docs/pg_co.md, "Rule S"."""
import psycopg
import pytest
from cotest.marks import requires_pg_co
from cotest import PgServer

pytestmark = [requires_pg_co, pytest.mark.usefixtures("pg_major")]

UPSERT = ("INSERT INTO {t} AS t (id, sk, val) VALUES (1, 1, %s) "
          "ON CONFLICT (id) DO UPDATE SET val = concat(t.val, ',', EXCLUDED.val) WHERE t.id = 1")


@pytest.fixture(scope="module")
def server(tiny_ssi_pool):
    with PgServer(conf=tiny_ssi_pool) as s:
        s.sql("CREATE EXTENSION pg_co")
        yield s


def write_skew(s, fillers: int, t1_settings: dict) -> str:
    """T1 reads a[1] (absent); T2 reads b[1] (absent), inserts a[1] (T1 -rw-> T2) and
    commits; `fillers` serializable transactions commit while T1 is open (with a tiny pool
    PostgreSQL summarizes T2); T1 inserts b[1] (T2 -rw-> T1) and commits. Returns
    "committed" or the SQLSTATE and message of T1's failure."""
    for t in ("a", "b", "filler"):
        s.sql(f"DROP TABLE IF EXISTS {t}")
        s.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, sk int NOT NULL, val text)")
    for t in ("a", "b"):   # rows elsewhere in the index: the reads lock a page, not the relation
        s.sql(f"INSERT INTO {t} SELECT g, g, 'x' FROM generate_series(100, 200) g")
    with s.connect() as t1, s.connect() as t2, s.connect() as f:
        t1.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        for k, v in t1_settings.items():
            t1.execute(f"SET LOCAL {k} = {v}")
        t2.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        assert t1.execute("SELECT val FROM a WHERE id = 1").fetchall() == []
        assert t2.execute("SELECT val FROM b WHERE id = 1").fetchall() == []
        t2.execute(UPSERT.format(t="a"), ("T2",))
        t2.execute("COMMIT")
        for i in range(fillers):
            f.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            f.execute("INSERT INTO filler VALUES (%s, %s, 'f')", (i, i))
            f.execute("COMMIT")
        try:
            t1.execute(UPSERT.format(t="b"), ("T1",))
            t1.execute("COMMIT")
        except psycopg.Error as e:
            return f"{e.sqlstate} {e}"
    # Both committed, neither saw the other's insert: no serial order explains that.
    assert s.sql("SELECT val FROM a WHERE id = 1") == [("T2",)]
    assert s.sql("SELECT val FROM b WHERE id = 1") == [("T1",)]
    return "committed"


def stat(s, column):
    return s.sql(f"SELECT {column} FROM co.stats")[0][0]


def test_without_summarization_postgresql_refuses_the_write_skew(server):
    out = write_skew(server, 0, {"pg_co.enabled": "off"})
    assert out.startswith("40001") and "read/write dependencies" in out, out


def test_summarized_reader_lets_the_write_skew_commit_without_pg_co(server):
    """PostgreSQL's own behaviour (the anomaly rule S exists for)."""
    assert write_skew(server, 300, {"pg_co.enabled": "off"}) == "committed"


def test_rule_s_refuses_the_writer(server):
    before = stat(server, "refused_rule_s")
    out = write_skew(server, 300, {})
    assert out.startswith("40001") and "rule S" in out, out
    assert stat(server, "refused_rule_s") == before + 1


def test_rule_s_off_lets_it_through(server):
    assert write_skew(server, 300, {"pg_co.rule_s": "off"}) == "committed"


def test_observe_only_counts_and_logs_rule_s(server):
    before = stat(server, "observed_rule_s")
    assert write_skew(server, 300, {"pg_co.observe_only": "on"}) == "committed"
    assert stat(server, "observed_rule_s") == before + 1
    assert "pg_co observe-only, not refused: pg_co refused COMMIT: rule S" in server.log_tail(100)
