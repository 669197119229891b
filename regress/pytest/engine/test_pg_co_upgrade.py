"""pg_co's versioned SQL surface on real servers: a database created at 0.1.0 (the frozen
pg_co_ext/sql/pg_co--0.1.0.sql) and brought forward with ALTER EXTENSION pg_co UPDATE has
exactly the catalog of a fresh CREATE EXTENSION pg_co, and keeps its rows. This is the
guard against drift: a change of the SQL surface without a new version and upgrade
script makes the two catalogs differ (pg_co_ext/README.md)."""
import difflib

import pytest
from cotest import PgServer
from cotest.marks import requires_pg_co

pytestmark = [requires_pg_co, pytest.mark.usefixtures("pg_major")]

# Everything the extension puts into a database, described without oids, one row per
# object or property, so that two databases compare as two lists of text.
CATALOG = r"""
WITH ext AS (SELECT * FROM pg_extension WHERE extname = 'pg_co'),
members AS (
  SELECT d.classid, d.objid FROM pg_depend d JOIN ext ON d.refobjid = ext.oid
  WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'),
co AS (SELECT oid FROM pg_namespace WHERE nspname = 'co')
SELECT 'extension', extname, concat_ws(' | ', extversion, extnamespace::regnamespace, extrelocatable,
       (SELECT array_agg(c::regclass::text ORDER BY 1) FROM unnest(extconfig) c), extcondition)
  FROM ext
UNION ALL
SELECT 'schema', nspname, concat_ws(' | ', pg_get_userbyid(nspowner), nspacl) FROM pg_namespace WHERE nspname = 'co'
UNION ALL
SELECT 'member', pg_describe_object(classid, objid, 0), '' FROM members
UNION ALL
SELECT 'function', p.oid::regprocedure::text,
       concat_ws(' | ', pg_get_functiondef(p.oid), pg_get_userbyid(p.proowner), p.proacl)
  FROM pg_proc p JOIN co ON p.pronamespace = co.oid
UNION ALL
SELECT 'relation', c.oid::regclass::text,
       concat_ws(' | ', c.relkind, c.relpersistence, c.reloptions, pg_get_userbyid(c.relowner), c.relacl,
                 CASE c.relkind WHEN 'v' THEN pg_get_viewdef(c.oid) WHEN 'i' THEN pg_get_indexdef(c.oid) END)
  FROM pg_class c JOIN co ON c.relnamespace = co.oid
UNION ALL
SELECT 'column', a.attrelid::regclass || '.' || a.attname,
       concat_ws(' | ', row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
                 format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, a.attgenerated,
                 a.attcollation::regcollation, pg_get_expr(ad.adbin, ad.adrelid), a.attacl)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN co ON c.relnamespace = co.oid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
  WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', conrelid::regclass || '.' || conname, pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = (SELECT oid FROM co)
UNION ALL
SELECT 'trigger', tgrelid::regclass || '.' || tgname, pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN co ON c.relnamespace = co.oid
  WHERE NOT t.tgisinternal
UNION ALL
SELECT 'type', format_type(t.oid, NULL), t.typtype::text FROM pg_type t JOIN co ON t.typnamespace = co.oid
UNION ALL
SELECT 'initial privileges', pg_describe_object(i.classoid, i.objoid, i.objsubid), concat_ws(' ', i.privtype, i.initprivs)
  FROM pg_init_privs i JOIN members m ON (m.classid, m.objid) = (i.classoid, i.objoid)
UNION ALL
SELECT 'comment', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
  FROM pg_description d JOIN members m ON (m.classid, m.objid) = (d.classoid, d.objoid)
ORDER BY 1, 2, 3
"""


def catalog(server, db):
    return [" :: ".join(map(str, row)) for row in server.sql(CATALOG, dbname=db)]


def assert_same(upgraded, fresh):
    assert upgraded == fresh, "ALTER EXTENSION pg_co UPDATE does not give what CREATE EXTENSION gives:\n" + \
        "\n".join(difflib.unified_diff("\n".join(fresh).splitlines(), "\n".join(upgraded).splitlines(),
                                       "fresh", "upgraded", lineterm=""))


@pytest.fixture(scope="module")
def pg(pg_major):
    with PgServer() as s:
        s.sql("CREATE DATABASE fresh")
        s.sql("CREATE EXTENSION pg_co", dbname="fresh")
        yield s


@pytest.fixture
def at_0_1_0(pg, request):
    """A new database whose extension was created at 0.1.0, holding one decision."""
    db = request.node.name.split("[")[0][len("test_"):][:40]
    pg.sql(f"CREATE DATABASE {db}")
    pg.sql("CREATE EXTENSION pg_co VERSION '0.1.0'", dbname=db)
    assert pg.sql("SELECT extversion FROM pg_extension WHERE extname = 'pg_co'", dbname=db) == [("0.1.0",)]
    pg.sql("INSERT INTO co.decisions (gtid, outcome) VALUES ('made-at-0.1.0', 'c')", dbname=db)
    yield db
    pg.sql(f"DROP DATABASE {db}")


def test_update_from_0_1_0_gives_the_fresh_catalog_and_keeps_rows(pg, at_0_1_0):
    (default,) = pg.sql("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_co'")[0]
    assert default != "0.1.0"
    pg.sql("ALTER EXTENSION pg_co UPDATE", dbname=at_0_1_0)
    assert pg.sql("SELECT extversion FROM pg_extension WHERE extname = 'pg_co'", dbname=at_0_1_0) == [(default,)]
    fresh = catalog(pg, "fresh")
    # a description that saw nothing would compare equal too
    assert sum(line.startswith("member") for line in fresh) >= 10, fresh
    assert_same(catalog(pg, at_0_1_0), fresh)
    assert pg.sql("SELECT gtid, outcome FROM co.decisions", dbname=at_0_1_0) == [("made-at-0.1.0", "c")]
    with pg.connect(at_0_1_0) as c:
        c.execute("SET default_transaction_isolation = 'read committed'")
        assert c.execute("SELECT co.resolve('made-at-0.1.0')").fetchall() == [("commit",)]


def test_comparison_sees_an_object_no_upgrade_script_made(pg, at_0_1_0):
    """What a SQL change without an upgrade script looks like to the comparison above."""
    pg.sql("ALTER EXTENSION pg_co UPDATE", dbname=at_0_1_0)
    with pg.connect(at_0_1_0) as c:
        c.execute("CREATE FUNCTION co.unversioned() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        c.execute("ALTER EXTENSION pg_co ADD FUNCTION co.unversioned()")
    with pytest.raises(AssertionError, match=r"\+member :: function co.unversioned\(\)"):
        assert_same(catalog(pg, at_0_1_0), catalog(pg, "fresh"))
