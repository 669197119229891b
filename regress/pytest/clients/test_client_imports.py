"""The shipped Python client imports nothing of the project's test side: no module of
`cotx` imports the harness (`cotest`), the checker or the benchmarks, and the two names
that moved to the harness (`cotx.daemon`, `cotx.testing`) say where they went instead of
importing it. No servers."""
import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "clients" / "python" / "cotx"
TEST_SIDE = ("cotest", "checker", "bench")


def imports_of_the_test_side(package: Path) -> list[str]:
    """`file:line module` of every import of TEST_SIDE in the package's modules."""
    found = []
    for f in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{f.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in TEST_SIDE]
    return found


def test_the_client_imports_nothing_of_the_test_side(tmp_path):
    assert imports_of_the_test_side(PACKAGE) == []
    # The check itself, on a planted module: cotx.testing as it was, a re-export of the harness.
    (tmp_path / "testing.py").write_text("from cotest.coord import make_daemon  # noqa: F401\n")
    assert imports_of_the_test_side(tmp_path) == ["testing.py:1 cotest.coord"]


@pytest.mark.parametrize("old,new", [("cotx.daemon", "cotest.daemon"), ("cotx.testing", "cotest.coord")])
def test_a_moved_name_says_where_it_went(old, new):
    with pytest.raises(ImportError, match=new.replace(".", r"\.")):
        importlib.import_module(old)
    importlib.import_module(new)
