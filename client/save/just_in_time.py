"""Just-in-time saves: when a peer of a multi-worker job dies, a survivor saves the last
completed step, so the failure costs that step, not everything since the last save.

Every surviving rank of a data-parallel job holds a full replica of the model and the
optimizer when a peer dies: the failed step's gradient all-reduce raised, so its update
was never applied (measured, TF 2.21: the weights are exactly the last completed
step's). What the failed step did move is put back or rebuilt, and where that cannot be
proved nothing is saved, with the reason (:class:`Outcome`):

* **Counters** (``optimizer.iterations`` of every Keras optimizer in the state, and the
  scalar counters named in ``step_counters=``): TensorFlow may run their increment
  before the failed collective. Each counter's value is read at the run's start and at
  every save (never per step); from two readings the hook knows how much it moves per
  step, so its value at the last completed step ``N``. A counter that reads that value,
  or that value plus one step's move, is set to it; any other value (a failure in the
  middle of an update, a counter not moved once per step) refuses the save.
* **Data positions** (:mod:`adaptd.client.save.replay`): each rank's part of ``N`` is
  a replay note: its part of the newest save of this run that it completed (or the
  fresh input of a run that started from nothing), advanced at restore by the batches
  of the steps since. The dead rank's position is rebuilt the same way, by that rank,
  when the job restarts. A rank's own state that is not a data iterator refuses the save.
* **Variables read with a collective** (``SyncOnRead``, e.g. some metrics) cannot be
  read with a peer dead: their presence refuses the save.

One survivor writes: the first to create the step's claim file (``O_EXCL``, on the
storage every rank shares) writes the replicated state (the local replica's values,
no collective: ``tf.train.Checkpoint.write`` of mirrored variables reads the local
copy), the replay notes of every rank, and names the step in the ``checkpoint`` state
file; the restore agreement then picks it when every rank restarts (the step is
complete for the job by :func:`adaptd.checkpoints.rank_parts.status`). It is written
synchronously to the job's checkpoint directory, so it is durable before the process
exits. (Two tiers, issue 24: write to the local tier first, then make it durable,
in :meth:`JustInTime._write`.)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import tensorflow as tf

from adaptd.checkpoints import rank_parts
from adaptd.client.save import files, replay
from adaptd.client.save.peer_failure import peer_failure
from adaptd.client.save.rank_state import RankPart
from adaptd.client.save.state import CheckpointState, number_of

log = logging.getLogger("adaptd.client")

__all__ = ["Counters", "JustInTime", "Outcome", "counters_of", "saved_by_another"]


@dataclass(frozen=True)
class Outcome:
    """What a peer failure led to: the last completed ``step``, whether it was
    ``saved`` (by this rank), and ``reason``: the failure and what was done, or why
    nothing was saved. ``prefix``, ``seconds`` and ``nbytes``: the save's, when saved."""

    step: int
    saved: bool
    reason: str
    failure: str = ""
    prefix: str = ""
    seconds: float = 0.0
    nbytes: int = 0


def counters_of(trackables: Mapping[str, Any], named: Collection[str]) -> dict[str, Any]:
    """The counters a step moves: each Keras optimizer's ``iterations`` and the
    trackables ``named`` (scalar integer variables).

    Raises:
        ValueError: a named trackable is not a scalar integer variable.
    """
    out: dict[str, Any] = {}
    for key, value in trackables.items():
        its = getattr(value, "iterations", None)
        if its is not None and hasattr(its, "assign") and hasattr(value, "apply_gradients"):
            out[f"{key}.iterations"] = its
    for key in named:
        var = trackables.get(key)
        dtype = getattr(var, "dtype", None)
        shape = getattr(var, "shape", None)
        if (
            var is None
            or not hasattr(var, "assign")
            or dtype is None
            or not tf.as_dtype(dtype).is_integer
            or shape is None
            or tf.TensorShape(shape).rank != 0
        ):
            raise ValueError(
                f"step_counters names {key!r}, which is not a scalar integer variable "
                f"among the state's keywords ({', '.join(sorted(trackables)) or 'none'})"
            )
        out[key] = var
    return out


