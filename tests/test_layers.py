"""The import contracts of pyproject.toml hold, and they catch what they forbid (issue 32).

``scripts/layers.py`` runs import-linter on the installed layout (``make test`` runs it
beside ruff). Here the whole tree is copied, checked as it is (kept), then broken in one
place at a time: an import up a floor (a lazy one, inside a function), a TensorFlow
import in the daemon, the hook importing the daemon, a new module given no floor, one
package of a floor importing another of the same floor, and two modules of a package
importing each other. Each must break its contract, by name.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import layers
finally:
    sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.skipif(
    not (Path(sys.executable).parent / "lint-imports").exists(),
    reason="import-linter is not installed: pip install -e '.[dev]'",
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the runtime packages and pyproject.toml, to break."""
    root = tmp_path_factory.mktemp("tree")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("adaptd", "client", "policies"):
        shutil.copytree(ROOT / folder, root / folder, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def lint(root: Path) -> tuple[int, str]:
    result = layers.lint(root)
    return result.returncode, result.stdout + result.stderr


def broken(tree: Path, modules: dict[str, str]) -> tuple[int, str]:
    """lint of ``tree`` with new ``modules`` (path -> text) in it; they are removed after."""
    for path, text in modules.items():
        assert not (tree / path).exists(), path
        (tree / path).write_text(text)
    try:
        return lint(tree)
    finally:
        for path in modules:
            (tree / path).unlink()


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    rc, out = lint(tree)
    assert rc == 0, out
    assert "Contracts: 4 kept, 0 broken." in out


def test_an_import_up_a_floor_breaks_the_floors(tree: Path) -> None:
    rc, out = broken(
        tree, {"adaptd/core/upstairs.py": "def f():\n    from adaptd.state import store\n"}
    )
    assert rc == 1
    assert "no import runs up a floor BROKEN" in out
    assert "adaptd.core.upstairs -> adaptd.state.store" in out


def test_tensorflow_in_the_daemon_breaks_its_contract(tree: Path) -> None:
    rc, out = broken(tree, {"adaptd/daemon/tf.py": "import tensorflow as tf\n"})
    assert rc == 1
    assert "the daemon and the core never import tensorflow BROKEN" in out
    assert "adaptd.daemon.tf -> tensorflow" in out


def test_the_hook_importing_the_daemon_breaks_its_contract(tree: Path) -> None:
    rc, out = broken(tree, {"client/peek.py": "from adaptd.daemon import server\n"})
    assert rc == 1
    assert "the hook never imports the daemon BROKEN" in out


def test_a_module_with_no_floor_is_an_error(tree: Path) -> None:
    rc, out = broken(tree, {"adaptd/attic.py": "X = 1\n"})
    assert rc == 1
    assert "The following modules are not listed as layers:\n\n- adaptd.attic" in out


def test_two_packages_of_one_floor_never_import_each_other(tree: Path) -> None:
    rc, out = broken(tree, {"adaptd/state/gauge.py": "from adaptd.telemetry import host\n"})
    assert rc == 1
    assert "adaptd.state is not allowed to import adaptd.telemetry" in out
    assert "adaptd.state.gauge -> adaptd.telemetry.host" in out


def test_two_modules_importing_each_other_break_the_acyclic_contract(tree: Path) -> None:
    rc, out = broken(
        tree,
        {
            "adaptd/fleet/ping.py": "from adaptd.fleet import pong\n",
            "adaptd/fleet/pong.py": "def f():\n    from adaptd.fleet import ping\n",
        },
    )
    assert rc == 1
    assert "no import cycles between the parts of a package BROKEN" in out
    assert "No cycles are allowed in adaptd.fleet." in out
