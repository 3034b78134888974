"""Every field of a scenario file refuses a value of the wrong type, and every number
field one out of its range (negative; NaN and infinity), naming the field and the
value (issue 26). The fields are those of the shipped scenarios, so a field added to
one of them is checked too."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import tomllib

from adaptd.sim import scenario as sc

SHIPPED = {
    p.name: tomllib.loads(p.read_text())
    for p in (resources.files("adaptd.sim") / "scenarios").iterdir()
    if p.name.endswith(".toml")
}
#: Number fields where a negative value means something (an offset), if any.
SIGNED: set[tuple[str, str]] = set()


def fields() -> Iterator[tuple[str, str, str, Any]]:
    for file, data in sorted(SHIPPED.items()):
        for section, table in data.items():
            if isinstance(table, dict):
                for key, value in table.items():
                    if not isinstance(value, dict | list):
                        yield file, section, key, value


FIELDS = list(fields())


def with_value(file: str, section: str, key: str, value: Any) -> dict:
    data = copy.deepcopy(SHIPPED[file])
    data[section][key] = value
    return data


@pytest.mark.parametrize(("file", "section", "key", "value"), FIELDS,
                         ids=[f"{f}:{s}.{k}" for f, s, k, _ in FIELDS])  # fmt: skip
def test_a_wrong_type_is_refused_naming_the_field_and_value(file, section, key, value) -> None:
    wrong = {"bad": 1} if not isinstance(value, str) else 42
    with pytest.raises(sc.ScenarioError) as info:
        sc.from_dict(with_value(file, section, key, wrong), where=file)
    message = str(info.value)
    assert f"[{section}] {key}" in message and repr(wrong) in message, message


NUMBERS = [f for f in FIELDS if isinstance(f[3], int | float) and not isinstance(f[3], bool)]


@pytest.mark.parametrize(("file", "section", "key", "value"), NUMBERS,
                         ids=[f"{f}:{s}.{k}" for f, s, k, _ in NUMBERS])  # fmt: skip
def test_a_number_out_of_range_is_refused_naming_the_field_and_value(
    file, section, key, value
) -> None:
    bad = [float("nan"), float("inf")]
    if (section, key) not in SIGNED:
        bad.append(-1)
    for v in bad:
        with pytest.raises(sc.ScenarioError) as info:
            sc.from_dict(with_value(file, section, key, v), where=file)
        message = str(info.value)
        assert f"[{section}] {key}" in message or key in message, (v, message)
        assert repr(v) in message or f"{v:g}" in message, (v, message)


def test_every_shipped_scenario_loads() -> None:
    for file, data in SHIPPED.items():
        sc.from_dict(data, where=file)
