"""The protocol's timings are said once (adaptd/protocol/job.py) and every side that
defaults to them agrees: the daemon's rounds and a rank's wait for their decision, the
liveness timeout of the config and of the registry, the report interval the simulator
and a round's lead assume."""

from __future__ import annotations

from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.config import loader as config
from adaptd.core.rounds import JobRounds
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.options import DaemonOptions
from adaptd.protocol import job as p
from adaptd.sim import engine


def test_a_round_is_bounded_alike_on_both_sides() -> None:
    daemon = JobRounds("j", 2)
    rank = DaemonRounds("j", 0)
    assert daemon.timeout_s == rank._timeout_s == p.ROUND_TIMEOUT_S
    assert daemon.lead_time_s > p.REPORT_INTERVAL_S  # a rank may be one report ahead


def test_a_silent_rank_is_gone_after_the_same_time_everywhere() -> None:
    assert config.from_mapping({}).liveness_timeout_s == p.LIVENESS_TIMEOUT_S
    assert Registry().liveness.liveness_timeout_s == p.LIVENESS_TIMEOUT_S
    assert DaemonOptions().liveness_timeout_s == p.LIVENESS_TIMEOUT_S


def test_the_simulated_hook_reports_as_the_real_one() -> None:
    assert engine.REPORT_S == p.REPORT_INTERVAL_S
