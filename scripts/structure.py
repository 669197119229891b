#!/usr/bin/env python3
"""The module structure of a Rust crate, checked: which file imports which, circles,
imports that run back up, and files too long to read at once.

  /var/cache/cotx/venv/bin/python scripts/structure.py coordinator-daemon/src [--max-lines 500]
      [--max-fn-lines 120] [--max-bundle-params N --bundle Parts] [--graph]

A node is a source file (a module). An edge A -> B is written when A names an item of B:
`use crate::b::...`, `crate::b::x` in code, `super::...`, `use self::...` in a mod.rs.
Code after `#[cfg(test)]` is not looked at, nor a file that starts with `#![cfg(test)]` (a
test module in a file of its own): a test module may import whatever it tests.
Reported, each a reason to exit 1:
- a circle: modules that import each other, directly or through others;
- a folder circle: folders (a module with children, taken whole: its files and
  subfolders) that import each other, directly or through others, even when no two files
  do (ha/lease.rs -> coordinator/parts.rs while coordinator/recovery.rs -> ha/lease.rs):
  a folder is a layer, and layers import one way;
- an import that runs back up: a file importing an item its own ancestor (a mod.rs or
  lib.rs above it) defines. A folder's mod.rs declares and re-exports its children; what
  they share lives in a sibling file, so the folder reads top-down;
- a file over --max-lines lines (with --max-lines);
- a function over --max-fn-lines lines, from its `fn` line to its closing brace (with
  --max-fn-lines): a long function is split into named steps;
- more functions than --max-bundle-params taking the whole bundle of parts
  (`--bundle Parts`: a parameter `&Parts` or `&Arc<Parts>`, test code not counted): an
  operation borrows the parts it uses (a store handle, the registry, a small named
  view), as mini-redis's `Get::apply(db, dst)` does; the ceiling only comes down.
Why a script of our own: cargo-modules and similar need nightly or a full rust-analyzer
run (minutes on two cores); a crate's `use` paths are regular enough to read directly.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from checker.graph import sccs   # the history checker, installed into the project's venv

USE = re.compile(r"^([ \t]*)(?:pub(?:\([a-z]+\))?\s+)?use\s+((?:crate|super|self)\b[^;]*);", re.S | re.M)
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def module_of(root: Path, f: Path) -> tuple[str, ...]:
    rel = f.relative_to(root).with_suffix("")
    parts = rel.parts
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs kept as paths)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)   # `x as y` imports x
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, inner = tree[:i], tree[i + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out += [prefix + q for q in expand(p)]
    return out


def resolve(mods: set[tuple[str, ...]], here: tuple[str, ...], inner: bool, path: str) -> tuple[str, ...] | None:
    """The deepest module file a path names, from the module `here` (`inner`: from an
    inline `mod x { ... }` inside it, where the first `super` is the file's module)."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base: tuple[str, ...] = ()
        segs = segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if inner:
                    inner = False
                else:
                    base = base[:-1]
            segs = segs[1:]
    else:
        return None
    best = base
    for s in segs:
        if base + (s,) in mods:
            base = base + (s,)
            best = base
        else:
            break
    return best


def edges(root: Path) -> tuple[dict[tuple[str, ...], set[tuple[str, ...]]], dict[tuple[str, ...], Path]]:
    files = {module_of(root, f): f for f in sorted(root.rglob("*.rs"))}
    mods = set(files)
    out: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in mods}
    for m, f in files.items():
        text = f.read_text()
        # A test module in a file of its own starts with `#![cfg(test)]`: not looked at.
        text = outside_tests(text)
        text = re.sub(r"//[^\n]*", "", text)   # comments name paths without importing them
        paths = []
        for indent, u in USE.findall(text):
            # An indented `use` sits in an inline module or a function: its `super` is
            # taken as the file's module (the usual case: `mod ffi { use super::X; }`).
            paths += [(bool(indent), p) for p in expand(u)]
        paths += [(False, a + b) for a, b in PATH.findall(re.sub(USE, "", text))]
        for inner, p in paths:
            t = resolve(mods, m, inner, p)
            if t is not None and t != m:
                out[m].add(t)
    return out, files


