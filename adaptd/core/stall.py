"""When a job of several ranks counts as stalled (hung): the threshold of silence past
which the deciding daemon frees the survivors, as a decision with its reason.

A rank that hangs while its process lives (a GPU or driver hang, a deadlock inside a
step, a stuck input pipeline) holds every other rank in its next collective until the
collective timeout (the hook's 120 s, :mod:`adaptd.client.save.collective_timeout`).
The daemon sees every rank's step reports, so it can tell much sooner that no rank
has completed a step for longer than the job's step times make credible.

The threshold weighs two costs, both in GPU-seconds: waiting on a hung job costs its
GPUs every second; aborting a healthy one costs its GPUs a restart and the work since
its last save. Declaring at ``T`` is worth a false-abort chance ``p`` as long as
``p · GPUs · (R + W)`` stays below what one more step's wait costs a hung job,
``GPUs · μ``: so ``p = μ / (R + W)`` (kept within :data:`P_MIN`..:data:`P_MAX`). The
step-time model bounds the chance of a healthy wait longer than ``T`` with Cantelli's
inequality, ``P(X ≥ μ + k·s) ≤ 1 / (1 + k²)``, with ``μ`` the steady step time and
``s`` the spread seen (the longest healthy wait of this incarnation less ``μ``: every
evaluation, slow batch or input stall the job came through), so
``T = μ + s·√(1/p − 1)``, then held between the job's floor and cap.

Nothing is judged while something the daemon knows of legitimately holds the ranks:
an agreement round, a save's blocking part, the first :data:`WARMUP_STEPS` steps of an
incarnation (tracing, compiling), an operator's pause. Pure: no clock, no I/O; the
daemon's watch (:mod:`adaptd.daemon.jobs.stall_watch`) gathers the facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CAP_S",
    "DEFAULT_FLOOR_S",
    "P_MAX",
    "P_MIN",
    "WARMUP_STEPS",
    "RankFact",
    "StallFacts",
    "StallLimits",
    "StallVerdict",
    "check_limits",
    "decide",
]

#: The shortest threshold by default: a job whose steps take milliseconds is still given
#: this long (a busy host's jitter, a first slow batch), and its survivors are still
#: saved within 10 s of a hang: the silence is seen through beats and reports a second
#: apart, judged at the daemon's tick (a second), then the just-in-time save runs.
DEFAULT_FLOOR_S = 7.0
#: The longest by default: well under the hook's 120 s collective timeout's tenfold
#: waste on a 16k-GPU job, and above any evaluation a step-time model has not seen.
DEFAULT_CAP_S = 300.0
#: Steps of an incarnation never judged: its first ones trace and compile.
WARMUP_STEPS = 2
#: The bounds of the tolerated false-abort chance (see the module docstring).
P_MIN = 1e-6
P_MAX = 1e-2


def check_limits(floor_s: object, cap_s: object, *, names: tuple[str, str]) -> None:
    """Refuse a floor or cap that is not a positive finite duration, or a cap below the
    floor. ``names``: how the caller calls them (a config key, a hook option).

    Raises:
        ValueError: naming the setting, the value and what to do.
    """
    for name, value in zip(names, (floor_s, cap_s), strict=True):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type]
            raise ValueError(
                f"{name} = {value!r}: must be a positive number of seconds (a hang "
                "detection limit; see docs/multiworker.md)"
            )
    if cap_s < floor_s:  # type: ignore[operator]
        raise ValueError(
            f"{names[1]} = {cap_s!r} is below {names[0]} = {floor_s!r}: the cap of the hang "
            "detection threshold must be at least its floor"
        )


@dataclass(frozen=True)
class StallLimits:
    """A job's settings of the watch: ``floor_s`` and ``cap_s`` bound the threshold;
    ``enabled=False`` turns the watch off (the collective timeout alone is left).

    Raises:
        ValueError: a limit that is not a positive duration, or a cap below the floor.
    """

    floor_s: float = DEFAULT_FLOOR_S
    cap_s: float = DEFAULT_CAP_S
    enabled: bool = True

    def __post_init__(self) -> None:
        check_limits(self.floor_s, self.cap_s, names=("stall_floor_s", "stall_cap_s"))


@dataclass(frozen=True, kw_only=True)
class StallFacts:
    """What the daemon knows of a job at one moment.

    ``silent_s``: seconds since a rank last reported a newer step; ``steps_done``: steps
    completed in this incarnation; ``step_s``: the steady step time (None: not known);
    ``longest_s``: the longest healthy wait between two completed steps seen in this
    incarnation after its first steps; ``gpus``: the job's; ``restart_s``: its restart
    and restore time (None: not measured); ``unsaved_s``: the work since its last save;
    ``holding``: what legitimately holds its ranks now ("": nothing).
    """

    silent_s: float
    steps_done: int
    step_s: float | None
    longest_s: float = 0.0
    gpus: int = 1
    restart_s: float | None = None
    unsaved_s: float = 0.0
    holding: str = ""


@dataclass(frozen=True)
class RankFact:
    """What a rank's own daemon sees wrong with it, told to the daemons of the job's
    other hosts (the deciding one names the culprit with it): rank ``rank`` of ``job``
    runs on ``host``, and ``state`` says why it may be the cause of a stall ("its
    process (pid 4242) is stopped (T)", "its heartbeat stopped", "its GPU 3 reported
    XID 79"). Only ranks in trouble have a fact.

    Raises:
        ValueError: an empty job, host or state, or a negative rank.
    """

    job: str
    rank: int
    host: str
    state: str

    def __post_init__(self) -> None:
        if not (self.job and self.host and self.state):
            raise ValueError(f"a rank fact needs a job, a host and a state: {self!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"a rank fact's rank must be an integer >= 0: {self.rank!r}")


@dataclass(frozen=True)
class StallVerdict:
    """The threshold (None: the job is not judged now), whether ``silent_s`` passed it,
    and why."""

    threshold_s: float | None
    stalled: bool
    reason: str


def threshold(facts: StallFacts, limits: StallLimits) -> tuple[float, str]:
    """The threshold for ``facts`` and how it was reached."""
    mu = facts.step_s
    if mu is None or mu <= 0:
        return limits.cap_s, "no step time learned yet: the cap"
    lost = (facts.restart_s or 0.0) + facts.unsaved_s
    p = P_MAX if lost <= 0 else min(P_MAX, max(P_MIN, mu / lost))
    spread = max(facts.longest_s - mu, mu)
    k = math.sqrt(1.0 / p - 1.0)
    model = mu + spread * k
    t = min(limits.cap_s, max(limits.floor_s, model))
    bound = "floor" if t == limits.floor_s and model < t else "cap" if t < model else "model"
    g = facts.gpus
    why = (
        f"waiting costs {g} GPU-s/s, a false abort {g * lost:.4g} GPU-s (restart "
        f"{facts.restart_s or 0.0:.3g}s + {facts.unsaved_s:.3g}s unsaved): false-abort "
        f"chance ≤ {p:.2g}; step {mu:.3g}s, longest wait {facts.longest_s:.3g}s -> "
        f"{model:.3g}s, {bound} {t:.3g}s"
    )
    return t, why


def decide(facts: StallFacts, limits: StallLimits) -> StallVerdict:
    """Whether the job is stalled now, with the threshold and the reason."""
    if not limits.enabled:
        return StallVerdict(None, False, "hang detection is off for this job")
    if facts.holding:
        return StallVerdict(None, False, f"not judged: {facts.holding}")
    if facts.steps_done < WARMUP_STEPS:
        return StallVerdict(
            None, False, f"not judged: the incarnation's first {WARMUP_STEPS} steps (compiling)"
        )
    t, why = threshold(facts, limits)
    if facts.silent_s > t:
        return StallVerdict(t, True, f"no step for {facts.silent_s:.3g}s > {t:.3g}s ({why})")
    return StallVerdict(t, False, why)
