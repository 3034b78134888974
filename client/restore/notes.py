"""What the hook tells the user about the resume, whatever their logging set-up.

A restarted job that says nothing leaves its user guessing whether the restart
worked. So every run says once where it continues from: the step, the checkpoint,
how long the restore took and from which tier it came, or that there was nothing
to resume from. :func:`say` puts that line on the ``adaptd.client`` logger when the
program logs at INFO (their format, their handlers), else straight on stderr, so
an unconfigured program (Python's default: warnings only) shows it too.

:func:`not_restored` is the error of a training loop that starts without asking:
``step()`` before ``restore_or_initialize()`` would train from step 0 and save over
the newest checkpoints.
"""

from __future__ import annotations

import logging
import os
import sys

from adaptd.tables import number

__all__ = [
    "DESTINATION",
    "DURABLE",
    "LOCAL",
    "STAGING",
    "fresh",
    "not_restored",
    "resumed",
    "say",
    "tier",
]

log = logging.getLogger("adaptd.client")

#: The tiers a checkpoint is restored from. Without ``restore_from`` the checkpoint
#: directory is the job's only (durable) copy; with one, the directory is local
#: staging that the daemon replicates to that destination (docs/tiers.md).
DURABLE = "durable"
STAGING = "local staging"
DESTINATION = "restore_from destination"
LOCAL = "local"  # the job's local tier (two tiers): a restart in place


def tier(restore_from: str | None, pulled: bool) -> str:
    """The tier a restored checkpoint came from."""
    if pulled:
        return DESTINATION
    return STAGING if restore_from else DURABLE


def _place(where: str) -> str:
    """A local path made absolute (a relative ``ckpts/`` says little in a log); a URL as it is."""
    return where if "://" in where else os.path.abspath(where)


def _who(rank: int, world_size: int) -> str:
    return f"rank {rank}/{world_size} " if world_size > 1 else ""


def resumed(
    *,
    rank: int = 0,
    world_size: int = 1,
    step: int,
    checkpoint: str,
    seconds: float,
    tier: str,
    where: str,
    agreed: bool = False,
) -> str:
    """``resumed from step 40 (ckpt-40, 2.1 s, durable tier: /ckpts/J)``, led by
    ``rank R/N`` in a job of several ranks.

    ``where``: the directory (or, from a destination, its URL); ``agreed``: the step the
    job's ranks agreed on."""
    name = os.path.basename(checkpoint.rstrip("/")) or checkpoint
    text = (
        f"{_who(rank, world_size)}resumed from step {step} "
        f"({name}, {number(seconds, ' s', digits=2)}, {tier} tier: {_place(where)})"
    )
    return text + (f"; the step the job's {world_size} ranks agreed on" if agreed else "")


def fresh(
    *,
    rank: int = 0,
    world_size: int = 1,
    directory: str,
    restore_from: str | None = None,
    why: str = "",
) -> str:
    """``starting at step 0: no checkpoint to resume from in DIR [nor at URL (why)]``."""
    text = f"{_who(rank, world_size)}starting at step 0: no checkpoint to resume from in "
    text += _place(directory)
    if restore_from:
        text += f" nor at {_place(restore_from)}" + (f" ({why})" if why else "")
    return text


def say(text: str) -> None:
    """One line for the user: on the ``adaptd.client`` logger when it shows INFO
    somewhere, else on stderr (prefixed ``adaptd:``), never both."""
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info("%s", text)
    else:
        print(f"adaptd: {text}", file=sys.stderr, flush=True)


def not_restored(call: str, directory: os.PathLike[str] | str) -> RuntimeError:
    """The error of ``call`` (``step()``, ``save()``) made before ``restore_or_initialize()``."""
    return RuntimeError(
        f"{call} before restore_or_initialize(): call ckptr.restore_or_initialize() once "
        f"before the training loop and start the loop at the step it returns (it restores "
        f"the newest checkpoint in {directory}, or returns 0 when there is none); without "
        "it the run would train from step 0 and save over the newest checkpoints"
    )
