"""Ask the daemon for the job's configured settings before the run restores.

An operator may give a job its local tier (docs/tiers.md) in the daemon's config
(``[jobs."ID"] local_tier``) instead of in its training script. The hook needs it
before ``restore_or_initialize()`` (a restart in place restores from it) and before
its Hello, which carries what the restore found; so, when the hook has no local tier
of its own, :func:`ask` sends :class:`~adaptd.protocol.job.AskConfig` on the link
made at construction and waits a bounded time for the daemon's
:class:`~adaptd.protocol.job.JobConfig`.

No daemon: no answer, and the hook runs as configured in its script. A socket file
that is not there is not waited for; a daemon that does not answer within
:data:`~adaptd.client.daemon.session.WELCOME_WAIT_S` (or ``daemon_timeout``, if
shorter) is not waited for longer. A daemon older than the question refuses it
(an :class:`~adaptd.protocol.job.Error`): the answer is None at once.
"""

from __future__ import annotations

import logging
import os
from time import perf_counter

from adaptd.client.daemon.link import DaemonLink
from adaptd.client.daemon.session import WELCOME_WAIT_S
from adaptd.protocol import job as protocol

__all__ = ["ask"]

log = logging.getLogger("adaptd.client")

#: While the connection is still being made a send is refused: tried again this often.
_RETRY_S = 0.02


def ask(link: DaemonLink, job: str, rank: int) -> protocol.JobConfig | None:
    """The daemon's settings for ``job`` (None: no daemon answered, or an older one
    that does not know the question). Never raises."""
    endpoint = link.endpoint
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://") :]):
        return None
    question = protocol.AskConfig(v=protocol.VERSION, job=job, rank=rank)
    start = perf_counter()
    deadline = start + min(link.timeout_s, WELCOME_WAIT_S)
    sent = False
    while True:
        now = perf_counter()
        if not sent:
            sent = link.send(question, now)
        if now >= deadline:
            log.info("no answer from the daemon at %s to the job's settings within %.1f s: "
                     "the hook's own settings only", endpoint, deadline - start)  # fmt: skip
            return None
        if not link.poll(deadline - now if sent else min(deadline - now, _RETRY_S)):
            continue
        for msg in link.receive(perf_counter()):
            if isinstance(msg, protocol.JobConfig) and msg.job == job:
                return msg
            if isinstance(msg, protocol.Error):
                log.info("the daemon at %s does not say the job's settings (%s): the "
                         "hook's own settings only", endpoint, msg.message)  # fmt: skip
                return None
