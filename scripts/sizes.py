"""Print every module over 600 lines and every class over 400; exit 1 if there is any.

"Small modules with one job each; split a class before ~400 lines" is the house
rule (docs/architecture.md). This script makes it a check the suite runs
(tests/test_sizes.py), so a module or class that grows past the limit fails CI
instead of being noticed at review.

    python scripts/sizes.py            # the adaptd/, client/, policies/ packages
    python scripts/sizes.py --all      # every limit-holder, and the largest ones under it
    python scripts/sizes.py PATH...    # other folders or files

A class is measured from its ``class`` line (or first decorator) to its last line
(:mod:`ast` end positions), so its docstring and methods count and the module's
code after it does not.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The runtime packages: what the limits are about (tests and scripts are not held to them).
DEFAULT_PATHS = ("adaptd", "client", "policies")
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400

#: Files over a limit for now, each with the reason and who removes the entry.
ALLOWED: dict[str, str] = {}


def python_files(paths: Sequence[Path]) -> Iterator[Path]:
    for p in paths:
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*.py") if "__pycache__" not in q.parts)
        elif p.suffix == ".py":
            yield p


def measure(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """The module's line count and ``(class name, lines)`` for every class in it
    (nested classes too, named ``Outer.Inner``). Raises :class:`SyntaxError`."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    classes: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                end = child.end_lineno or child.lineno
                name = f"{prefix}{child.name}"
                classes.append((name, end - first + 1))
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return len(text.splitlines()), classes


def relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="folders or files (default: packages)")
    parser.add_argument("--all", action="store_true", help="also list the ten largest of each")
    args = parser.parse_args(argv)
    paths = args.paths or [ROOT / p for p in DEFAULT_PATHS]

    modules: list[tuple[int, str]] = []
    classes: list[tuple[int, str]] = []
    for path in python_files(paths):
        lines, found = measure(path)
        rel = relative(path)
        modules.append((lines, rel))
        classes += [(n, f"{rel}:{name}") for name, n in found]

    over = 0
    for kind, rows, limit in (("module", modules, MAX_MODULE_LINES),
                              ("class", classes, MAX_CLASS_LINES)):  # fmt: skip
        rows.sort(reverse=True)
        for n, where in rows:
            if n <= limit:
                break
            allowed = ALLOWED.get(where.split(":")[0])
            if allowed:
                print(f"{kind} {where}: {n} lines (over {limit}; allowed: {allowed})")
            else:
                print(f"{kind} {where}: {n} lines (over {limit})")
                over += 1
        if args.all:
            print(f"largest {kind}{'es' if kind == 'class' else 's'}:")
            for n, where in rows[:10]:
                print(f"  {n:5d}  {where}")
    if over:
        print(
            f"{over} over the limits (modules {MAX_MODULE_LINES} lines, classes "
            f"{MAX_CLASS_LINES}): split them, one job per module and class",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
