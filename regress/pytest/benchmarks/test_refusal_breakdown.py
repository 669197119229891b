"""bench/harness/refusal_breakdown.py on real refusals: a true row conflict and a conflict
of two different rows on the same primary-key leaf page are told apart, through the
blocker line pg_co puts in every refusal's DETAIL and the page map read from the server."""
import json

import psycopg
import pytest
from bench.harness import refusal_breakdown as rb
from cotest.marks import requires_pg_co

pytestmark = [requires_pg_co, pytest.mark.usefixtures("pg_major")]


@pytest.fixture(scope="module")
def pg(pg_with_ext):
    return pg_with_ext


def fresh_table(s):
    s.sql("DROP TABLE IF EXISTS acct")
    s.sql("CREATE TABLE acct (id int PRIMARY KEY, v int)")
    # Ids 1..200 except 150: one leaf page of the primary key, one heap page.
    s.sql("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 200) g WHERE g <> 150")


def begin(s):
    c = s.connect()
    c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
    return c


def attempt(gtid, outcome, read, written, error=None):
    return {"gtid": gtid, "mode": "co", "t": 0.0, "outcome": outcome,
            "branches": [{"db": "pg", "bid": "b0", "table": "acct", "read": read, "written": written}],
            "error": error}


def refused_by_rule_b(s, x_reads, t_write_sql):
    """X reads `x_reads` (and writes row 199 so it is not read-only) and prepares as
    'cotx:gX:b0'; T then runs `t_write_sql` and is refused at PREPARE by rule B. Returns the
    refusal as an attempt log's error object."""
    x, t = begin(s), begin(s)
    for k in x_reads:
        x.execute("SELECT v FROM acct WHERE id = %s", (k,))
    x.execute("UPDATE acct SET v = 1 WHERE id = 199")
    t.execute(t_write_sql)
    x.execute("PREPARE TRANSACTION 'cotx:gX:b0'")
    with pytest.raises(psycopg.errors.SerializationFailure) as e:
        t.execute("PREPARE TRANSACTION 'cotx:gT:b0'")
    s.sql("COMMIT PREPARED 'cotx:gX:b0'")
    d = e.value.diag
    return {"db": "pg", "sqlstate": e.value.sqlstate, "message": d.message_primary, "detail": d.message_detail}


def classify(s, tmp_path, attempts):
    log = tmp_path / "attempts.jsonl"
    log.write_text("".join(json.dumps(a) + "\n" for a in attempts))
    with psycopg.connect(s.dsn, autocommit=True) as c:
        counts, rows = rb.breakdown(rb.load(str(log)), rb.PageMap(c))
    return counts, rows


def test_true_row_conflict_is_labelled_same_row(pg, tmp_path):
    fresh_table(pg)
    err = refused_by_rule_b(pg, [7], "UPDATE acct SET v = 2 WHERE id = 7")
    b = rb.parse_blocker(err["detail"])
    assert (b.rule, b.point, b.gid, b.state) == ("B", "PREPARE", "cotx:gX:b0", "in_doubt"), err["detail"]
    counts, rows = classify(pg, tmp_path, [attempt("gX", "commit", [7], [199]),
                                           attempt("gT", "abort", [], [7], err)])
    assert rows == [{"gtid": "gT", "rule": "B", "label": "same_row", "blocker_gid": "cotx:gX:b0"}]


def test_different_rows_on_one_leaf_page_are_labelled_same_index_page(pg, tmp_path):
    fresh_table(pg)
    # X reads row 7; T inserts row 150 into the same leaf page of the primary key: SSI
    # sees an rw-conflict on the page, though no row is shared.
    err = refused_by_rule_b(pg, [7], "INSERT INTO acct VALUES (150, 0)")
    counts, rows = classify(pg, tmp_path, [attempt("gX", "commit", [7], [199]),
                                           attempt("gT", "abort", [], [150], err)])
    assert rows[0]["label"] == "same_index_page", rows
    assert counts == {("B", "same_index_page"): 1}


def test_blocker_missing_from_the_log_is_unknown(pg, tmp_path):
    fresh_table(pg)
    err = refused_by_rule_b(pg, [7], "UPDATE acct SET v = 2 WHERE id = 7")
    counts, _ = classify(pg, tmp_path, [attempt("gT", "abort", [], [7], err)])
    assert counts == {("B", "unknown"): 1}


