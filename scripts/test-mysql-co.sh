#!/usr/bin/env bash
# mysql_co's tests: the unit test of its rules (g++, no server), then mysql-test against the
# installed MariaDB with the plugin loaded:
#   1. our suite (mysql_co_plugin/mysql-test/mysql_co)
#   2. MariaDB's own XA tests (main.xa*, innodb.*xa*) with mysql_co loaded and disabled
#      (mysql_co_enabled=OFF): every test must pass, i.e. loading the plugin changes nothing
#   3. the same tests with mysql_co enabled: the ones that reach XA PREPARE at
#      REPEATABLE READ must be refused by mysql_co (and only those), the others pass.
# MYSQL_CO_MTR_RECORD=1 re-records our suite's result files (then review the diff).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
require_root
MTR_DIR=/usr/share/mysql/mysql-test
PLUGIN_DIR="${COTX_MARIADB_PLUGIN_DIR:-/usr/lib/mysql/plugin}"
[ -f "$PLUGIN_DIR/mysql_co.so" ] || die "mysql_co.so is not installed: run scripts/build-mysql-co.sh"
[ -f "$MTR_DIR/mariadb-test-run.pl" ] || die "mariadb-test (mysql-test-run) is not installed: run scripts/bootstrap.sh"

work=$(mktemp -d /tmp/cotx-mtr.XXXXXX)
# mysql-test-run finds installed plugin suites in mysql-test/plugin/<plugin>/<suite> (and
# takes a suite's name from that path): link a copy of ours there for the run, as a
# plugin package's test files would be installed. One run at a time (flock).
SUITE_LINK="$MTR_DIR/plugin/mysql_co/mysql_co"
exec 9>"$COTX_CACHE/mysql-co-mtr.lock"
flock -w 1200 9 || die "another mysql_co mysql-test run holds $COTX_CACHE/mysql-co-mtr.lock"
cleanup() { rm -f "$SUITE_LINK"; rmdir "$MTR_DIR/plugin/mysql_co" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cp -r "$COTX_ROOT/mysql_co_plugin/mysql-test/mysql_co" "$work/suite"
mkdir -p "$MTR_DIR/plugin/mysql_co"
ln -sfn "$work/suite" "$SUITE_LINK"
SUITE="$work/suite"

MARIADB_XA_TESTS=(main.xa main.xa_binlog main.xa_prepared_binlog_off main.xa_sync
  innodb.innodb-xa innodb.xa_recovery innodb.xa_prepare_reset_supremum_lock
  innodb.xa_prepare_unlock_unmodified innodb.xa_unlock_unmodified innodb.xa_debug
  innodb.xa_recovery_debug innodb.xap_release_locks_on_dict_stats_table
  innodb.alter_partitioned_xa)
# Run at REPEATABLE READ and reach XA PREPARE (or ONE PHASE): refused on purpose.
EXPECT_REFUSED=(innodb.innodb-xa innodb.xa_prepare_reset_supremum_lock innodb.xa_recovery
  main.xa main.xa_binlog main.xa_prepared_binlog_off)

mtr() {  # vardir-name, args...
  local v=$1; shift
  (cd "$MTR_DIR" && perl mariadb-test-run.pl --vardir="$work/var-$v" --parallel=2 --force \
     --max-test-fail=0 --mysqld=--plugin-dir="$PLUGIN_DIR" "$@") > "$work/$v.out" 2>&1
}
results() {  # mtr output -> "name status" lines
  grep -oE '^[a-z_0-9]+\.[-a-z_0-9]+ +(w[0-9]+ +)?\[ (pass|fail|skipped|disabled) \]' "$1" \
    | sed -E 's/ +(w[0-9]+ +)?\[ / /; s/ \]$//' | sort -u
}
fail=0

# The rules without a server: mysql_co_rules.h is plain C++ (no server headers), so g++ alone
# builds its unit test. Every verdict and the exact refusal texts are checked there.
# mysql_co_server_check.h (is the running server the build it was made for) likewise.
for t in mysql_co_rules_test mysql_co_server_check_test; do
  log "mysql_co unit test (mysql_co_plugin/$t.cc)"
  if g++ -std=c++17 -Wall -Wextra -Werror -o "$work/$t" \
       "$COTX_ROOT/mysql_co_plugin/$t.cc" && "$work/$t" >&2; then
    :
  else
    log "mysql_co unit test $t FAILED"; fail=1
  fi
done

log "mysql-test suite mysql_co"
rec=(); [ "${MYSQL_CO_MTR_RECORD:-0}" = 1 ] && rec=(--record $(cd "$SUITE/t" && ls *.test | sed 's/^/mysql_co./; s/\.test$//'))
n_tests=$(ls "$SUITE"/t/*.test | wc -l)
# "All 0 tests were successful" is what mysql-test-run says when suite.pm skipped the suite.
if mtr suite --suite=mysql_co "${rec[@]}" && grep -qE "^Completed: All $n_tests tests were successful" "$work/suite.out"; then
  log "mysql_co suite: $(grep -E '^Completed' "$work/suite.out")"
else
  tail -60 "$work/suite.out" >&2; log "mysql_co suite FAILED"; fail=1
fi
if [ ${#rec[@]} -gt 0 ]; then
  cp "$SUITE"/r/*.result "$COTX_ROOT/mysql_co_plugin/mysql-test/mysql_co/r/"
  log "recorded results copied back into mysql_co_plugin/mysql-test/mysql_co/r"
fi

log "MariaDB's XA tests, mysql_co loaded but disabled (mysql_co_enabled=OFF)"
mtr off --mysqld=--plugin-load-add=mysql_co.so --mysqld=--mysql-co-enabled=OFF "${MARIADB_XA_TESTS[@]}"
results "$work/off.out" | sed 's/^/  /' >&2
if results "$work/off.out" | grep -q ' fail$' || ! grep -q '^Completed: All' "$work/off.out"; then
  tail -40 "$work/off.out" >&2; log "MariaDB XA tests with mysql_co disabled FAILED"; fail=1
fi

log "MariaDB's XA tests, mysql_co enabled"
mtr on --mysqld=--plugin-load-add=mysql_co.so "${MARIADB_XA_TESTS[@]}"
results "$work/on.out" | sed 's/^/  /' >&2
got_failed=$(results "$work/on.out" | awk '$2=="fail" {print $1}' | sort)
want_failed=$(printf '%s\n' "${EXPECT_REFUSED[@]}" | sort)
if [ "$got_failed" != "$want_failed" ]; then
  log "unexpected set of failing tests with mysql_co enabled:"; diff <(echo "$want_failed") <(echo "$got_failed") >&2
  fail=1
fi
# Every failure must be mysql_co's refusal, not something else.
for t in $got_failed; do
  block=$(awk -v t="$t" '$1==t && /\[ fail \]/ {on=1} on && /^ - saving/ {exit} on' "$work/on.out")
  if ! grep -qE "ER_XA_RBROLLBACK \(1402\): mysql_co: XA (PREPARE|COMMIT \.\.\. ONE PHASE) refused: this XA branch ran at REPEATABLE-READ" <<<"$block"; then
    log "$t failed for another reason than mysql_co's refusal:"; echo "$block" | head -30 >&2; fail=1
  else
    echo "  $t: $(grep -m1 -oE "(At line [0-9]+: query '[^']*'[^']*'[^']*')" <<<"$block") refused by mysql_co (REPEATABLE-READ)" >&2
  fi
done
[ $fail = 0 ] && log "mysql_co mysql-test: all as expected"
exit $fail
