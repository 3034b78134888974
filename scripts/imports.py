"""Print the import cycles among the runtime packages; exit 1 if there is any.

Every import counts, the lazy ones inside functions too: a cycle that only shows at
run time is still two modules that cannot be understood, tested or moved one
without the other (docs/architecture.md, "Limits that keep it this way"). This
script makes "no cycles" a check the suite runs (tests/test_import_cycles.py).

import-linter's ``acyclic`` contract (pyproject.toml, ``make test``) checks more: no two
parts of a package, modules or subpackages, import each other. It checks the daemon
and the client only as wholes for now (their subpackages still import each other), so
this script stays: it keeps module cycles out of their insides, and out of a package's
``__init__`` and its modules, which that contract does not see as siblings.

    python scripts/imports.py            # the adaptd/, client/, policies/ packages
    python scripts/imports.py --graph    # also every module's internal imports

A module's package ``__init__`` is a module like the others; ``from pkg import name``
counts as an import of ``pkg.name`` when that is a module, else of ``pkg``. Imports
under ``if TYPE_CHECKING:`` count too: a type one module needs from another is a
dependency as real as a call.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Source folder -> the import name it is installed under (pyproject's package-dir).
PACKAGES = {"adaptd": "adaptd", "client": "adaptd.client", "policies": "adaptd.policies"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every runtime module by its import name."""
    found: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    # a folder mapped elsewhere (client/ -> adaptd.client) is not also part of adaptd.
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The runtime modules that module ``name`` (at ``path``) imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # adaptd.x.y.attr -> adaptd.x.y
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        for alias in node.names:
            full = f"{mod}.{alias.name}"
            add(full if full in known else mod)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
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

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print every module's imports")
    args = parser.parse_args(argv)
    edges = graph()
    if args.graph:
        for name in sorted(edges):
            print(f"{name}: {', '.join(sorted(edges[name])) or '-'}")
    found = cycles(edges)
    for comp in found:
        print(f"cycle of {len(comp)}: " + " <-> ".join(comp))
    if found:
        n = sum(len(c) for c in found)
        print(f"{len(found)} import cycles, {n} modules in them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
