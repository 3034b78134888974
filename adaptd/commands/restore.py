"""``adaptd restore --from URL --to DIR``: fetch a verified checkpoint from a durable destination.

For an operator moving a job to a new host, or taking a copy of a run: the newest
step at ``URL`` (a job's folder there, e.g. ``s3://bucket/ckpts/my-job``) whose every
file matches its manifest, or ``--step N``, lands in ``DIR`` with TensorFlow's
``checkpoint`` state file written last, so ``tf.train.latest_checkpoint(DIR)`` and
the hook's ``restore_or_initialize()`` find it. Exit 0 when restored, 1 when the
destination holds nothing usable (the reasons are printed), 2 for a usage problem
(including a ``DIR`` that already holds checkpoints, unless ``--force``). The work is
in :mod:`adaptd.tiers.restore`; TensorFlow is never imported.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from adaptd.commands import UsageError

HELP = "fetch and verify a checkpoint from a durable destination (NFS path, s3://...)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        required=True,
        help="the job's folder at the destination: a path, file://..., s3://bucket/prefix/JOB",
    )
    parser.add_argument(
        "--to", dest="target", metavar="DIR", required=True, help="the local checkpoint directory"
    )
    parser.add_argument(
        "--step", type=int, metavar="N", help="this step, not the newest (no fallback)"
    )
    parser.add_argument(
        "--storage-option",
        dest="storage_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec option, repeatable (endpoint_url=http://minio:9000; "
        "client_kwargs.region_name=eu-west-1; JSON values such as true or 3 are parsed)",
    )
    parser.add_argument(
        "--force", action="store_true", help="restore into a directory that has checkpoints"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def parse_storage_options(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as a (nested, for dotted keys) fsspec options mapping.

    A value that parses as JSON (``3``, ``true``, ``{"a": 1}``) is that value, any
    other is a string.

    Raises:
        UsageError: an item has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or any(not k for k in key.strip().split(".")):
            raise UsageError(f"--storage-option wants KEY=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        *parents, leaf = key.strip().split(".")
        for k in parents:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise UsageError(f"--storage-option {item!r}: {k!r} is already set to a value")
        node[leaf] = value
    return out


def run(args: argparse.Namespace) -> int:
    from adaptd.client.restore.remote import has_checkpoint
    from adaptd.tiers.replica import TierError
    from adaptd.tiers.restore import restore

    options = parse_storage_options(args.storage_options)
    if args.step is not None and args.step < 0:
        raise UsageError(f"--step must be >= 0, got {args.step}")
    target = Path(args.target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"--to {target}: exists and is not a directory")
    if has_checkpoint(target) and not args.force:
        raise UsageError(
            f"--to {target} already holds checkpoints; restore into an empty directory, "
            "or pass --force to add the fetched one beside them (the state file will name it)"
        )
    # the skipped steps are printed below (or in the JSON), not also as log warnings
    tiers_log = logging.getLogger("adaptd.tiers")
    if not tiers_log.handlers:
        tiers_log.addHandler(logging.NullHandler())
    ui = _Progress(enabled=not args.json and sys.stderr.isatty())
    try:
        with ui:
            result = restore(
                args.source,
                target,
                storage_options=options,
                step=args.step,
                progress=ui.advance,
                on_step=ui.start,
            )
    except TierError as exc:
        return _fail(args, f"{exc}", access=isinstance(exc.__cause__, Exception))
    except OSError as exc:
        why = f"{args.source}: could not read it ({type(exc).__name__}: {exc})"
        return _fail(args, why, access=True)
    except Exception as exc:  # s3/network clients raise their own types
        from adaptd.tiers.replica import is_storage_error

        if not is_storage_error(exc):
            raise
        why = f"{args.source}: could not read it ({type(exc).__name__}: {exc})"
        return _fail(args, why, access=True)
    if args.json:
        doc = {
            "ok": True,
            "from": args.source,
            "to": str(target),
            "step": result.step,
            "bytes": result.bytes,
            "files": result.files,
            "seconds": round(result.seconds, 3),
            "skipped": [{"step": s, "reason": why} for s, why in result.skipped],
        }
        print(json.dumps(doc, indent=2))
        return 0
    for s, why in result.skipped:
        print(f"skipped step {s}: {why}", file=sys.stderr)
    print(
        f"restored step {result.step} from {args.source} into {target}: "
        f"{result.files} files, {result.bytes / 1e6:.1f} MB in {result.seconds:.2f}s, verified"
    )
    return 0


def _fail(args: argparse.Namespace, message: str, *, access: bool) -> int:
    """Print the failure (one line, plus what to check when the destination could not
    be read at all) or its JSON; exit status 1."""
    if args.json:
        print(json.dumps({"ok": False, "from": args.source, "error": message}, indent=2))
        return 1
    print(f"adaptd restore: {message}", file=sys.stderr)
    if access:
        print(
            "  check the URL (a job's folder: <destination>/<job>), the credentials "
            "(AWS_* variables) and the --storage-option values (endpoint_url=...)",
            file=sys.stderr,
        )
    return 1


class _Progress:
    """A rich progress bar on stderr for a terminal; nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.bar: Any = None
        self.task: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                TransferSpeedColumn(), console=Console(stderr=True), transient=True,
            )  # fmt: skip

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def start(self, manifest: Any) -> None:
        if self.bar is None:
            return
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(
            f"step {manifest.step}: fetching and verifying", total=manifest.bytes
        )

    def advance(self, n: int) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=n)
