"""The end of a job is not a broken agreement (CI of stop 37, tests/multiworker/test_hook.py):
the chief finished its last save and its process, which holds the coordination service,
ended while rank 1 still wrote its own; rank 1's watcher, waiting for the next round's
proposal, got ``UnavailableError: Socket closed`` and the rank recorded its agreement as
broken (and logged an error) after a clean run. The hook now tells its authority the loop
is over (``ending``) before the last save, and a store failing after that is logged only.
The store lost *while the loop runs* still breaks the agreement."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from adaptd.client.agreement.agreed import Coordinated
from adaptd.client.agreement.authority import Solo
from adaptd.client.agreement.coordination import CoordinationError
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement, AgreementOptions
from adaptd.client.save.schedule import SaveSchedule
from client.kv_store import DictStore

DEADLINE_S = 10.0


class GoneStore(DictStore):
    """Its ``get`` waits until :attr:`gone` is set (past the watcher's slice: the watcher
    is always in a get when the service goes), then fails as the service's does when the
    chief's process ended."""

    def __init__(self) -> None:
        super().__init__()
        self.gone = threading.Event()
        self.waiting = threading.Event()

    def get(self, key: str, timeout_s: float) -> str | None:
        self.waiting.set()
        if self.gone.wait(DEADLINE_S):
            raise CoordinationError(f"coordination service get {key!r} failed: Socket closed")
        return None


def rank_one(store: GoneStore) -> Agreement:
    options = AgreementOptions(timeout_s=5.0, slice_s=0.5)
    return Agreement(store, Identity("mw", rank=1, world_size=2), position=lambda: 800,
                     wake=lambda: None, session=0, options=options)  # fmt: skip


def end_of(agreement: Agreement) -> None:
    thread = agreement._thread
    assert thread is not None
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the watcher did not end"


def test_the_service_lost_while_the_loop_runs_breaks_the_agreement() -> None:
    store = GoneStore()
    agreement = rank_one(store)
    agreement.start()
    assert store.waiting.wait(DEADLINE_S)
    store.gone.set()
    end_of(agreement)
    assert "Socket closed" in agreement.broken


def test_the_service_lost_after_the_loop_ended_is_not_a_break() -> None:
    store = GoneStore()
    agreement = rank_one(store)
    rank = Coordinated(SaveSchedule(), agreement)
    rank.start()
    assert store.waiting.wait(DEADLINE_S)  # the watcher waits for round 0's proposal
    rank.ending()  # the hook's close began: the last save is being written
    store.gone.set()  # meanwhile the chief's process ended
    end_of(agreement)
    assert agreement.broken == ""
    rank.close()
    assert agreement.broken == ""


class Recording(Solo):
    """A single rank's authority that notes what was on disk when it heard ``ending``."""

    def __init__(self, schedule: SaveSchedule, ckpts: Path) -> None:
        super().__init__(schedule)
        self.ckpts = ckpts
        self.saved_at_ending: list[str] | None = None

    def ending(self) -> None:
        self.saved_at_ending = sorted(p.name for p in self.ckpts.glob("ckpt-*.index"))


@pytest.mark.tf
def test_the_hook_says_the_loop_ended_before_it_writes_the_last_save(tmp_path) -> None:
    tf = pytest.importorskip("tensorflow")
    import warnings

    from adaptd.client import AdaptiveCheckpointer

    v = tf.Variable(0.0)
    ckptr = AdaptiveCheckpointer(
        tmp_path / "ckpts", job="trial", socket=f"ipc://{tmp_path}/none.sock",
        daemon_timeout=0.2, handle_sigterm=False, policy="default", v=v,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no daemon": expected here
        ckptr.restore_or_initialize()
        spy = Recording(ckptr._schedule, tmp_path / "ckpts")
        ckptr._authority = spy
        for _ in range(5):
            v.assign_add(1.0)
            ckptr.step()
        t0 = time.monotonic()
        ckptr.close()
    assert time.monotonic() - t0 < DEADLINE_S
    assert [r.step for r in ckptr.history] == [5]  # close wrote the last step
    assert spy.saved_at_ending == [], "the authority heard of the end only after the last save"
