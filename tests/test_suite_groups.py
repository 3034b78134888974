"""The suite's xdist groups (tests/conftest.py): the modules that mostly wait run in one
worker, every other module whole in one worker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_every_waiting_module_exists() -> None:
    """A module renamed or removed would silently leave the group: it must be named again."""
    missing = sorted(m for m in conftest.WAITING_MODULES if not (ROOT / m).is_file())
    assert not missing, f"tests/conftest.py WAITING_MODULES names modules that are gone: {missing}"


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.marks: list[Any] = []

    def add_marker(self, mark: Any) -> None:
        self.marks.append(mark)


def _groups(dist: str, nodeids: list[str]) -> list[list[str]]:
    config = SimpleNamespace(
        getoption=lambda name, default=None: dist if name == "dist" else default
    )
    items = [_Item(n) for n in nodeids]
    conftest.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    return [[m.args[0] for m in item.marks if m.name == "xdist_group"] for item in items]


def test_under_loadgroup_waiting_modules_share_a_group_and_others_keep_their_module() -> None:
    waiting = sorted(conftest.WAITING_MODULES)[:2]
    nodeids = [
        f"{waiting[0]}::test_a",
        f"{waiting[1]}::test_b[x]",
        "tests/sim/test_theory.py::test_c",
        "tests/sim/test_theory.py::test_d",
        "tests/model/test_model.py::test_e",
    ]
    assert _groups("loadgroup", nodeids) == [
        [conftest.WAITING_GROUP],
        [conftest.WAITING_GROUP],
        ["tests/sim/test_theory.py"],
        ["tests/sim/test_theory.py"],
        ["tests/model/test_model.py"],
    ]


@pytest.mark.parametrize("dist", ["no", "loadscope", "load"])
def test_other_distributions_are_left_alone(dist: str) -> None:
    assert _groups(dist, [f"{sorted(conftest.WAITING_MODULES)[0]}::test_a"]) == [[]]
