"""Code blocks of the repository's Markdown, with the marker that says whether a test runs
them (test_docs_run.py; the convention: docs/testing.md, "Docs that are run").

A marker is an HTML comment, the last non-blank line before the block (invisible when
rendered, plain in the source):

    <!-- doc-run -->                      run it as written
    <!-- doc-run: with=coordinator -->    run it with what the doc's earlier steps set up
    <!-- doc-skip: REASON -->             not runnable here, and why (the reason is required)

A *shell block* is one a user would paste into a shell: a fenced block labelled sh, bash,
shell or console, an unlabelled fenced block, or an indented block. Every shell block
needs a marker. Anything else is labelled with its language (```text for output and
diagrams, ```toml, ```ini, ```python, ```sql): an unlabelled block counts as shell, so a
new command cannot slip in unmarked by leaving the label off. SQL blocks may carry a
doc-run marker (`sql=pg` / `sql=mariadb`) and are then run on a real server."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}
# A backtick fence's info string holds no backtick (CommonMark): "```` ```text ````" at
# the start of a line is inline code, not a fence.
FENCE = re.compile(r"^( {0,3})(?:(`{3,})\s*([\w+-]*)[^`]*|(~{3,})\s*([\w+-]*).*)$")
MARKER = re.compile(r"^<!--\s*doc-(run|skip)\b\s*(?::\s*(.*?))?\s*-->\s*$")
LIST_ITEM = re.compile(r"^\s{0,3}([-*+]|\d+[.)])\s")


def docs() -> list[Path]:
    """README.md, docs/*.md and the components' READMEs (not vendored or build trees)."""
    out = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out += sorted(p for p in ROOT.glob("*/README.md") if p != ROOT / "README.md")
    out += sorted(ROOT.glob("*/*/README.md"))
    return [p for p in out if not any(x.startswith(".") or x == "target" for x in p.relative_to(ROOT).parts)]


@dataclass
class Block:
    doc: Path
    line: int                   # 1-based line of the fence (or of the first indented line)
    lang: str                   # "" for unlabelled and indented blocks
    text: str
    kind: str | None = None     # "run", "skip" or None (no marker)
    args: dict = field(default_factory=dict)   # doc-run options (with=..., sql=...)
    reason: str = ""            # doc-skip's reason

    @property
    def shell(self) -> bool:
        return self.lang in SHELL_LANGS

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _marker(lines: list[str], start: int) -> tuple[str | None, dict, str]:
    """The marker on the last non-blank line before index `start`."""
    i = start - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    m = MARKER.match(lines[i].strip()) if i >= 0 else None
    if not m:
        return None, {}, ""
    kind, rest = m.group(1), (m.group(2) or "").strip()
    if kind == "skip":
        return kind, {}, rest
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in rest.split())
    return kind, args, ""


def blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    out: list[Block] = []
    i, in_list, prev_blank = 0, False, True
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            indent, fence, lang = m.group(1), m.group(2) or m.group(4), m.group(3) or m.group(5) or ""
            j = i + 1
            while j < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[j]):
                j += 1
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
            out.append(Block(doc, i + 1, lang.lower(), "\n".join(body) + "\n", *_marker(lines, i)))
            i, prev_blank = j + 1, False
            continue
        # An indented code block starts after a blank line, outside a list item (there
        # four spaces continue the item's text).
        if line.startswith(("    ", "\t")) and line.strip() and prev_blank and not in_list:
            j = i
            while j < len(lines) and (lines[j].startswith(("    ", "\t")) or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            body = [ln[4:] if ln.startswith("    ") else ln.lstrip("\t") for ln in lines[i:j]]
            out.append(Block(doc, i + 1, "", "\n".join(body) + "\n", *_marker(lines, i)))
            i, prev_blank = j, False
            continue
        if line.strip() and not line[0].isspace():
            if LIST_ITEM.match(line):
                in_list = True
            elif prev_blank:
                in_list = False     # a paragraph after a blank line ends the list (not a lazy continuation)
        prev_blank = not line.strip()
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for d in docs() for b in blocks(d)]
