"""Two tiers on the wire and in the daemon's figures (issue 24): a plan carries
``durable_every``, a save report its tier, a hello the local tier and whether the run
found it intact; a one-tier message is byte for byte what an older peer knows; the
daemon learns δ₁ apart from δ and tells a process failure from a host failure."""

from __future__ import annotations

import msgspec

from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.table import SaveCosts, failure_kind
from adaptd.protocol import job as p


def _report(step: int, tier: str, cost: float) -> p.SaveReport:
    return p.SaveReport(v=p.VERSION, job="j", rank=0, step=step, blocking_s=cost,
                        durable_s=cost * 2, bytes=1, tier=tier)  # fmt: skip


def test_one_tier_messages_carry_no_new_field():
    plan = p.Plan(v=p.VERSION, job="j", seq=1, next_step=10, every_steps=10)
    raw = msgspec.msgpack.decode(p.encode(plan))
    assert "durable_every" not in raw
    hello = msgspec.msgpack.decode(p.encode(p.Hello(v=p.VERSION, job="j")))
    assert not {"local_tier", "resumed_tier", "local_intact"} & set(hello)
    assert "tier" not in msgspec.msgpack.decode(p.encode(_report(5, "", 0.1)))


def test_two_tier_plan_and_report_round_trip():
    plan = p.Plan(v=p.VERSION, job="j", seq=1, next_step=10, every_steps=10, durable_every=4)
    back = p.decode_daemon(p.encode(plan))
    assert back.durable_every == 4
    from adaptd.client.save.schedule import decision_of

    d = decision_of(back)
    assert isinstance(d, Decision) and d.durable_every == 4
    assert [d.durable_at(s, 0) for s in (10, 20, 30, 40)] == [False, False, False, True]
    assert p.decode_client(p.encode(_report(5, "local", 0.1))).tier == "local"


def test_the_daemon_learns_the_local_cost_apart_from_the_durable_one():
    from adaptd.core.estimators import JobTracker

    t = JobTracker("j", local_tier=True)
    costs = SaveCosts()
    costs.on_report(t, _report(5, "local", 0.01), 1.0)
    costs.on_report(t, _report(10, "", 0.5), 2.0)
    state = t.state()
    assert state.local_save_cost_s == 0.01 and state.save_cost_s == 0.5
    assert state.last_durable_step == 10  # a local save makes nothing durable


def test_a_return_with_the_local_tier_intact_is_a_process_failure():
    base = {"v": p.VERSION, "job": "j"}
    assert failure_kind(p.Hello(**base, local_tier="memory", local_intact=True)) == "process"
    assert failure_kind(p.Hello(**base, local_tier="memory")) == "host"
    assert failure_kind(p.Hello(**base)) is None


def test_failure_classes_are_learned_per_job_and_kept_across_a_daemon_restart(tmp_path):
    """A job with a local tier gets failure classes of its own; its returns teach them
    (intact: a process failure, gone: a host failure), and the store keeps them."""
    from adaptd.core.estimators import FailureRate
    from adaptd.daemon.jobs.table import Job
    from adaptd.state.learned import Learned
    from adaptd.state.store import Store

    def learned(store: Store) -> Learned:
        return Learned(store, failure_rate=FailureRate(), gpu_mtbf_s=1e6)

    hello = p.Hello(v=p.VERSION, job="j", local_tier="memory")
    store = Store.open(tmp_path / "state.db")
    job = Job.first(hello, learned(store).tracker_for(hello), 0.0)
    classes = job.tracker.failure_classes
    assert classes is not None and job.tracker.local_tier
    back = p.Hello(v=p.VERSION, job="j", local_tier="memory", resumed_from=10,
                   resumed_tier="local", local_intact=True)  # fmt: skip
    job.new_run(back, 100.0, failed_at=90.0)
    job.new_run(p.Hello(v=p.VERSION, job="j", local_tier="memory", resumed_from=20),
                200.0, failed_at=190.0)  # fmt: skip
    job.new_run(back, 300.0, failed_at=290.0)
    classes = job.tracker.failure_classes
    assert (classes.process.failures, classes.host.failures) == (2, 1)
    learned(store).keep_job("j", job.tracker.learned(), failure=True)
    store.flush()
    store.close()

    store = Store.open(tmp_path / "state.db")  # the daemon restarted
    again = learned(store).tracker_for(hello).failure_classes
    store.close()
    assert again is not None and (again.process.failures, again.host.failures) == (2, 1)
    # one tier: no classes (every failure a lost host, as before)
    store = Store.open(tmp_path / "other.db")
    assert learned(store).tracker_for(p.Hello(v=p.VERSION, job="k")).failure_classes is None
    store.close()


def test_the_daemon_counts_the_durable_cadence_from_the_durable_saves_only():
    """A save the daemon learns of from a step report (in flight) is counted as durable
    only where the plan's rule says so, as the hook decides: the anchor io_aware and
    the next durable save count from stays at the last durable save."""
    from adaptd.daemon.jobs.table import Job

    hello = p.Hello(v=p.VERSION, job="j", local_tier="memory")
    from adaptd.daemon.jobs.registry import default_tracker

    job = Job.first(hello, default_tracker(hello), 0.0)
    job.plan = Decision(next_step=10, every_steps=10, durable_every=2)
    t = job.tracker
    job._save_started(10, 1.0)  # local: 10 - 0 < 2 x 10
    assert t.last_durable_save_step is None and t.state().durable_anchor == 0
    t.on_save_report(2.0, 10, blocking_s=0.01, durable_s=0.02, tier="local")
    job._save_started(20, 3.0)  # durable
    assert t.state().durable_anchor == 20
    t.on_save_report(4.0, 20, blocking_s=0.5, durable_s=1.0)
    job._save_started(30, 5.0)  # local again
    assert t.state().durable_anchor == 20
