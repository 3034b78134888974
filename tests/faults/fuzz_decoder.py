"""Coverage-guided fuzzing (atheris, libFuzzer) of the daemon's validation layer.

Every input goes to the three decoders the daemon and the hook run on bytes from a
socket: :func:`adaptd.protocol.job.decode_client`, :func:`~adaptd.protocol.job.decode_daemon`
and :func:`adaptd.protocol.admin.decode_request`. Each must either return a message that
re-encodes to an equal message, or raise its one refusal type with a known code. A
client message that is accepted then goes where the daemon sends it: a registry (the
job's tracker), the default policy and a state store (in memory), none of which may
raise. Any other exception, a hang or a crash is a finding (libFuzzer saves the
input as ``crash-*``).

msgspec's C parser is not coverage-instrumented, so byte-level mutation alone stalls
at its door. The corpus therefore starts from a valid message of every kind
(tests/faults/_schemas.py builds them from the structs), and a structure-aware
mutator mostly decodes an input as a msgpack map, sets one field to an edge value
from the contract (NaN, ±inf, negative, beyond int64, too long, wrong type...), drops
or adds a field, and re-encodes it; one input in five gets libFuzzer's byte mutation.

Run by hand for as long as you like (``-max_total_time`` in seconds)::

    python tests/faults/fuzz_decoder.py -max_total_time=600 -seed=1 /tmp/adaptd-corpus

``tests/faults/test_protocol_abuse.py::test_atheris_fuzzes_the_decoders`` runs it for
a bounded number of inputs in the suite.
"""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path

import atheris
import msgspec

with atheris.instrument_imports(include=["adaptd"]):
    from adaptd.core.policy import parse
    from adaptd.core.snapshot import Snapshot
    from adaptd.daemon.jobs.registry import Registry
    from adaptd.protocol import admin
    from adaptd.protocol import job as p
    from adaptd.state.store import Store

sys.path.insert(0, str(Path(__file__).parent))
from _schemas import CODES, KINDS, edges, fields, minimal

BY_TAG = {k.tag: k for k in KINDS}
POLICY = parse("default")
logging.getLogger("adaptd").setLevel(logging.ERROR)  # the in-memory store warns once
STORE = Store.open(":memory:")


def consume(msg: p.ClientMessage) -> None:
    """What the daemon does with an accepted client message, minus the sockets."""
    reg = Registry(emit=STORE.on_event)
    hello = msg if isinstance(msg, p.Hello) else p.Hello(v=p.VERSION, job=msg.job, rank=msg.rank)
    job, rank, _ = reg.hello(b"peer", hello, 1.0)
    if isinstance(msg, p.Steps):
        reg.steps(job, rank, msg, 2.0)
    elif isinstance(msg, p.SaveReport):
        reg.save_report(job, rank, msg, 2.0)
    elif isinstance(msg, p.Goodbye):
        reg.goodbye(job, rank, msg, 2.0)
    POLICY.decide(Snapshot(time=2.0), job.tracker.state(time=2.0))
    errors = STORE.write_errors
    STORE.flush()
    if STORE.write_errors != errors:
        raise AssertionError(f"the store could not write {msg!r}: {STORE.last_error}")


def check(data: bytes) -> None:
    """One input: accepted and round-tripping (and consumed), or refused with a known code."""
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
        if decode is p.decode_client:
            consume(msg)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """Mostly a structured change of one field; sometimes libFuzzer's byte mutation."""
    rng = random.Random(seed)
    try:
        doc = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        doc = None
    if not isinstance(doc, dict) or rng.random() < 0.2:
        return atheris.Mutate(data, max_size)
    tags = [(field, doc.get(field)) for field in ("kind", "op")]
    kind = next((BY_TAG[t] for t in tags if isinstance(t[1], str) and t in BY_TAG), None)
    names = list(fields(kind)) if kind is not None else []
    roll = rng.random()
    if names and roll < 0.6:  # one field to an edge value, or to a plain valid one
        name, t, _ = rng.choice(names)
        if rng.random() < 0.8:
            doc[name] = rng.choice(edges(kind, name, t)).value
        else:
            doc[name] = minimal(kind).get(name, rng.choice([0, 1.0, "x", None, True]))
    elif roll < 0.7:  # another kind's tag: the same fields against another schema
        other = rng.choice(KINDS)
        doc = {**doc, other.tag[0]: other.tag[1]}
    elif roll < 0.8 and doc:  # a field gone
        del doc[rng.choice(list(doc))]
    elif roll < 0.9:  # a field from another message, with a random value
        other = rng.choice(KINDS)
        extra = list(fields(other))
        if extra:
            name, t, _ = rng.choice(extra)
            doc[name] = rng.choice(edges(other, name, t)).value
    else:
        doc["v"] = rng.choice([p.VERSION, p.VERSION + 1, -1, 2**64 - 1, 1.0, "1"])
    out = msgspec.msgpack.encode(doc)
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def seeds() -> list[bytes]:
    """A valid message of every kind, for the starting corpus."""
    return [msgspec.msgpack.encode(minimal(k)) for k in KINDS]


def main(argv: list[str]) -> None:
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    if corpus and not Path(corpus[0]).is_file():  # seed the corpus directory (a file: rerun it)
        d = Path(corpus[0])
        d.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds()):
            (d / f"seed-{i:02d}").write_bytes(seed)
    atheris.Setup(argv, check, custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
