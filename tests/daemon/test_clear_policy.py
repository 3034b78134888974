"""``adaptd set-policy --job J --clear``: an operator's policy taken back.

The job gets what it would have at a first hello without one: the config's ``[jobs]``
policy for it, else the spec its ranks asked for, else the daemon's default; the new
plan is pushed at once, the change is an event (the store keeps it) and the command
says what changed, or that there was nothing to clear. A daemon thread with an event
sink; raw DEALER ranks.
"""

from __future__ import annotations

import json
import time

import pytest
from daemon_helpers import DEADLINE, Peer, thread_daemon

from adaptd import events as ev
from adaptd.cli import main as cli_main
from adaptd.protocol import admin
from adaptd.protocol import job as p

DEFAULT = "fixed:steps=50"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def configured(job: str) -> admin.JobSettings | None:
    return admin.JobSettings(policy="fixed:steps=21") if job == "cl-config" else None


@pytest.fixture
def daemon(short_dir):
    with thread_daemon(short_dir / "adaptd.sock", default_policy=DEFAULT,
                       config_settings=configured) as (d, sink):  # fmt: skip
        yield d, sink, str(d.socket_path)


def test_clear_returns_the_job_to_the_daemons_default_and_says_so(daemon, zctx, capsys) -> None:
    d, sink, sock = daemon
    peer = Peer(zctx, d.endpoint)
    assert peer.hello("cl-a").every_steps == 50
    rc, out, _ = cli(capsys, "set-policy", "--job", "cl-a", "fixed:steps=13", "--socket", sock)
    assert rc == 0 and peer.expect(p.Plan).every_steps == 13
    rc, out, err = cli(capsys, "set-policy", "--job", "cl-a", "--clear", "--socket", sock)
    assert rc == 0, err
    plan = peer.expect(p.Plan)
    assert plan.every_steps == 50
    assert out == (
        f"cl-a: operator's policy fixed:steps=13 cleared; now policy {DEFAULT} "
        f"(the daemon's default); plan {plan.seq} pushed\n"
    )
    changed = sink.wait_for(ev.JobSettingsChanged, lambda e: e.policy is None)
    assert (changed.job, changed.paused) == ("cl-a", False)
    info = next(j for j in d.status().jobs if j.job == "cl-a")
    assert info.policy == DEFAULT and not info.policy_set
    # again: nothing to clear, nothing pushed
    rc, out, _ = cli(capsys, "set-policy", "--job", "cl-a", "--clear", "--socket", sock)
    assert (rc, out) == (0, "nothing to clear: cl-a has no policy set by an operator; "
                            f"its policy {DEFAULT} (the daemon's default)\n")  # fmt: skip
    assert peer.silent_for(0.3)
    rc, out, _ = cli(capsys, "set-policy", "--job", "cl-a", "--clear", "--json", "--socket", sock)
    reply = json.loads(out)
    assert (reply["cleared"], reply["policy"], reply["source"]) == (False, DEFAULT, "default")


def test_clear_gives_back_the_jobs_own_spec_or_the_configs(daemon, zctx, capsys) -> None:
    d, _, sock = daemon
    own = Peer(zctx, d.endpoint)
    assert own.hello("cl-own", policy="fixed:steps=7").every_steps == 7
    cli(capsys, "set-policy", "--job", "cl-own", "fixed:steps=13", "--socket", sock)
    assert own.expect(p.Plan).every_steps == 13
    rc, out, _ = cli(capsys, "set-policy", "--job", "cl-own", "--clear", "--socket", sock)
    assert rc == 0 and "now policy fixed:steps=7 (the spec its ranks asked for)" in out
    assert own.expect(p.Plan).every_steps == 7

    conf = Peer(zctx, d.endpoint)
    assert conf.hello("cl-config", policy="fixed:steps=7").every_steps == 21  # config wins
    cli(capsys, "set-policy", "--job", "cl-config", "fixed:steps=13", "--socket", sock)
    assert conf.expect(p.Plan).every_steps == 13
    rc, out, _ = cli(capsys, "set-policy", "--job", "cl-config", "--clear", "--socket", sock)
    assert "now policy fixed:steps=21 (the config's [jobs] entry for it)" in out
    assert conf.expect(p.Plan).every_steps == 21
    # the config's policy is no operator's: nothing more to clear
    rc, out, _ = cli(capsys, "set-policy", "--job", "cl-config", "--clear", "--socket", sock)
    assert out.startswith("nothing to clear: cl-config has no policy set by an operator")


def test_a_setting_of_a_job_not_running_here_is_cleared_too(short_dir, capsys) -> None:
    """A setting restored from the store for a job that has not come back yet."""
    settings = {"away": admin.JobSettings(policy="fixed:steps=9", paused=True)}
    with thread_daemon(short_dir / "adaptd.sock", job_settings=settings) as (d, sink):
        rc, out, _ = cli(capsys, "set-policy", "--job", "away", "--clear", "--socket",
                         str(d.socket_path))  # fmt: skip
        assert (rc, out) == (0, "away: operator's policy fixed:steps=9 cleared\n")
        changed = sink.wait_for(ev.JobSettingsChanged)
        assert (changed.job, changed.policy, changed.paused) == ("away", None, True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--job", "j"), "give a policy SPEC or --clear (one of them)"),
        (("--job", "j", "daly", "--clear"), "give a policy SPEC or --clear (one of them)"),
    ],
)
def test_a_spec_or_clear_exactly(short_dir, capsys, args, message) -> None:
    rc, _, err = cli(capsys, "set-policy", *args, "--socket", str(short_dir / "x.sock"))
    assert rc == 2 and err == f"adaptd set-policy: {message}\n"


def test_the_daemon_refuses_an_unknown_job_and_a_request_with_neither(daemon, capsys) -> None:
    _, _, sock = daemon
    rc, _, err = cli(capsys, "set-policy", "--job", "ghost", "--clear", "--socket", sock)
    assert rc == 1 and "job 'ghost' is unknown" in err
    with pytest.raises(admin.AdminError) as exc:
        admin.request(sock, admin.SetPolicyRequest(job="ghost"))
    assert exc.value.code == "invalid" and "give a policy spec or clear" in str(exc.value)


def test_a_job_decided_on_another_host_is_cleared_there(daemon, zctx, capsys) -> None:
    """Rank 1 of a job whose chief's daemon (host-a) decides its plan: nothing to take
    back here; the command names the host to run it on."""
    d, _, sock = daemon
    worker = Peer(zctx, d.endpoint)
    worker.send(p.Hello(v=p.VERSION, job="mw", rank=1, world_size=2, hostname="host-b",
                        agreement="coordination"))  # fmt: skip
    worker.expect(p.Welcome)
    worker.send(p.JobPlan(v=p.VERSION, job="mw", rank=1, at_step=10, next_step=10,
                          every_steps=5, policy="fixed", decided_by="host-a"))  # fmt: skip
    deadline = time.monotonic() + DEADLINE
    while next(j for j in d.status().jobs if j.job == "mw").decided_by != "host-a":
        assert time.monotonic() < deadline, "the JobPlan was not handled"
        time.sleep(0.02)  # polling the status: there is no event to wait on over the socket
    rc, out, err = cli(capsys, "set-policy", "--job", "mw", "--clear", "--socket", sock)
    assert (rc, out) == (1, "")
    assert err == (
        "adaptd set-policy: job 'mw' is decided by host-a's daemon: run "
        "`adaptd set-policy --job mw --clear` on that host\n"
    )
