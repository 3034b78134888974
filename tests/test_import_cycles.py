"""scripts/imports.py: no import cycle among the runtime modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``scripts/<name>`` with ``args`` as the suite's Python; its result."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_import_cycle_among_the_runtime_modules() -> None:
    """issue 22: 0 cycles, lazy and TYPE_CHECKING imports included (scripts/imports.py)."""
    r = script("imports.py")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_lazy_import_back_is_a_cycle(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import imports
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    pkg = tmp_path / "adaptd"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from adaptd.core import b\n")
    (pkg / "core" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\n"
        "def f():\n    from adaptd.core.a import x  # lazy, still a cycle\n"
    )
    (pkg / "core" / "c.py").write_text("from . import a\n")  # one way only: no cycle
    assert imports.cycles(imports.graph(tmp_path)) == [["adaptd.core.a", "adaptd.core.b"]]
