#!/usr/bin/env python3
"""Import graph of django_sqltasks from the source, by ast (nothing is imported or executed).

Usage: python3 scripts/import_graph.py [PACKAGE_DIR] [--list] [--json OUT]

Each import statement is classified by where it is written:
  top       module level (including module-level try/except and if-blocks other than TYPE_CHECKING)
  typing    inside `if TYPE_CHECKING:` (never executed; import-linter counts it unless told not to)
  function  inside a def / async def / lambda / class body nested in a function (executed on call)
Reports the strongly connected components (Tarjan) of:
  A. top-level imports only
  B. top-level + TYPE_CHECKING
  C. top-level + function-level (the runtime graph once everything has been called)
and, with --list, every function-level import with file:line, enclosing function and target.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

ROOT_NAME = "django_sqltasks"
# One import statement: where it is, what it imports, and in what kind of scope.
Edge = dict[str, Any]
Graph = dict[str, set[str]]


def module_name(pkg_dir: Path, path: Path) -> str:
    rel = path.relative_to(pkg_dir).with_suffix("")
    parts = [ROOT_NAME, *rel.parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_package(pkg_dir: Path, path: Path) -> bool:
    return path.name == "__init__.py"


class Collector(ast.NodeVisitor):
    def __init__(self, mod: str, is_pkg: bool, modules: set[str]):
        self.mod = mod
        self.is_pkg = is_pkg
        self.modules = modules
        self.stack: list[str] = []  # enclosing defs
        self.type_checking = 0
        self.try_depth = 0
        self.edges: list[Edge] = []

    # ---- scope tracking
    def _visit_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = _visit_def
    visit_AsyncFunctionDef = _visit_def

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.stack.append("<lambda>")
        self.generic_visit(node)
        self.stack.pop()

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            self.type_checking += 1
            for n in node.body:
                self.visit(n)
            self.type_checking -= 1
            for n in node.orelse:
                self.visit(n)
        else:
            self.generic_visit(node)

    def visit_Try(self, node: ast.Try | ast.TryStar) -> None:
        self.try_depth += 1
        self.generic_visit(node)
        self.try_depth -= 1

    visit_TryStar = visit_Try

    # ---- resolution
    def _base(self, level: int, module: str | None) -> str | None:
        if level == 0:
            return module
        parts = self.mod.split(".")
        if not self.is_pkg:
            parts = parts[:-1]
        if level > 1:
            parts = parts[: len(parts) - (level - 1)]
        base = ".".join(parts)
        return f"{base}.{module}" if module else base

    def _resolve(self, name: str) -> str | None:
        """The deepest module of the package that `name` names (or None if outside)."""
        if not (name == ROOT_NAME or name.startswith(ROOT_NAME + ".")):
            return None
        parts = name.split(".")
        while parts:
            cand = ".".join(parts)
            if cand in self.modules:
                return cand
            parts.pop()
        return None

    def _kind(self) -> str:
        if self.stack:
            return "function"
        if self.type_checking:
            return "typing"
        return "top"

    def _add(self, node: ast.stmt, target: str, what: str) -> None:
        self.edges.append(
            {
                "src": self.mod,
                "dst": target,
                "kind": self._kind(),
                "line": node.lineno,
                "func": ".".join(self.stack),
                "what": what,
                "in_try": bool(self.try_depth),
            }
        )

    def _add_external(self, node: ast.stmt, what: str) -> None:
        if self.stack:
            self.edges.append(
                {
                    "src": self.mod,
                    "dst": None,
                    "kind": "function",
                    "line": node.lineno,
                    "func": ".".join(self.stack),
                    "what": what,
                    "in_try": bool(self.try_depth),
                }
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            t = self._resolve(alias.name)
            what = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
            if t:
                self._add(node, t, what)
            else:
                self._add_external(node, what)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._base(node.level, node.module)
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        what = f"from {'.' * node.level}{node.module or ''} import {names}"
        if base is None:
            return
        inside = self._resolve(base)
        if not inside:
            self._add_external(node, what)
            return
        done = set()
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            t = sub if sub in self.modules else inside
            if t not in done:
                done.add(t)
                self._add(node, t, what)


def collect(pkg_dir: Path) -> tuple[set[str], list[Edge]]:
    files = sorted(p for p in pkg_dir.rglob("*.py") if "migrations" not in p.parts)
    modules = {module_name(pkg_dir, p) for p in files}
    edges: list[Edge] = []
    for p in files:
        mod = module_name(pkg_dir, p)
        tree = ast.parse(p.read_text(), str(p))
        c = Collector(mod, is_package(pkg_dir, p), modules)
        c.visit(tree)
        for e in c.edges:
            e["file"] = str(p.relative_to(pkg_dir.parent))
        edges.extend(c.edges)
    return modules, edges


def tarjan(nodes: Iterable[str], adj: Graph) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    st: list[str] = []
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        st.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return [c for c in out if len(c) > 1 or c[0] in adj.get(c[0], ())]


def graph(edges: Iterable[Edge], kinds: Collection[str]) -> Graph:
    adj: Graph = defaultdict(set)
    for e in edges:
        if e["dst"] and e["kind"] in kinds and e["dst"] != e["src"]:
            adj[e["src"]].add(e["dst"])
    return adj


def closure(adj: Graph, start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = v.split(".")
        for i in range(1, len(parts)):
            todo.append(".".join(parts[:i]))
        todo.extend(adj.get(v, ()))
    return seen


def short(m: str) -> str:
    return m[len(ROOT_NAME) + 1 :] if m.startswith(ROOT_NAME + ".") else m


def main() -> None:
    args = sys.argv[1:]
    pkg = (
        Path(args[0])
        if args and not args[0].startswith("--")
        else Path(__file__).resolve().parent.parent / ROOT_NAME
    )
    modules, edges = collect(pkg)
    print(f"package: {pkg}  modules (excluding migrations): {len(modules)}")
    fn = [e for e in edges if e["kind"] == "function"]
    fn_in = [e for e in fn if e["dst"]]
    print(
        f"import statements inside functions: {len({(e['file'], e['line']) for e in fn})} "
        f"(package-internal: {len({(e['file'], e['line']) for e in fn_in})}, "
        f"external/optional: {len({(e['file'], e['line']) for e in fn if not e['dst']})})"
    )
    print(
        "  of which import models: "
        f"{len({(e['file'], e['line']) for e in fn_in if e['dst'] == ROOT_NAME + '.models'})}"
    )
    for label, kinds in (
        ("A. top-level only", {"top"}),
        ("B. top-level + TYPE_CHECKING", {"top", "typing"}),
        ("C. top-level + function-level", {"top", "function"}),
        ("D. all (top + TYPE_CHECKING + function)", {"top", "typing", "function"}),
    ):
        adj = graph(edges, kinds)
        sccs = tarjan(modules, adj)
        print(f"\n{label}: {len(sccs)} cycle(s)")
        for c in sorted(sccs, key=len, reverse=True):
            print(f"  SCC of {len(c)}: {', '.join(short(m) for m in c)}")
    top = graph(edges, {"top"})
    for start in (
        ROOT_NAME,
        ROOT_NAME + ".testing.pytest_plugin",
        ROOT_NAME + ".apps",
        ROOT_NAME + ".models",
        ROOT_NAME + ".backend",
        ROOT_NAME + ".task",
    ):
        cl = closure(top, start)
        print(f"\nimport {short(start) or start}: loads {len(cl)} package modules")
        print("   " + ", ".join(sorted(short(m) or ROOT_NAME for m in cl)))
    if "--list" in args:
        print("\nfunction-level imports:")
        seen = set()
        for e in sorted(fn, key=lambda e: (e["file"], e["line"])):
            k = (e["file"], e["line"])
            if k in seen:
                continue
            seen.add(k)
            print(f"  {e['file']}:{e['line']}  [{e['func']}]  {e['what']}")
    if "--json" in args:
        out = args[args.index("--json") + 1]
        Path(out).write_text(json.dumps(edges, indent=1))


if __name__ == "__main__":
    main()
