"""Differential run of PostgreSQL's isolation specs on one server: the same specs, the same
server binaries, once without pg_co and once with it (scripts/test-pg-upstream.sh runs
both; used for the majors whose own source tree is not here, 16 and 17, with the specs of
18's source).

Per permutation of every spec (isolationtester's "starting permutation:" blocks):
- a VIOLATION is a permutation that failed without pg_co (some step reported an ERROR) and
  succeeded with pg_co loaded (no ERROR at all): pg_co must never let more through;
  likewise a `check` step whose rows under pg_co are not a subset of its rows without
  pg_co (the criterion of compare_outcomes.py);
- REFUSED lists the permutations where pg_co refused something (an ERROR naming pg_co);
- any other difference (timing, a different transaction aborted) is counted, not judged.
Skipped specs (not run at all) are named with their reason by the caller.

usage: differential.py [--refused-list FILE] MAJOR BASE_RESULTS_DIR CO_RESULTS_DIR SPEC...
Prints the refusals per spec and rule (each refused permutation goes to FILE) and a count
line; exits 1 on any violation or a spec missing output.
"""
import os
import re
import sys

# Run as a script: its own directory is on the import path.
from compare_outcomes import check_rows


def permutations(text: str) -> dict:
    """{permutation name: its output block}, in the order of the file."""
    out = {}
    for block in re.split(r"^starting permutation: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = body
    return out


def errors(body: str) -> list:
    return re.findall(r"^ERROR:\s+(.*)$", body, flags=re.M)


def main(major, base_dir, co_dir, *specs, refused_list=None):
    n_perm = identical = differ = violations = missing = 0
    refused = []  # (spec, permutation, first pg_co error)
    for spec in specs:
        paths = [os.path.join(d, spec + ".out") for d in (base_dir, co_dir)]
        if not all(os.path.exists(p) for p in paths):
            print(f"  {spec}: no output in {' or '.join(p for p in paths if not os.path.exists(p))}")
            missing += 1
            continue
        base, co = (permutations(open(p, errors="replace").read()) for p in paths)
        if base.keys() != co.keys():
            print(f"  {spec}: the permutation lists differ between the runs "
                  f"({sorted(base.keys() ^ co.keys())[:3]}); judged on the common ones")
        for name in base.keys() & co.keys():
            n_perm += 1
            b, c = base[name], co[name]
            if b == c:
                identical += 1
                continue
            differ += 1
            berr, cerr = errors(b), errors(c)
            ours = [e for e in cerr if "pg_co" in e]
            if ours:
                refused.append((spec, name, ours[0]))
            if berr and not cerr:
                violations += 1
                print(f"VIOLATION {spec}: '{name}' failed without pg_co ({berr[0]}) "
                      f"and succeeded with it")
            brows, crows = check_rows(b, "check"), check_rows(c, "check")
            if brows is not None and crows is not None and not crows <= brows:
                violations += 1
                print(f"VIOLATION {spec}: '{name}': rows only with pg_co: {sorted(crows - brows)}")
    if refused_list:
        with open(refused_list, "w") as f:
            for spec, name, err in refused:
                f.write(f"{spec}\t{name}\t{err}\n")
    by_spec = {}
    for spec, _, err in refused:
        rule = re.search(r"rule ([ABC])\b", err)
        key = f"rule {rule.group(1)}" if rule else err
        by_spec.setdefault(spec, {}).setdefault(key, 0)
        by_spec[spec][key] += 1
    for spec, kinds in by_spec.items():
        print(f"  pg_co refused in {spec}: {sum(kinds.values())} permutations ("
              + ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) + ")"
              + (f"; each one in {refused_list}" if refused_list else ""))
    print(f"PostgreSQL {major} differential: {len(specs) - missing} specs, {n_perm} permutations: "
          f"{identical} identical, {differ} differ, {len(refused)} refused by pg_co, "
          f"{violations} violations")
    return 1 if violations or missing else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--refused-list"]:
        out, args = args[1], args[2:]
    if len(args) < 3:
        sys.exit(__doc__)
    sys.exit(main(*args, refused_list=out))
