#!/usr/bin/env python3
"""Import cycles between the files of each crate (ARCHITECTURE.md, code map).

A file depends on another when its non-test code names an item of it:
`use crate::a::X`, `crate::a::f(...)`, `super::X` (the parent module), or
`crate::X` where the crate root re-exports `X` from `a` (resolved to `a`).
The crate root's `mod` and `pub use` lines are its table of contents, not
dependencies; a root that defines items of its own (a binary's `main.rs`)
is a node like any other. Test code (`#[cfg(test)] mod ... { }` and
`tests.rs`/`tests/` files) is left out: a test may use anything.

Usage: scripts/module-cycles.py [CRATE ...]   (default: every crate)
Prints each crate's edges with -v; exits 1 when a crate has a cycle.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "crates"


def strip(text):
    """Source without comments, string literals and test modules."""
    text = blank(text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def blank(text):
    """`text` with comments removed and string and char literals emptied,
    scanned left to right (so `"/*"` or `// a/*b` start nothing)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (
            c == "r"
            and re.match(r'r#*"', text[i:])
            and not (i and (text[i - 1].isalnum() or text[i - 1] == "_"))
        ):
            hashes = re.match(r"r(#*)", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:]):
            m = re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_files(src):
    """Module path (tuple) -> file, for every file under src."""
    mods = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("").parts
        if rel[-1] in ("lib", "main") and len(rel) == 1:
            path = ()
        elif rel[-1] == "mod":
            path = rel[:-1]
        else:
            path = rel
        if "tests" in path or (path and path[-1].endswith("_tests")):
            continue
        mods[path] = f
    # Modules declared for tests only (`#[cfg(test)] mod sim;`).
    test_only = set()
    for path, f in mods.items():
        for m in re.finditer(
            r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", f.read_text()
        ):
            test_only.add((*path, m.group(1)))
    return {p: f for p, f in mods.items() if not any(p[: len(t)] == t for t in test_only)}


def use_trees(text):
    """Each `use` statement's paths, braces expanded."""
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        yield from expand(m.group(1).replace("\n", " ").replace(" ", ""))


def expand(tree):
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        yield re.sub(r"as\w+$", "", tree)
        return
    prefix, inner = m.group(1), m.group(2)
    depth, part, parts = 0, "", []
    for c in inner:
        if c == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        part += c
    parts.append(part)
    for p in parts:
        if p:
            yield from expand(prefix + p)


def resolve(path, mods, reexports, here):
    """The module a `crate::`/`super::`/`self::` path lands in."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    # Longest module prefix.
    cur = base
    for s in segs:
        if (*cur, s) in mods:
            cur = (*cur, s)
        else:
            break
    rest = segs[len(cur) - len(base) :]
    if cur == () and rest and rest[0] in reexports:
        return reexports[rest[0]]
    return cur


def crate_edges(src):
    mods = module_files(src)
    texts = {p: strip(f.read_text()) for p, f in mods.items()}
    # Names the root re-exports from its modules: `pub use a::{X, Y}`.
    reexports = {}
    root_text = texts.get((), "")
    for tree in use_trees(root_text):
        segs = [s for s in tree.split("::") if s and s != "crate"]
        if len(segs) >= 2 and (segs[0],) in mods:
            name = segs[-1].split("as")[-1] if "as" in segs[-1] else segs[-1]
            target = (segs[0],)
            for k in range(2, len(segs)):
                if tuple(segs[:k]) in mods:
                    target = tuple(segs[:k])
            reexports[name] = target
    edges = {p: set() for p in mods}
    for here, text in texts.items():
        if here == ():
            # The root's mod/pub use lines are its table of contents.
            text = re.sub(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]+;", "", text)
            text = re.sub(r"\b(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", "", text)
        paths = list(use_trees(text))
        paths += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text)
        if here == ():
            paths += ["crate::" + m for m in re.findall(r"\b(\w+)::\w+", text) if (m,) in mods]
        for p in paths:
            target = resolve(p, mods, reexports, here)
            if target is None or target == here:
                continue
            # A module's own children are its parts, not its dependencies.
            if target[: len(here)] == here and here != ():
                continue
            edges[here].add(target)
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def name(path):
    return "::".join(path) or "(root)"


def main(argv):
    verbose = "-v" in argv
    wanted = [a for a in argv if a != "-v"]
    crates = sorted(p for p in ROOT.iterdir() if (p / "src").is_dir())
    if wanted:
        crates = [c for c in crates if c.name in wanted]
    bad = 0
    for crate in crates:
        edges = crate_edges(crate / "src")
        found = cycles(edges)
        if verbose:
            for m in sorted(edges):
                print(
                    f"  {crate.name}: {name(m)} -> {', '.join(sorted(map(name, edges[m]))) or '-'}"
                )
        if found:
            bad += 1
            for comp in found:
                print(f"{crate.name}: cycle among {', '.join(map(name, comp))}")
        else:
            print(f"{crate.name}: no cycles ({len(edges)} modules)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
