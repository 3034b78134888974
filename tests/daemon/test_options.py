"""A daemon's settings are one frozen, validated object (issue 22 item 5).

Every option of :class:`~adaptd.daemon.options.DaemonOptions` has a default (a daemon
is ``build(DaemonOptions(socket=path))``) and a check: a bad value is refused when the
object is made, before anything is bound, with a DaemonError naming the option.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from adaptd.config.schema import LIVENESS_TIMEOUT_S
from adaptd.daemon.assembly import build
from adaptd.daemon.options import DaemonOptions
from adaptd.daemon.transport import DaemonError


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("default_policy", "nosuch", "policy (--policy) 'nosuch'"),
        ("liveness_timeout_s", 0, "liveness_timeout_s (--silence-timeout) must be > 0"),
        ("liveness_timeout_s", float("nan"), "liveness_timeout_s"),
        ("resend_after_s", -1.0, "resend_after_s must be > 0"),
        ("tick_interval_s", float("inf"), "tick_interval_s must be > 0"),
        ("replan_tolerance", 1.0, "replan_tolerance must be in [0, 1)"),
        ("replan_tolerance", -0.1, "replan_tolerance must be in [0, 1)"),
        # checked here only: the memory tiers' hook takes the share as these options hold it
        ("memory_tier_share", 0, "daemon.memory_tier_share must be a share"),
        ("memory_tier_share", 1.5, "daemon.memory_tier_share must be a share"),
    ],
)
def test_a_bad_option_is_refused_naming_it(option: str, value: object, named: str) -> None:
    with pytest.raises(DaemonError) as info:
        DaemonOptions(**{option: value})
    assert str(info.value).startswith(named), str(info.value)


def test_every_option_has_a_default_and_the_object_is_frozen(short_dir: Path) -> None:
    options = DaemonOptions()
    assert options.liveness_timeout_s == LIVENESS_TIMEOUT_S  # the config's default, one home
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.default_policy = "young"  # type: ignore[misc]
    settings = {"a": object()}
    frozen = DaemonOptions(job_settings=settings)  # type: ignore[arg-type]
    settings["b"] = object()  # the caller's dict is not the daemon's
    assert list(frozen.job_settings) == ["a"]
    assert options.planner.replan_tolerance == options.replan_tolerance  # made once, kept
    d = build(DaemonOptions(socket=short_dir / "adaptd.sock")).start()
    try:
        assert d.status().daemon.default_policy == DaemonOptions().default_policy
    finally:
        d.stop()
