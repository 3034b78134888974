"""pyproject.toml's packaging metadata: what setuptools warns about on every install.

A folder of modules or data left out of ``[tool.setuptools] packages`` is missing from
a wheel and makes setuptools print a banner on every ``pip install`` (``make demo``
showed two); so does a license given as a TOML table instead of an SPDX string.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _folders_with_files() -> dict[str, Path]:
    """Every installed package's dotted name -> its folder: each folder under a
    ``package-dir`` root that holds a file (modules or data), caches aside."""
    out = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        root = ROOT / folder
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            if "__pycache__" in d.parts:
                continue
            if any(f.is_file() and f.suffix != ".pyc" for f in d.iterdir()):
                rel = d.relative_to(root).parts
                out[".".join((name, *rel))] = d
    return out


def test_every_folder_of_modules_or_data_is_a_listed_package() -> None:
    listed = set(SETUPTOOLS["packages"])
    found = _folders_with_files()
    missing = sorted(set(found) - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    gone = sorted(listed - set(found))
    assert not gone, f"listed in [tool.setuptools] packages but no such folder: {gone}"


def test_every_data_file_is_package_data() -> None:
    """A package's non-Python files reach a wheel only through ``package-data``."""
    data = SETUPTOOLS.get("package-data", {})
    for name, folder in _folders_with_files().items():
        files = [f for f in folder.iterdir() if f.is_file() and f.suffix not in (".py", ".pyc")]
        for f in files:
            globs = data.get(name, [])
            assert any(f.match(g) for g in globs), (
                f"{f.relative_to(ROOT)} is not in [tool.setuptools.package-data] {name!r}"
            )


def test_the_license_is_an_spdx_string_and_setuptools_can_read_it() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = " ".join(PYPROJECT["build-system"]["requires"])
    m = re.search(r"setuptools>=(\d+)", requires)
    assert m and int(m.group(1)) >= 77, f"SPDX license strings need setuptools>=77: {requires}"
