"""Two tiers in closed form: the exact steady state of "local every k steps, durable every
n-th" in the simulator's model, the yardstick its tests and the two-tier oracle use.

The simulator's model (:mod:`adaptd.sim.engine`): a local save blocks b₁, its write is
complete in the local tier L₁ after the call; a save made durable blocks b₁ + b₂, its
local write runs once the loop is free (complete b₂ + L₁ after the call) and its
durable write is complete b₁ + L₂ after it; the writes slow compute by s₁ and s₂ (so a
local save costs δ₁ and a durable one δ₁ + δ₂, exactly). Failures are exponential, of
rate λ_p (process: restart in place from the newest local save, in R₁, or from durable
storage in R₂ when the local tier holds nothing newer) and λ_h (host: the local tier is
lost, restart from the newest durable save in R₂); each restart is followed by the
warm-up w and one interval of compute before the next save call. No failure is covered
just in time (``peer_share`` 0: a covered failure would leave a checkpoint at an
arbitrary step, which no finite set of states describes).

When every write is complete before the next save call (the conditions
:func:`steady_state` checks), a save call is a renewal point given where it sits after
the newest durable save D: its position j (it saves D + jk steps) and whether the local
tier holds save j − 1. So is the moment a durable save completes, the cycle this module
measures: from it, the states are the save calls C(j), the calls of save 1 with an
empty local tier (after a restart from durable storage), and the restarts P(m) (from
local save m) and H (from D). Each has a deterministic length ℓ and, within it,
intervals where a process and a host failure lead to given states; with X ~ Exp(λ)
the expected time V(s) to the end of the cycle satisfies

    V(s) = E[min(X, ℓ)] + P(X ≥ ℓ)·V(next) + Σ_I P(X ∈ I)·(λ_p V(p_I) + λ_h V(h_I))/λ,

one linear equation per state; the position at which the cycle ends (its kept work in
intervals) satisfies the same equations with the position as reward. A durable save
whose copy a process failure lost after its local copy was complete is followed by
another (position k + 1, k + 2 …): the chain is cut at k + 40 positions, where the
chance of getting there is below 1e-40 in any case this serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from adaptd.sim.inflight import Write, Writes
from adaptd.sim.scenario import Scenario

__all__ = [
    "TierCycle",
    "covers",
    "expected_wall_s",
    "steady_state",
    "steady_wall_s",
]

#: Positions past the k-th kept in the chain of lost durable copies.
DEPTH = 40


@dataclass(frozen=True)
class TierCycle:
    """One cycle between two durable saves completing, in steady state: its expected
    wall time and the compute it keeps (both in seconds)."""

    wall_s: float
    kept_s: float
    first_wall_s: float = 0.0  # the run's first cycle, from its start (step 0, no restart)
    first_kept_s: float = 0.0

    @property
    def goodput(self) -> float:
        return self.kept_s / self.wall_s


def covers(s: Scenario) -> bool:
    """Whether the closed form applies: a local tier, exponential failures, no storage
    phases, no trace, no just-in-time saves."""
    return (
        s.local is not None
        and s.distribution == "exponential"
        and not s.phases
        and s.trace is None
        and s.peer_share == 0
    )


def steady_state(s: Scenario, every_steps: int, durable_every: int) -> TierCycle:
    """The exact steady-state cycle of saving every ``every_steps`` steps to the local
    tier and making every ``durable_every``-th save durable.

    Raises :class:`ValueError` when the closed form does not apply (see :func:`covers`),
    for intervals < 1, or when a write outlasts the interval (the next save would wait
    for it): L₁ ≤ τ + δ₁, b₂ + L₁ ≤ τ + δ₁ + δ₂ and b₁ + L₂ ≤ τ + δ₁ + δ₂ are needed.
    """
    if not covers(s):
        raise ValueError(
            f"scenario {s.name!r}: the two-tier closed form needs a local tier, exponential "
            "failures, no storage phases, no failure trace and no just-in-time saves"
        )
    if every_steps < 1 or durable_every < 1:
        raise ValueError(
            f"every_steps and durable_every must be >= 1, got {every_steps}, {durable_every}"
        )
    local = s.local
    assert local is not None
    k, tau = durable_every, every_steps * s.step_time_s
    d1, d2 = local.save_cost_s, s.save_cost_s
    t1, t2 = tau + d1, tau + d1 + d2  # wall time of a local and of a durable save's segment
    a1 = local.latency_s  # the local copy complete, in a local save's segment
    c1, c2 = s.blocking_s + local.latency_s, local.blocking_s + s.latency_s  # in a durable one
    if a1 > t1 or c1 > t2 or c2 > t2:
        raise ValueError(
            f"scenario {s.name!r}: a write outlasts an interval of {every_steps} steps "
            f"(local copy {a1:g} s after a {t1:g} s segment, or {c1:g} s / durable {c2:g} s "
            f"after a {t2:g} s one); the closed form needs every write complete before the "
            "next save"
        )
    mtbf = s.job_mtbf_s
    lam = 1.0 / mtbf
    lp, lh = s.process_share * lam, (1.0 - s.process_share) * lam
    window = s.warmup_s + tau
    top = max(k, 1) + DEPTH
    # states: 0 = S0 (the rest of the durable save's segment), 1 = H, 2 = C(1) with an
    # empty local tier, then C(j) for j = 1 … top, then P(m) for m = 0 … top − 1, and
    # last the run's start (a warm-up and an interval from step 0, durable, to C(1))
    n = 4 + top + top
    c = lambda j: 2 + j  # noqa: E731 - index of C(j), j >= 1
    pm = lambda m: 3 + top + m  # noqa: E731 - index of P(m), m >= 0
    start = n - 1
    a = np.zeros((n, n))
    time = np.zeros(n)
    reward = np.zeros(n)

    def segment(
        i: int, length: float, nxt: int | None, parts: list[tuple[float, float, int]], pos=0
    ) -> None:
        """State i runs ``length`` seconds, then goes to ``nxt`` (None: the cycle ends,
        at position ``pos``); a failure in [lo, hi) of ``parts`` goes to the given state
        if of the process class, to H if of the host class."""
        time[i] = -math.expm1(-lam * length) / lam
        survive = math.exp(-lam * length)
        if nxt is None:
            reward[i] = survive * pos
        else:
            a[i, nxt] += survive
        for lo, hi, process in parts:
            hit = math.exp(-lam * lo) - math.exp(-lam * hi)
            a[i, process] += hit * lp / lam
            a[i, 1] += hit * lh / lam

    def restart(i: int, restore: float, nxt: int) -> None:
        """A restart and one interval to the next save call; a failure starts it again
        (a host failure as a restart from durable storage)."""
        segment(i, restore + window, nxt, [(0.0, restore + window, i)])

    restart(1, s.restore_s, 2)
    segment(start, window, 2, [(0.0, window, 1)])
    for m in range(top):
        restart(pm(m), local.restore_s, c(min(m + 1, top)))
    # S0: the durable save's segment from its durable copy on; the local one may follow
    rest = t2 - c2
    edge = min(max(c1 - c2, 0.0), rest)
    segment(0, rest, c(1), [(0.0, edge, 1), (edge, rest, pm(0))])
    for j in range(1, top + 1):
        for empty in (False, True) if j == 1 else (False,):
            i = 2 if empty else c(j)
            before = 1 if (empty and j == 1) else pm(j - 1)  # no local copy of j - 1
            if j < k:  # a local save
                segment(i, t1, c(j + 1), [(0.0, a1, before), (a1, t1, pm(j))])
            else:  # a durable save: the cycle ends when its copy is durable
                mid = min(c1, c2)
                after = pm(min(j, top - 1))
                segment(i, c2, None, [(0.0, mid, before), (mid, c2, after)], pos=j)
    m = np.eye(n) - a
    wall = np.linalg.solve(m, time)
    kept = np.linalg.solve(m, reward)
    return TierCycle(
        wall_s=float(wall[0]),
        kept_s=float(kept[0]) * tau,
        first_wall_s=float(wall[start]),
        first_kept_s=float(kept[start]) * tau,
    )


def steady_wall_s(s: Scenario, every_steps: int, durable_every: int) -> float:
    """A run's wall time from the steady state: its first cycle exactly, the rest of its
    work at the steady goodput. Off :func:`expected_wall_s` by the end of the run (no
    save at the end, no wait for the last write): tens of seconds. Raises as
    :func:`steady_state`."""
    cycle = steady_state(s, every_steps, durable_every)
    rest = s.steps * s.step_time_s - cycle.first_kept_s
    return cycle.first_wall_s + rest / cycle.goodput


def expected_wall_s(s: Scenario, every_steps: int, durable_every: int) -> float:
    """The exact expected wall time of a whole run of ``s``, start and end included.

    The same equations as :func:`steady_state`'s, with each save call's position in the
    run (saves at every multiple of ``every_steps`` below the run's steps, none at the
    end) and its newest durable save D: the states of one D lead only to those of a
    later D once a durable copy completes, and after the last save the job computes to
    the end, which stops the clock whatever writes are in flight. A sparse system of
    about (saves) × 2(``durable_every`` + 12) states. Raises as :func:`steady_state`,
    and for a run with no save at all.
    """
    steady_state(s, every_steps, durable_every)  # the checks
    from scipy.sparse import coo_matrix, identity
    from scipy.sparse.linalg import spsolve

    local = s.local
    assert local is not None
    k, st = durable_every, s.step_time_s
    tau = every_steps * st
    last = math.ceil(s.steps / every_steps) - 1  # saves of a run without failures
    if last < 1:
        raise ValueError(f"a run of {s.steps} steps saving every {every_steps} saves nothing")
    rho = (s.steps - last * every_steps) * st  # compute after the last save
    lam = 1.0 / s.job_mtbf_s
    lp, lh = s.process_share * lam, (1.0 - s.process_share) * lam
    depth = k + 12  # positions after D kept: past k, a chain of lost durable copies
    width = 2 * depth + 2  # per D: C(D+1 … D+depth), C(D+1) empty, P(D … D+depth-1), H
    n = (last + 1) * width + 1
    start = n - 1
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    time = np.zeros(n)

    def c(i: int, d: int) -> int:
        return d * width + (i - d - 1)

    def empty(d: int) -> int:
        return d * width + depth

    def p(m: int, d: int) -> int:
        return d * width + depth + 1 + min(m - d, depth - 1)

    def h(d: int) -> int:
        return d * width + 2 * depth + 1

    def nxt(i: int, d: int) -> int | None:
        """The call of save i with base d, None past the last save (the run ends)."""
        if i > last:
            return None
        return c(min(i, d + depth), d)

    def segment(i, length, to, parts) -> None:  # type: ignore[no-untyped-def]
        time[i] = -math.expm1(-lam * length) / lam
        if to is not None:
            rows.append(i), cols.append(to), vals.append(math.exp(-lam * length))
        for lo, hi, process, host in parts:
            hi = min(hi, length)
            if hi <= lo:
                continue
            hit = math.exp(-lam * lo) - math.exp(-lam * hi)
            rows.extend((i, i)), cols.extend((process, host))
            vals.extend((hit * lp / lam, hit * lh / lam))

    def compute(m: int) -> float:
        return tau if m < last else rho

    def finish(blocking: float, writes: list[Write]) -> float:
        """Wall time from a save call to the run's end: the blocking, then ρ of compute
        slowed by the writes (the engine's own arithmetic)."""
        w = Writes()
        for item in writes:
            w.add(item)
        return w.time_to(blocking, rho / st, st)

    t1, t2 = tau + local.save_cost_s, tau + local.save_cost_s + s.save_cost_s
    a1 = local.latency_s
    c1, c2 = s.blocking_s + local.latency_s, local.blocking_s + s.latency_s
    mid = min(c1, c2)
    for d in range(last + 1):
        back = None if d + 1 > last else empty(d)
        segment(h(d), s.restore_s + s.warmup_s + compute(d), back, [(0.0, math.inf, h(d), h(d))])
        for m in range(d, min(d + depth, last + 1)):
            win = local.restore_s + s.warmup_s + compute(m)
            segment(p(m, d), win, nxt(m + 1, d), [(0.0, math.inf, p(m, d), h(d))])
        for i in range(d + 1, min(d + depth, last) + 1):
            for lacking in (False, True) if i == d + 1 else (False,):
                row = empty(d) if lacking else c(i, d)
                before = h(d) if lacking else p(i - 1, d)
                if i - d < k:  # a local save
                    length = (
                        t1
                        if i < last
                        else finish(
                            local.blocking_s, [Write("local", 0, a1, local.slowdown, 0.0, 0.0)]
                        )
                    )
                    segment(row, length, nxt(i + 1, d),
                            [(0.0, a1, before, h(d)), (a1, math.inf, p(i, d), h(d))])  # fmt: skip
                    continue
                length = t2 if i < last else finish(
                    local.blocking_s + s.blocking_s,
                    [Write("local", 0, c1, local.slowdown, 0.0, 0.0),
                     Write("durable", 0, c2, s.slowdown, 0.0, 0.0)],
                )  # fmt: skip
                after = p(i, i) if i <= last else h(i)
                parts = [(0.0, mid, before, h(d)), (mid, c2, p(i, d), h(d))]
                if c2 < c1:
                    parts += [(c2, c1, h(i), h(i)), (c1, math.inf, after, h(i))]
                else:
                    parts.append((c2, math.inf, after, h(i)))
                segment(row, length, nxt(i + 1, i), parts)
    segment(start, s.warmup_s + compute(0), empty(0), [(0.0, math.inf, h(0), h(0))])
    a = coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsc()
    values = spsolve(identity(n, format="csc") - a, time)
    return float(values[start])
