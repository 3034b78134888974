"""``adaptd verify PATH``: is a TensorFlow checkpoint complete and restorable?

An Orbax checkpoint directory (a JAX job's, docs/orbax.md) is recognised first: what
Orbax commits is checked (a finalized step, :mod:`adaptd.client.orbax.checkpoints`) and
the output says plainly that adaptd does not read Orbax's array format.

For users' CI and for operators after an incident: exit 0 when the checkpoint's
index parses, every data shard has the size the index expects and every tensor
reads back with a matching checksum; exit 1 with one line per problem otherwise
(including "no checkpoint found"). The work is in :mod:`adaptd.client.restore.verify`,
imported only here because it needs TensorFlow, which the daemon never imports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from adaptd.commands import UsageError

HELP = "check that a TensorFlow checkpoint is complete and restorable"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        metavar="PATH",
        help="a checkpoint prefix (ckpts/ckpt-120) or a directory (its latest checkpoint)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from adaptd.client.orbax import checkpoints as orbax

    report: Any
    if orbax.is_orbax(args.path):
        report, text = orbax.verify(args.path), render_orbax
    else:
        # TensorFlow's C++ start-up errors say nothing about a checkpoint (on a host
        # without a GPU: "failed call to cuInit: ... CUDA error"); TF_CPP_MIN_LOG_LEVEL
        # shows them.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        try:
            from adaptd.client.restore import verify
        except ImportError as exc:
            raise UsageError(
                f"needs TensorFlow ({exc}); install it (pip install 'adaptd[tensorflow]')"
            ) from None
        report, text = verify.verify(args.path), render
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text(report))
    return 0 if report.ok else 1


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def render_orbax(report: object) -> str:
    """An Orbax directory's summary: the step checked, or the problems; the notes."""
    from adaptd.client.orbax.checkpoints import OrbaxReport

    assert isinstance(report, OrbaxReport)
    lines = []
    if report.ok:
        lines.append(
            f"OK {report.path}: Orbax step {report.step} finalized, {report.files} files, "
            f"{_size(report.data_bytes)}"
            + (f" (finalized steps: {', '.join(map(str, report.steps))})" if report.steps else "")
        )
    else:
        lines += [f"FAIL: {p}" for p in report.problems]
    if report.uncommitted:
        lines.append(
            f"note: never committed (an interrupted write): {', '.join(report.uncommitted)}"
        )
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def render(report: object) -> str:
    """The human summary: one line when good; the problems, one per line, when not."""
    from adaptd.client.restore.verify import Report

    assert isinstance(report, Report)
    lines = [f"note: {n}" for n in report.notes]
    if report.prefix is None:
        lines += [f"FAIL: {p.message}" for p in report.problems]
        return "\n".join(lines) + "\n"
    step = f", step {report.step}" if report.step is not None else ""
    if report.world_size > 1:
        step += f", {report.parts} of {report.world_size} rank parts"
    summary = (
        f"{report.prefix}: {report.tensors_read}/{report.tensors} tensors read, "
        f"{_size(report.data_bytes)} in {report.shards} shard(s){step} "
        f"({report.seconds:.2f}s)"
    )
    if report.ok:
        lines.append(f"OK {summary}")
    else:
        lines.append(f"FAIL {summary}")
        lines += [f"  {p.kind}: {p.message}" for p in report.problems]
    return "\n".join(lines) + "\n"