FN = re.compile(r"^[ \t]*(?:pub(?:\([a-z]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def functions(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, line count) of every function with a body, found by its `fn`
    line and the brace that closes it (strings, characters and line comments blanked)."""
    lines = [re.sub(r"'(?:\\.|[^'\\])'", "' '", re.sub(r'"(?:\\.|[^"\\])*"', '""', line)).split("//")[0]
             for line in text.splitlines()]
    out = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            if not started and ";" in lines[j] and "{" not in lines[j]:
                break   # a declaration without a body (trait method)
            for ch in lines[j]:
                depth += ch == "{"
                depth -= ch == "}"
                started = started or ch == "{"
            if started and depth <= 0:
                out.append((m.group(1), i + 1, j - i + 1))
                break
    return out


def outside_tests(text: str) -> str:
    """The text before its test code (`#[cfg(test)]`, or a test file's `#![cfg(test)]`)."""
    cuts = [i for i in (text.find("#[cfg(test)]"), text.find("#![cfg(test)]")) if i >= 0]
    return text[:min(cuts)] if cuts else text


def bundle_takers(text: str, bundle: str = "Parts") -> list[tuple[str, int]]:
    """(name, line) of every function outside the tests with a parameter of the whole
    `bundle`: `&Bundle`, `&'a Bundle`, `&Arc<Bundle>`. Not counted: a return type, and a
    `from` (a `From` conversion narrows the bundle into a view of the parts used)."""
    taken = re.compile(r":\s*&(?:'\w+\s+)?(?:mut\s+)?(?:Arc<\s*)?" + re.escape(bundle) + r"\b")
    lines = [line.split("//")[0] for line in outside_tests(text).splitlines()]
    out = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or m.group(1) == "from":
            continue
        # The parameter list: from the `(` after the name to the parenthesis closing it.
        sig = "\n".join(lines[i:i + 40])
        start = sig.find("(", m.end(1))
        depth, end = 0, len(sig)
        for j in range(start, len(sig)):
            depth += sig[j] == "("
            depth -= sig[j] == ")"
            if depth == 0:
                end = j
                break
        if start >= 0 and taken.search(sig[start:end]):
            out.append((m.group(1), i + 1))
    return out


def circles(g: dict) -> list[list]:
    """Strongly connected components with more than one module: the history checker's
    (iterative Tarjan), one implementation for both graphs."""
    return sccs(sorted(g), g)


def folder_circles(g: dict) -> list[list]:
    """Circles between folders: at each depth d, every module is taken as its ancestor
    of depth d (a folder stands for everything in it), edges inside one folder and
    between a folder and its own descendants are dropped, and the circles found that
    hold a folder (not only single files, already reported as circles) are returned."""
    found: list[list] = []
    deepest = max((len(m) for m in g), default=0)
    for d in range(1, deepest):
        cut = {m: m[:d] for m in g}
        folders = {m[:d] for m in g if len(m) > d}
        h: dict[tuple[str, ...], set[tuple[str, ...]]] = {c: set() for c in cut.values()}
        for m, ts in g.items():
            for t in ts:
                a, b = cut[m], cut[t]
                if a != b and a[:len(b)] != b and b[:len(a)] != a:
                    h[a].add(b)
        for comp in sccs(sorted(h), h):
            if any(c in folders for c in comp) and comp not in found:
                found.append(comp)
    return found


def name(m: tuple[str, ...]) -> str:
    return "::".join(m) or "crate"


def check(root: Path, max_lines: int | None = None, max_fn_lines: int | None = None,
          max_bundle_params: int | None = None, bundle: str = "Parts") -> list[str]:
    g, files = edges(root)
    problems = []
    for comp in circles(g):
        problems.append("circle: " + " <-> ".join(name(m) for m in comp))
    for comp in folder_circles(g):
        problems.append("folder circle: " + " <-> ".join(name(m) + ("/" if any(len(x) > len(m) and x[:len(m)] == m for x in g) else "") for m in comp))
    for m in sorted(g):
        for t in sorted(g[m]):
            if len(t) < len(m) and m[:len(t)] == t:
                problems.append(f"runs back up: {name(m)} ({files[m].relative_to(root)}) imports its ancestor {name(t)}")
    if max_lines:
        for m, f in sorted(files.items()):
            n = len(f.read_text().splitlines())
            if n > max_lines:
                problems.append(f"too long: {f.relative_to(root)} has {n} lines (at most {max_lines})")
    if max_fn_lines:
        for m, f in sorted(files.items()):
            for fn, line, n in functions(f.read_text()):
                if n > max_fn_lines:
                    problems.append(f"function too long: {fn} ({f.relative_to(root)}:{line}) has {n} lines "
                                    f"(at most {max_fn_lines})")
    if max_bundle_params is not None:
        takers = [f"{fn} ({f.relative_to(root)}:{line})"
                  for m, f in sorted(files.items()) for fn, line in bundle_takers(f.read_text(), bundle)]
        if len(takers) > max_bundle_params:
            problems.append(f"{len(takers)} functions take the whole {bundle} (at most {max_bundle_params}): "
                            "pass the parts they use instead: " + ", ".join(takers))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="a crate's src folder")
    ap.add_argument("--max-lines", type=int)
    ap.add_argument("--max-fn-lines", type=int)
    ap.add_argument("--max-bundle-params", type=int, help="at most this many functions take the whole --bundle")
    ap.add_argument("--bundle", default="Parts", help="the type of the bundle of parts (default: Parts)")
    ap.add_argument("--graph", action="store_true", help="print every module's imports")
    a = ap.parse_args(argv)
    bad = 0
    for root in a.roots:
        if a.graph:
            g, _ = edges(root)
            for m in sorted(g):
                print(f"{root}: {name(m)} -> {', '.join(name(t) for t in sorted(g[m])) or '-'}")
        if a.max_bundle_params is None and a.bundle != "Parts":
            ap.error("--bundle is read only with --max-bundle-params")
        for p in check(root, a.max_lines, a.max_fn_lines, a.max_bundle_params, a.bundle):
            print(f"{root}: {p}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
