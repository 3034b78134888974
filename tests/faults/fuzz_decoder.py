"""Coverage-guided fuzzing (atheris, libFuzzer) of the daemon's message decoders.

Every input is given to the three decoders the daemon and the hook run on bytes
from a socket: :func:`adaptd.protocol.decode_client`, :func:`~adaptd.protocol.decode_daemon`
and :func:`adaptd.admin.decode_request`. Each must either return a message that
re-encodes to an equal message, or raise its one refusal type with a known code;
any other exception, a hang or a crash is a finding (libFuzzer saves the input as
``crash-*``). The corpus starts from one valid encoding of every message kind.

Run by hand for as long as you like (``-max_total_time`` in seconds)::

    python tests/faults/fuzz_decoder.py -max_total_time=600 -seed=1 /tmp/adaptd-corpus

``tests/faults/test_protocol_abuse.py::test_atheris_fuzzes_the_decoders`` runs it for
a bounded number of inputs in the suite. atheris instruments the Python code
(adaptd's decoders and their checks); msgspec's C parser underneath is exercised
but not coverage-instrumented.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["adaptd"]):
    from adaptd import admin
    from adaptd import protocol as p

CODES = {"malformed", "invalid", "version", "too_large"}


def check(data: bytes) -> None:
    """One input: accepted and round-tripping, or refused with a known code."""
    for decode, encode, refusal in (
        (p.decode_client, p.encode, p.ProtocolError),
        (p.decode_daemon, p.encode, p.ProtocolError),
        (admin.decode_request, admin.encode, admin.AdminError),
    ):
        try:
            msg = decode(data)
        except refusal as exc:
            if exc.code not in CODES:
                raise AssertionError(f"unexpected refusal code {exc.code!r}") from exc
            continue
        if decode(encode(msg)) != msg:
            raise AssertionError(f"{msg!r} does not round-trip")


def seeds() -> list[bytes]:
    """One valid encoding of every message kind, for the starting corpus."""
    v = p.VERSION
    return [
        p.encode(p.Hello(v=v, job="j", rank=1, world_size=2, pid=7, checkpoint_dir="/ck")),
        p.encode(p.Steps(v=v, job="j", rank=0, step=10, count=10, mean_s=0.1, max_s=0.2)),
        p.encode(p.SaveReport(v=v, job="j", rank=0, step=10, blocking_s=0.1, durable_s=1, bytes=9)),
        p.encode(p.Goodbye(v=v, job="j", rank=0, step=10, reason="done")),
        p.encode(p.Welcome(v=v, job="j", rank=0)),
        p.encode(p.Plan(v=v, job="j", seq=1, next_step=100, every_steps=50, interval_s=3.0)),
        p.encode(p.SaveNow(v=v, job="j", reason="ops", at_step=3)),
        p.encode(p.Error(v=v, code="invalid", message="x")),
        admin.encode(admin.SaveNowRequest(job="j")),
        admin.encode(admin.DrainRequest(timeout_s=5)),
        admin.encode(admin.SetPolicyRequest(job="j", spec="fixed:steps=5")),
        admin.encode(admin.PauseRequest(job=None, paused=True)),
        admin.encode(admin.StatusRequest()),
    ]


def main(argv: list[str]) -> None:
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    if corpus:  # seed the first corpus directory once
        d = Path(corpus[0])
        d.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds()):
            (d / f"seed-{i:02d}").write_bytes(seed)
    atheris.Setup(argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