def test_cli_prints_counts_per_rule_and_label(pg, tmp_path, capsys):
    fresh_table(pg)
    err = refused_by_rule_b(pg, [7], "UPDATE acct SET v = 2 WHERE id = 7")
    log = tmp_path / "a.jsonl"
    log.write_text("\n".join(json.dumps(a) for a in [attempt("gX", "commit", [7], [199]),
                                                     attempt("gT", "abort", [], [7], err)]))
    assert rb.main([str(log), "--pg-dsn", pg.dsn, "--table", "acct"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["rule"] + rb.LABELS + ["total"]
    assert out[1].split() == ["B", "1", "0", "0", "0", "0", "0", "1"]


def test_page_map_tells_leaf_and_heap_pages_apart(pg):
    """Neighbouring keys share the leaf and heap page, far keys do not; a key that does not
    exist has a leaf page (where it would be) and no heap page. Without this, every pair
    would look like a page conflict."""
    pg.sql("DROP TABLE IF EXISTS big")
    pg.sql("CREATE TABLE big (id int PRIMARY KEY, v int)")
    pg.sql("INSERT INTO big SELECT g, 0 FROM generate_series(1, 5000) g WHERE g <> 2")
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        m = rb.PageMap(c)
        first, near, far, missing = (m.pages("big", k) for k in (1, 3, 5000, 2))
    assert None not in first + near + far
    assert first == near and first[0] != far[0] and first[1] != far[1]
    assert missing == (first[0], None)
    reader, writer = rb.Side(), rb.Side()
    reader.read["big"] = {1}
    writer.written["big"] = {5000}
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        assert rb.classify("A", reader, writer, False, rb.PageMap(c)) == "relation"


def refused_by_rule_a_after_a_local_decision(s):
    """T reads row 7; X writes it and commits locally with co.decide in it (dip's decision
    branch: no gid); T's PREPARE is then refused by rule A. Returns (X's xid as the driver
    logs it, the refusal as an attempt log's error object)."""
    x, t = begin(s), begin(s)
    t.execute("SELECT v FROM acct WHERE id = 7")
    t.execute("UPDATE acct SET v = 1 WHERE id = 198")
    x.execute("UPDATE acct SET v = 2 WHERE id = 7")
    xid = x.execute("SELECT co.decide('gX'), (pg_current_xact_id()::text::bigint % 4294967296)::text").fetchone()[1]
    x.execute("COMMIT")
    with pytest.raises(psycopg.errors.SerializationFailure) as e:
        t.execute("PREPARE TRANSACTION 'cotx:gT:b0'")
    d = e.value.diag
    return int(xid), {"db": "pg", "sqlstate": e.value.sqlstate, "message": d.message_primary, "detail": d.message_detail}


def test_locally_committed_blocker_is_joined_by_its_xid(pg, tmp_path):
    """dip's decision branch commits in one phase, so a refusal names it by xid only: with
    the xid the driver logs for it, the refusal is labelled; without, it stays unknown."""
    fresh_table(pg)
    xid, err = refused_by_rule_a_after_a_local_decision(pg)
    b = rb.parse_blocker(err["detail"])
    assert (b.rule, b.gid, b.xid) == ("A", None, str(xid)), err["detail"]
    x = attempt("gX", "commit", [], [7])
    refused = dict(attempt("gT", "abort", [7], [198], err), mode="dip")
    counts, _ = classify(pg, tmp_path, [x, refused])
    assert counts == {("A", "unknown"): 1}
    x["branches"][0]["pg_xid"] = xid
    counts, rows = classify(pg, tmp_path, [x, refused])
    assert counts == {("A", "same_row"): 1}, rows


def test_only_measured_refusals_of_the_asked_mode_count(pg, tmp_path):
    fresh_table(pg)
    err = refused_by_rule_b(pg, [7], "UPDATE acct SET v = 2 WHERE id = 7")
    x = attempt("gX", "commit", [7], [199])
    warm = dict(attempt("gT", "abort", [], [7], err), measured=False)
    log = [x, warm, dict(warm, gtid="gU", measured=True)]
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        assert rb.breakdown(log, rb.PageMap(c))[0] == {("B", "same_row"): 1}
        assert rb.breakdown(log, rb.PageMap(c), {"dip"})[0] == {}
        assert rb.breakdown(log, rb.PageMap(c), {"co"})[0] == {("B", "same_row"): 1}


def test_run_all_breaks_down_a_variant_from_its_own_log(pg, tmp_path):
    """A variant's log (co:par) holds attempts the driver labels with the base mode (co):
    its breakdown must still be found, keyed by the variant."""
    from types import SimpleNamespace

    from bench import experiments
    fresh_table(pg)
    err = refused_by_rule_b(pg, [7], "UPDATE acct SET v = 2 WHERE id = 7")
    log = tmp_path / "point_par.jsonl"
    log.write_text("".join(json.dumps(a) + "\n" for a in [attempt("gX", "commit", [7], [199]),
                                                          attempt("gT", "abort", [], [7], err)]))
    out = experiments.refusal_breakdowns(SimpleNamespace(pg=pg), log, ["co:par"])
    assert list(out) == ["co:par"] and out["co:par"].splitlines()[1].split() == ["B", "1", "0", "0", "0", "0", "0", "1"], out
