#!/usr/bin/env python3
"""Lists the import cycles between the files of each crate.

A file is a module (`lib.rs` the crate root, `a.rs` or `a/mod.rs` the module
`a`, `a/b.rs` the module `a::b`). A file depends on another when it names a
path into it: `crate::a::…`, `super::…`, `self::…` (in a `use` or anywhere in
the code), or a name the crate root (or a `mod.rs`) re-exports from it with
`pub use`, which is followed to the module that defines the name. A child
module named in its parent's `mod` line is not a dependency (the tree is not
an import); a parent that names its child's items (`pub use child::X`) is. Comments and string literals are ignored; `#[cfg(test)]` code is
not (a test module that production code calls is a cycle like any other).

Usage: scripts/module-cycles.py [--root-as-facade] [CRATE_DIR...]
(default: every crates/*). With --root-as-facade, edges to and from the
crate root (`lib.rs`, which declares and re-exports the modules) are left
out: only cycles among the other files are reported.
Prints each crate's edges count and its cycles (strongly connected groups of
files), and exits 1 if any crate has one.
"""

import os
import re
import sys


def strip(src):
    """Source without comments, string and char literals (kept as blanks)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x..'", src[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x..'", src[i:i + 12])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(src_dir, path):
    rel = os.path.relpath(path, src_dir)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


def use_trees(text):
    """Expands every `use` item into full paths (lists of segments)."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths.extend(expand(m.group(1).replace("\n", " ")))
    return paths


def expand(tree):
    tree = tree.strip()
    if not tree:
        return []
    depth, brace = 0, -1
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                brace = i
            depth += 1
        elif c == "}":
            depth -= 1
    if brace < 0:
        path = re.sub(r"\s+as\s+\w+$", "", tree).strip()
        return [[s.strip() for s in path.split("::") if s.strip()]]
    prefix = [s.strip() for s in tree[:brace].split("::") if s.strip()]
    inner = tree[brace + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for c in inner:
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += c == "{"
        depth -= c == "}"
        cur += c
    parts.append(cur)
    out = []
    for p in parts:
        for sub in expand(p):
            if sub == ["self"]:
                out.append(prefix)
            else:
                out.append(prefix + sub)
    return out


def crate_edges(crate_dir):
    src_dir = os.path.join(crate_dir, "src")
    files = {}
    for root, _, names in os.walk(src_dir):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    files[module_of(src_dir, path)] = strip(f.read())
    mods = set(files)
    # Names each file re-exports (`pub use a::b::Name;`): (module, name) -> path.
    reexports = {}
    for mod, text in files.items():
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
            for path in expand(m.group(1).replace("\n", " ")):
                # None: a name another crate defines.
                reexports[(mod, path[-1])] = absolute(mod, path, mods)

    def target(mod, segs, seen=0):
        """The file `segs` (absolute) lives in, following re-exports."""
        best = ()
        for k in range(len(segs), 0, -1):
            if tuple(segs[:k]) in mods:
                best = tuple(segs[:k])
                break
        rest = segs[len(best):]
        if rest and (best, rest[0]) in reexports and seen < 8:
            again = reexports[(best, rest[0])]
            return None if again is None else target(mod, again, seen + 1)
        return best

    edges = {m: set() for m in mods}
    for mod, text in files.items():
        inline = inline_mods(text)

        def scope(pos):
            """The module a path at `pos` is written in: the file's module
            and the inline `mod name { … }` blocks around it."""
            return tuple(list(mod) + [n for (a, b, n) in inline if a < pos < b])

        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            for path in expand(m.group(1).replace("\n", " ")):
                full = absolute(scope(m.start()), path, mods)
                if full is not None:
                    paths.append(full)
        # Paths written inline in the code (`crate::a::f()`, `super::X`).
        body = re.sub(r"\buse\s+[^;]+;", lambda m: " " * len(m.group(0)), text)
        for m in re.finditer(r"\b((?:crate|super|self)(?:\s*::\s*\w+)+)", body):
            path = [s.strip() for s in m.group(1).split("::")]
            full = absolute(scope(m.start()), path, mods)
            if full is not None:
                paths.append(full)
        for full in paths:
            t = target(mod, full)
            if t is not None and t != mod:
                edges[mod].add(t)
    return edges


def inline_mods(text):
    """(start, end, name) of every inline `mod name { … }` block."""
    out = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += text[i] == "{"
            depth -= text[i] == "}"
            if depth == 0:
                break
            i += 1
        out.append((m.start(), i, m.group(1)))
    return out


def absolute(mod, path, mods):
    """`path` as seen from module `mod`, made absolute; None if external."""
    if not path:
        return None
    head = path[0]
    if head == "crate":
        return path[1:]
    if head in ("super", "self"):
        base = list(mod)
        i = 0
        while i < len(path) and path[i] in ("super", "self"):
            if path[i] == "super":
                if not base:
                    return None
                base.pop()
            i += 1
        return base + path[i:]
    # A path relative to this module: a child module's name.
    if tuple(list(mod) + [head]) in mods:
        return list(mod) + path
    return None


def cycles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
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

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def name(mod):
    return "::".join(mod) or "(root)"


def main():
    args = sys.argv[1:]
    facade = "--root-as-facade" in args
    args = [a for a in args if a != "--root-as-facade"]
    dirs = args or sorted(
        os.path.join("crates", d) for d in os.listdir("crates") if os.path.isdir(os.path.join("crates", d, "src"))
    )
    bad = False
    for d in dirs:
        edges = crate_edges(d)
        if facade:
            edges = {m: {t for t in ts if t} for m, ts in edges.items() if m}
        found = cycles(edges)
        n = sum(len(v) for v in edges.values())
        print(f"{os.path.basename(d.rstrip('/'))}: {len(edges)} files, {n} edges, {len(found)} cycles")
        for comp in found:
            bad = True
            inside = set(comp)
            print("  cycle: " + ", ".join(name(m) for m in comp))
            for m in comp:
                for t in sorted(edges[m] & inside):
                    print(f"    {name(m)} -> {name(t)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