class Counters:
    """Counters a step moves, read at the run's start and at each save (never per step),
    and put back to their values at a step (see the module docstring)."""

    def __init__(self, variables: Mapping[str, Any]) -> None:
        self.variables = dict(variables)
        #: ``name -> [(step, value) first read, (step, value) newest read]``.
        self.points: dict[str, list[tuple[int, int]]] = {}

    def observe(self, step: int) -> None:
        """Read every counter at ``step`` (the run's start, a save)."""
        for name, var in self.variables.items():
            value = int(var.numpy())
            pts = self.points.setdefault(name, [])
            if pts and pts[-1][0] == step:
                continue
            if len(pts) < 2:
                pts.append((step, value))
            elif step != pts[1][0]:
                pts[1] = (step, value)

    def _at(self, name: str, step: int) -> tuple[int | None, int | None, str]:
        """``(value at step, move per step, why unknown)``."""
        pts = self.points.get(name, [])
        if len(pts) == 1 and step > pts[0][0]:
            return self._inferred(name, step)
        if not pts:
            return None, None, f"counter {name} was never read"
        (n0, v0), (n1, v1) = pts[0], pts[-1]
        rate = None
        if n1 > n0:
            rate, rest = divmod(v1 - v0, n1 - n0)
            if rest or rate < 0:
                why = f"counter {name} moved {v1 - v0} in {n1 - n0} steps: not the same each step"
                return None, None, why
        if step == n1:
            return v1, rate, ""
        if rate is None:
            return None, None, f"no save in this run yet tells how far counter {name} moves a step"
        return v1 + rate * (step - n1), rate, ""

    def _inferred(self, name: str, step: int) -> tuple[int | None, int | None, str]:
        """Read once only (no save since the start): the move per step is the one
        that explains the value now, if exactly one does (the failed step moved the
        counter, or it did not)."""
        n0, v0 = self.points[name][0]
        d = step - n0
        moved = int(self.variables[name].numpy()) - v0
        rates = {r for k in (d, d + 1) if moved >= 0 and moved % k == 0 for r in [moved // k]}
        if len(rates) != 1:
            why = (f"counter {name} moved {moved} in {d} step(s) (or {d + 1} with the failed "
                   "one): no save in this run yet tells how far it moves a step")  # fmt: skip
            return None, None, why
        rate = rates.pop()
        return v0 + rate * d, rate, ""

    def put_back(self, step: int) -> str:
        """Set every counter to its value at ``step``; "" when done, else why not (and
        nothing was changed)."""
        wanted: dict[str, int] = {}
        for name, var in self.variables.items():
            value, rate, why = self._at(name, step)
            if value is None:
                return why
            now = int(var.numpy())
            if now != value and not (rate and now == value + rate):
                return (
                    f"counter {name} reads {now}; at step {step} it was {value}"
                    + (f" (or {value + rate} once the failed step moved it)" if rate else "")
                    + ": the failed step did more than move it once"
                )
            wanted[name] = value
        for name, value in wanted.items():
            var = self.variables[name]
            if int(var.numpy()) != value:
                var.assign(tf.cast(value, var.dtype))
        return ""


def _sync_on_read(checkpoint: tf.train.Checkpoint) -> str:
    for obj in tf.train.TrackableView(checkpoint).descendants():
        if type(obj).__name__.startswith("SyncOnRead"):
            name = getattr(obj, "name", type(obj).__name__)
            return f"variable {name} is read with a collective (SyncOnRead): a peer is gone"
    return ""


class JustInTime:
    """One rank's just-in-time save.

    Args:
        state: the replicated state.
        part: this rank's own part of each save.
        counters: the counters a step moves.
        directory: the job's checkpoint directory (shared by every rank).
        enabled: False (``just_in_time=False``): a peer failure saves nothing.
    """

    def __init__(
        self,
        state: CheckpointState,
        part: RankPart,
        counters: Counters,
        directory: Path,
        *,
        enabled: bool = True,
    ) -> None:
        self.state, self.part, self.counters = state, part, counters
        self.directory = Path(directory)
        self.enabled = enabled
        self.start: int | None = None
        self.saved: list[int] = []  # the steps this run saved (all ranks save the same)

    def observe(self, step: int, *, start: bool = False) -> None:
        """The run starts at ``step`` or saved it: read the counters there."""
        if start:
            self.start = step
        elif step in self.saved:
            return
        else:
            self.saved.append(step)
        self.counters.observe(step)

    def save(self, step: int, exc: BaseException | None) -> Outcome | None:
        """Save ``step`` (the last completed one) after ``exc``, if ``exc`` is a peer's
        failure (else None: nothing is done). Call after the save in flight ended.
        Never raises: what goes wrong is the outcome's reason."""
        failure = peer_failure(exc)
        if failure is None:
            return None
        try:
            outcome = self._save(step, failure)
        except Exception as err:  # the job is ending anyway: say why, never mask exc
            outcome = Outcome(step, False, f"the save failed: {type(err).__name__}: {err}", failure)
        if outcome.saved:
            log.warning(
                "a peer failed (%s): saved step %d just in time to %s in %.2fs",
                failure, step, outcome.prefix, outcome.seconds,
            )  # fmt: skip
        else:
            log.warning(
                "a peer failed (%s): no just-in-time save of step %d: %s; the restart "
                "resumes from the newest periodic save", failure, step, outcome.reason,
            )  # fmt: skip
        return outcome

    def _save(self, step: int, failure: str) -> Outcome:
        def refuse(why: str) -> Outcome:
            return Outcome(step, False, why, failure)

        if not self.enabled:
            return refuse("just-in-time saves are off (just_in_time=False)")
        if self.start is None:
            return refuse("the run had not started")
        why = replay.why_not(self.part.trackables) or _sync_on_read(self.state.checkpoint)
        if why:
            return refuse(why)
        names = rank_parts.listing(self.directory)
        why = saved_by_another(names, step)
        if why:
            return refuse(why)
        bases = {}
        for rank in range(self.part.world_size):
            base = self._base(names, step, rank)
            if base is None:
                return refuse(f"rank {rank} has no part of this run's saves to replay from")
            bases[rank] = base
        why = self.counters.put_back(step)
        if why:
            return refuse(why)
        claim = self.directory / f".adaptd-jit-{step}.claim"
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return refuse("another survivor writes it")
        os.close(fd)
        try:
            # a survivor that held the claim may have written the step and let the claim
            # go between this rank's listing and its claim: look again, now that it holds it
            names = rank_parts.listing(self.directory)
            why = saved_by_another(names, step)
            if why:
                return refuse(why)
            return self._write(step, names, bases, failure)
        finally:
            with contextlib.suppress(OSError):
                claim.unlink()

    def _base(self, names: set[str], step: int, rank: int) -> int | None:
        """The newest step of this run (its start or a save) whose part of ``rank`` is
        whole, at or before ``step`` (0 for a run that started from nothing)."""
        world = self.part.world_size
        candidates = sorted({*(s for s in self.saved if s <= step), self.start or 0}, reverse=True)
        for s in candidates:
            if s == 0 or rank_parts.written(names, s, rank, world):
                return s
        return None

    def _write(self, step: int, names: set[str], bases: dict[int, int], failure: str) -> Outcome:
        t0 = perf_counter()
        world = self.part.world_size
        done = rank_parts.status(names, step)
        for rank, base in bases.items():  # notes first: the replicated index lands last
            if rank in done.parts or base == step:
                continue
            (self.directory / rank_parts.replay_name(step, rank, world, base)).touch()
        prefix = str(self.directory / f"ckpt-{step}")
        if not done.replicated:
            self.state.before_save(step)
            # a worker other than the chief wrote with write(), never save(): its
            # checkpoint has no save_counter yet, which every restore expects to find
            _ = self.state.checkpoint.save_counter
            self.state.checkpoint.write(prefix)  # synchronous, local values, no collective
            _name_in_state_file(self.directory, prefix)
        seconds = perf_counter() - t0
        nbytes = files.checkpoint_bytes(prefix)
        said = f"saved step {step} just in time after {failure}"
        return Outcome(step, True, said, failure, prefix, seconds, nbytes)


def _name_in_state_file(directory: Path, prefix: str) -> None:
    """List ``prefix`` as the newest checkpoint in the directory's ``checkpoint`` file
    (plain TensorFlow's ``latest_checkpoint`` and the manager at restart read it)."""
    state = tf.train.get_checkpoint_state(str(directory))
    paths = list(state.all_model_checkpoint_paths) if state is not None else []
    paths = sorted({*paths, prefix}, key=number_of)  # another survivor's newer step stays last
    tf.compat.v1.train.update_checkpoint_state(
        str(directory), paths[-1], all_model_checkpoint_paths=paths
    )


def saved_by_another(names: set[str], step: int) -> str:
    """Why this survivor does not write ``step`` (empty: it may): that step or a newer
    one is already complete for the job (``names``: the directory's listing), written
    by another survivor or by the save before the failure."""
    later = [s for s in rank_parts.steps(names) if s >= step]
    done = [s for s in later if rank_parts.status(names, s).complete]
    if not done:
        return ""
    return f"step {max(done)} is already complete (another survivor or a planned save wrote it)"
