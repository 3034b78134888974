"""Check the import contracts of pyproject.toml (``[tool.importlinter]``) on the installed layout.

import-linter (grimp) finds a package's modules by walking its folder, but two of
adaptd's packages live outside ``adaptd/``: ``client/`` is ``adaptd.client`` and
``policies/`` is ``adaptd.policies`` (pyproject's ``package-dir``). This script lays out
``build/layers/adaptd/`` as a wheel would (links to every entry of ``adaptd/``, plus
``client`` and ``policies``) and runs ``lint-imports`` there, so every runtime module is
checked under the name it is imported by. ``make test`` runs it beside ruff.

    python scripts/layers.py           # lint-imports: exit 1 if a contract is broken
    python scripts/layers.py --up      # also list each direct import that runs up a floor

``--up`` reads the ``floors`` (layers) contract and prints every import from a module to a
module of a higher floor, or to the other package of its own floor, with its line: the
figure the issue's notes give as "imports running up". Lazy imports and those under
``if TYPE_CHECKING:`` count, as they do for lint-imports.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
#: Source folders installed inside adaptd/ under another name (pyproject's package-dir).
INSIDE = {"client": "client", "policies": "policies"}


def stage(root: Path, dest: Path) -> Path:
    """Lay out ``dest/adaptd`` as installed: links to ``root/adaptd``'s entries and to
    ``root/client``, ``root/policies``. Returns ``dest`` (the folder to run from)."""
    pkg = dest / "adaptd"
    if pkg.is_symlink() or pkg.is_file():
        pkg.unlink()
    elif pkg.exists():
        for entry in pkg.iterdir():  # only links live here: never follow them
            entry.unlink()
        pkg.rmdir()
    pkg.mkdir(parents=True)
    for entry in sorted((root / "adaptd").iterdir()):
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in INSIDE.items():
        (pkg / name).symlink_to(root / folder)
    return dest


def lint(root: Path = ROOT, where: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` (beside this Python) on ``root`` laid out under ``where``
    (default ``root/build/layers``); its result. Raises FileNotFoundError when
    import-linter is not installed (the dev extra)."""
    cwd = stage(root, where or root / "build" / "layers")
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():
        raise FileNotFoundError(f"{exe}: install the dev extra (pip install -e '.[dev]')")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(exe), str(root / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def up_imports(root: Path = ROOT, where: Path | None = None) -> list[str]:
    """Every direct import that runs up a floor of the ``floors`` contract (or across two
    independent packages of one floor), as ``importer -> imported (l. N)``, with
    ``(ignored)`` after those the contract's ``ignore_imports`` lets through."""
    import grimp  # import-linter's graph builder: part of the dev extra

    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    floors = next(c for c in contracts if c.get("id") == "floors")
    (container,) = floors["containers"]
    level: dict[str, tuple[int, str]] = {}
    for i, layer in enumerate(floors["layers"]):
        for name in layer.split("|"):
            level[f"{container}.{name.strip().strip('()')}"] = (i, name.strip().strip("()"))
    ignored = [_pattern(e) for e in floors.get("ignore_imports", [])]
    cwd = stage(root, where or root / "build" / "layers")
    sys.path.insert(0, str(cwd))
    try:
        graph = grimp.build_graph(container, cache_dir=None)
    finally:
        sys.path.remove(str(cwd))

    def floor(module: str) -> tuple[int, str] | None:
        parts = module.split(".")
        return level.get(".".join(parts[:2])) if len(parts) > 1 else None

    out = []
    for importer in sorted(graph.modules):
        a = floor(importer)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            b = floor(imported)
            if a is None or b is None or a == b or b[0] > a[0]:
                continue
            lines = sorted(
                d["line_number"]
                for d in graph.get_import_details(importer=importer, imported=imported)
            )
            line = f"{importer} -> {imported} (l. {', '.join(map(str, lines))})"
            if any(p.fullmatch(f"{importer} -> {imported}") for p in ignored):
                line += " (ignored)"
            out.append(line)
    return out


def _pattern(expression: str) -> re.Pattern[str]:
    """An import expression of import-linter (``a.* -> b.**``) as a regular expression:
    ``*`` is one module name, ``**`` any number of them."""
    parts = re.split(r"(\*\*|\*)", expression)
    table = {"**": r"[^ ]+", "*": r"[^. ]+"}
    return re.compile("".join(table.get(part, re.escape(part)) for part in parts))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--up", action="store_true", help="list the imports running up a floor")
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to check")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.up:
        found = up_imports(root)
        for line in found:
            print(line)
        n = sum(line.endswith("(ignored)") for line in found)
        print(f"{len(found)} imports run up a floor, {n} of them ignored by the contract")
    result = lint(root)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
