"""The framework-neutral hook core, and what a framework's adapter provides to it.

adaptd's decisions (the daemon's plan, the embedded policies while no daemon answers,
operator requests, what a save really cost) need no deep-learning framework. The
modules that hold them are the **core**: every module of ``adaptd.client`` except
:data:`TENSORFLOW_SIDE` (the TensorFlow hook) and :data:`ORBAX_SIDE` (the Orbax
adapter, :mod:`adaptd.client.orbax`). ``tests/client/test_core_neutral.py`` imports each
core module in a process where TensorFlow (and JAX) cannot be imported, so a
core module that starts importing either fails the suite; a new module belongs to the
core unless it is named here.

A framework plugs in at one of two seams:

* **the framework asks** (Orbax's ``SaveDecisionPolicy``, Keras-style callbacks): it
  calls in at each step and saves when told to; the core follows the plan for it
  (:class:`adaptd.client.follower.Follower`) and the adapter tells it what the
  framework did with each save;
* **the hook drives** (the TensorFlow hook, :class:`adaptd.client.AdaptiveCheckpointer`):
  the hook counts the steps and starts each save itself.

Either way the framework provides what :class:`FrameworkAdapter` lists; docs/client.md
("Writing an adapter for another framework") is the page an adapter is written from.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ORBAX_SIDE", "TENSORFLOW_SIDE", "FrameworkAdapter"]

#: The TensorFlow hook's modules: those that import TensorFlow (at the top, or in the
#: function that first needs it), and those that import one of them.
TENSORFLOW_SIDE = frozenset(
    {
        "adaptd.client.arguments",
        "adaptd.client.assembly",
        "adaptd.client.callback",
        "adaptd.client.checkpointer",
        "adaptd.client.demo_job",
        "adaptd.client.hook_views",
        "adaptd.client.options",
        "adaptd.client.tensorflow_adapter",
        "adaptd.client.agreement.coordination",
        "adaptd.client.restore.intact",
        "adaptd.client.restore.resume",
        "adaptd.client.restore.tiers",
        "adaptd.client.restore.verify",
        "adaptd.client.save.async_fixes",
        "adaptd.client.save.async_writes",
        "adaptd.client.save.collective_timeout",
        "adaptd.client.save.distributed_input",
        "adaptd.client.save.just_in_time",
        "adaptd.client.save.local_tier",
        "adaptd.client.save.peer_failure",
        "adaptd.client.save.per_rank",
        "adaptd.client.save.rank_state",
        "adaptd.client.save.replay",
        "adaptd.client.save.saver",
        "adaptd.client.save.saves",
        "adaptd.client.save.state",
        "adaptd.client.save.targets",
    }
)

#: The Orbax adapter's modules (they import JAX and Orbax; never TensorFlow).
ORBAX_SIDE = frozenset(
    {
        "adaptd.client.orbax",
        "adaptd.client.orbax.adapter",
        "adaptd.client.orbax.agreement",
        "adaptd.client.orbax.checkpoints",
        "adaptd.client.orbax.policy",
    }
)


@runtime_checkable
class FrameworkAdapter(Protocol):
    """What a framework provides to the core, beyond the calls that tell the core
    what it did (:class:`~adaptd.client.follower.Follower`'s ``boundary`` with the step
    counter, ``save_started``/``save_returned``/``save_finished`` with when a save
    blocked and when it became durable).

    Attributes:
        framework: its name in log lines and messages (``"orbax"``, ``"tensorflow"``).
    """

    framework: str

    def accelerators(self) -> int:
        """The GPUs this process trains on (0: none; told to the daemon in Hello)."""
        ...

    def finalized(self, step: int) -> int | None:
        """Bytes the save of ``step`` wrote, once that save is durable (the framework's
        commit is done: Orbax's finalized step directory, TensorFlow's checkpoint
        state file naming it); None while it is not (yet)."""
        ...

    def newest_durable(self) -> int | None:
        """The newest step whose save is durable (what a restart resumes from); None:
        there is none. The restore itself stays the framework's."""
        ...

    def peer_failure(self, exc: BaseException) -> str | None:
        """What ``exc`` says if it is how a failed peer process shows in this framework
        (a lost collective); None for any other error."""
        ...
