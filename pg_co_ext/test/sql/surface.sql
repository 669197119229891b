-- The SQL surface of pg_co: settings, views, functions, and the precondition errors.
SELECT co.preloaded();
SHOW pg_co.enabled;
SHOW pg_co.conflict_action;
SHOW pg_co.max_wait;
SHOW pg_co.require_serializable;
SHOW pg_co.rule_c;
SET pg_co.conflict_action = 'sometimes';
SET pg_co.conflict_action = wait;
RESET pg_co.conflict_action;
SELECT co.reset_stats();
SELECT checks_prepare, refused_rule_a, refused_rule_b, refused_rule_c, refused_summarized,
       refused_not_serializable, refused_read_only, waits, wait_time_ms, check_time_ms >= 0 AS timed
  FROM co.stats;
SELECT * FROM co.in_doubt;

CREATE TABLE t (id int PRIMARY KEY, v int);
INSERT INTO t VALUES (1, 1);

-- not serializable: refused, and the transaction is rolled back
BEGIN ISOLATION LEVEL REPEATABLE READ;
UPDATE t SET v = 2;
PREPARE TRANSACTION 'not_ser';
\echo :LAST_ERROR_SQLSTATE
SELECT v FROM t;
SELECT count(*) FROM pg_prepared_xacts;

-- read only: refused with a hint
BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY;
SELECT v FROM t;
PREPARE TRANSACTION 'ro';
\echo :LAST_ERROR_SQLSTATE

-- a serializable branch prepares, shows up in the in_doubt view, commits
BEGIN ISOLATION LEVEL SERIALIZABLE;
UPDATE t SET v = 3;
PREPARE TRANSACTION 'ok';
SELECT gid, peer_xid, rule FROM co.in_doubt;
COMMIT PREPARED 'ok';
SELECT v FROM t;
SELECT checks_prepare, refused_not_serializable, refused_read_only FROM co.stats;
DROP TABLE t;

-- co.decide plans its INSERT once per backend: a second decision in this session, a
-- refused repeat, its synchronous_commit for its own transaction only, and a decision
-- after the extension was dropped and created again under it
SET synchronous_commit = off;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT co.decide('s1');
SHOW synchronous_commit;
COMMIT;
SHOW synchronous_commit;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT co.decide('s1');
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT co.decide('s2');
COMMIT;
SELECT gtid, outcome FROM co.decisions ORDER BY gtid;
RESET synchronous_commit;
DROP EXTENSION pg_co;
CREATE EXTENSION pg_co;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT co.decide('s3');
COMMIT;
SELECT gtid, outcome FROM co.decisions ORDER BY gtid;
