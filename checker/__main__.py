"""python -m checker HISTORY.jsonl [...]: check recorded histories, print the anomalies.
Exit status 0 when every history is serializable, 1 when any has an anomaly."""
import sys

from . import check, load_jsonl


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    bad = 0
    for path in argv:
        rep = check(load_jsonl(path))
        print(f"{path}: {rep.summary()}")
        bad += not rep.ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
