"""Compare PostgreSQL's own isolation output with the output under pg_co, permutation by
permutation, for specs whose text legitimately differs (pg_co refuses at PREPARE where
PostgreSQL refuses later, or refuses one more transaction).

A difference is acceptable when pg_co is never more permissive: every row that the final
`check`-style query shows under pg_co also appears in PostgreSQL's expected output for the
same permutation (a non-serializable outcome would show rows PostgreSQL never lets
through). Prints a summary; exits 1 on any more-permissive permutation.

usage: compare_outcomes.py EXPECTED.out ACTUAL.out [CHECK_STEP]
"""
import re
import sys


def permutations(text: str):
    """{permutation: (rows of the last CHECK_STEP, number of ERROR lines)}"""
    out = {}
    for block in re.split(r"^starting permutation: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        errors = len(re.findall(r"^ERROR:", body, flags=re.M))
        out[name.strip()] = (body, errors)
    return out


def check_rows(body: str, step: str):
    m = list(re.finditer(rf"^step {re.escape(step)}: .*?\n(.*?)(?=^step |\Z)", body, flags=re.M | re.S))
    if not m:
        return None
    lines = m[-1].group(1).splitlines()
    # header, separator, rows..., "(N rows)"
    rows = []
    for line in lines[2:]:
        if line.startswith("("):
            break
        rows.append(line)
    return set(rows)


def main(expected_path, actual_path, step="check"):
    exp = permutations(open(expected_path).read())
    act = permutations(open(actual_path).read())
    if exp.keys() != act.keys():
        print(f"permutation lists differ: {sorted(exp.keys() ^ act.keys())[:5]}")
        return 1
    worse = more_aborts = same = 0
    for name, (abody, aerr) in act.items():
        ebody, eerr = exp[name]
        arows, erows = check_rows(abody, step), check_rows(ebody, step)
        if arows is not None and erows is not None and not arows <= erows:
            worse += 1
            print(f"MORE PERMISSIVE than PostgreSQL: {name}: {sorted(arows - erows)}")
        if aerr > eerr:
            more_aborts += 1
        if abody == ebody:
            same += 1
    print(f"{len(act)} permutations: {same} identical, {len(act) - same} differ, "
          f"{more_aborts} with more errors under pg_co, {worse} more permissive")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
