"""Simulator scenarios: a TOML file (or a built-in name) describing a training run.

The format is a contract (``adaptd simulate --scenario``)::

    name = "my-run"                 # optional; default: the file name
    description = "..."             # optional
    [job]
    steps = 500000                  # training steps to complete
    step_time_s = 1.2
    first_step_s = 120.0            # optional: each incarnation's first step (a compile);
                                    # >= step_time_s, default step_time_s
    gpus = 128
    [checkpoint]
    blocking_s = 0.8                # the loop is blocked this long per save
    latency_s = 5.0                 # save call -> durable (>= blocking_s; default blocking_s)
    slowdown = 0.05                 # fraction of step time lost while a write is in flight
    restore_s = 120                 # restart and restore after a failure
    [checkpoint.local]              # optional: a local tier (issue 24), the same four keys
    blocking_s = 0.3                #   (latency_s >= blocking_s; restore_s: restart in
    latency_s = 2.0                 #   place from it; both slowdowns add up to < 1)
    slowdown = 0.01
    restore_s = 120
    [failures]
    distribution = "exponential"    # or "weibull"
    mtbf_gpu_hours = 50000          # per GPU; the job's mean = this / gpus
    weibull_shape = 0.7             # for "weibull"
    trace = [3600.0, 7200.5]        # optional: these failure times (s), instead of random ones
    process_share = 0.8             # optional: share of failures the host survives (issue 24)
    peer_share = 0.9                # optional: share after which a survivor holds a complete
                                    # replica and saves just in time (issue 23; gpus >= 2)
    jit_save_s = 5.0                # what that save takes (required with peer_share > 0)
    hang_share = 0.2                # optional: share of failures that are hangs (issue 34):
                                    # nothing breaks until they are found (gpus >= 2)
    hang_detect_s = 120.0           # optional: seconds from a hang until it is found (a
                                    # collective timeout); default: the daemon's threshold
                                    # for this job (adaptd.core.stall), plus 2 s to see it
    [[phases]]                      # optional storage slow-downs
    start_s = 7200
    end_s = 10800
    blocking_factor = 10
    latency_factor = 10
    every_s = 21600                 # optional (an addition): the phase recurs with this period

Loading validates every field and raises :class:`ScenarioError` naming the field,
the value and what is expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from adaptd.config import toml
from adaptd.core import stall
from adaptd.core.model import HOUR, weibull_scale

__all__ = [
    "LocalTier",
    "Phase",
    "Scenario",
    "ScenarioError",
    "builtin_names",
    "from_dict",
    "load",
]


#: Beyond the threshold, a hang is seen within a beat and a tick of the daemon (a second
#: each: docs/multiworker.md).
SEEN_S = 2.0


class ScenarioError(ValueError):
    """A scenario file or name is invalid; the message says which field and why."""


@dataclass(frozen=True)
class Phase:
    """A storage slow-down: saves started inside it cost ``blocking_factor`` x the
    blocking time and ``latency_factor`` x the latency."""

    start_s: float
    end_s: float
    blocking_factor: float = 1.0
    latency_factor: float = 1.0
    every_s: float | None = None

    def active(self, t: float) -> bool:
        offset = t - self.start_s
        if offset < 0:
            return False
        if self.every_s:
            offset %= self.every_s
        return offset < self.end_s - self.start_s

    def next_boundary(self, t: float) -> float:
        """The first time after ``t`` at which this phase starts or ends."""
        if t < self.start_s:
            return self.start_s
        length = self.end_s - self.start_s
        if not self.every_s:
            return self.end_s if t < self.end_s else math.inf
        k = math.floor((t - self.start_s) / self.every_s)
        begin = self.start_s + k * self.every_s
        return begin + length if t < begin + length else begin + self.every_s


@dataclass(frozen=True)
class LocalTier:
    """A local tier (``[checkpoint.local]``): a save there blocks ``blocking_s``, is
    complete ``latency_s`` after its call, slows compute by ``slowdown`` meanwhile, and
    a restart in place from it takes ``restore_s``. Storage phases do not touch it."""

    blocking_s: float
    latency_s: float
    slowdown: float = 0.0
    restore_s: float = 0.0

    @property
    def save_cost_s(self) -> float:
        """δ₁: blocking + slowdown × the write's duration."""
        return self.blocking_s + self.slowdown * (self.latency_s - self.blocking_s)


@dataclass(frozen=True)
class Scenario:
    """One training run with its failure process and storage behaviour."""

    name: str
    steps: int
    step_time_s: float
    gpus: int
    blocking_s: float
    latency_s: float
    slowdown: float
    restore_s: float
    distribution: str = "exponential"
    mtbf_gpu_hours: float = 50_000.0
    weibull_shape: float = 1.0
    trace: tuple[float, ...] | None = None
    phases: tuple[Phase, ...] = ()
    description: str = ""
    first_step_s: float | None = None  # None: as long as the other steps
    local: LocalTier | None = None  # None: no local tier, every save to durable storage
    process_share: float = 0.0  # share of failures the host (and its local tier) survives
    peer_share: float = 0.0  # share after which a survivor saves just in time
    jit_save_s: float = 0.0  # what that just-in-time save takes
    hang_share: float = 0.0  # share of failures that are hangs, found after hang_detection_s
    hang_detect_s: float | None = None  # None: the daemon's threshold (hang_detection_s)

    @property
    def classed(self) -> bool:
        """Whether failures have classes or coverage the policies may learn (issue 23, 24)."""
        return self.local is not None or self.process_share > 0 or self.peer_share > 0

    @property
    def warmup_s(self) -> float:
        """What the first step of every incarnation takes beyond a normal step."""
        return 0.0 if self.first_step_s is None else self.first_step_s - self.step_time_s

    @property
    def hang_detection_s(self) -> float:
        """Seconds from a hang until the job's survivors are freed: ``hang_detect_s``, or
        the daemon's threshold for this job (:func:`adaptd.core.stall.threshold`: its
        steps, slowed by a write in flight, the longest healthy wait; its restart the
        cost of a false abort) plus :data:`SEEN_S`, the beats' and ticks' granularity."""
        if self.hang_detect_s is not None:
            return self.hang_detect_s
        longest = self.step_time_s / (1.0 - self.slowdown)
        facts = stall.StallFacts(silent_s=0.0, steps_done=stall.WARMUP_STEPS,
                                 step_s=self.step_time_s, longest_s=longest, gpus=self.gpus,
                                 restart_s=self.restore_s)  # fmt: skip
        return stall.threshold(facts, stall.StallLimits())[0] + SEEN_S

    @property
    def job_mtbf_s(self) -> float:
        """The job's mean time between failures: per-GPU MTBF ÷ GPUs."""
        return self.mtbf_gpu_hours * HOUR / self.gpus

    @property
    def save_cost_s(self) -> float:
        """The true δ outside slow-downs: blocking + slowdown x the write's duration."""
        return self.blocking_s + self.slowdown * (self.latency_s - self.blocking_s)

    @property
    def weibull_scale_s(self) -> float:
        return weibull_scale(self.job_mtbf_s, self.weibull_shape)

    def factors(self, t: float) -> tuple[float, float]:
        """(blocking factor, latency factor) for a save started at ``t``."""
        bf = lf = 1.0
        for p in self.phases:
            if p.active(t):
                bf *= p.blocking_factor
                lf *= p.latency_factor
        return bf, lf

    def next_boundary(self, t: float) -> float:
        return min((p.next_boundary(t) for p in self.phases), default=math.inf)


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with adaptd."""
    folder = resources.files("adaptd.sim") / "scenarios"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load(name_or_path: str | Path) -> Scenario:
    """A scenario from a TOML file path or a built-in name.

    Raises :class:`ScenarioError` when neither exists or the content is invalid.
    """
    path = Path(name_or_path)
    if path.is_file():
        text, default_name, where = path.read_text(encoding="utf-8"), path.stem, str(path)
    else:
        res = resources.files("adaptd.sim") / "scenarios" / f"{name_or_path}.toml"
        if not res.is_file():
            raise ScenarioError(
                f"scenario {str(name_or_path)!r} is neither a file nor a built-in scenario "
                f"(built-in: {', '.join(builtin_names())})"
            )
        text, default_name, where = (
            res.read_text(encoding="utf-8"),
            str(name_or_path),
            f"built-in {name_or_path}",
        )
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: not valid TOML: {exc}") from None
    return from_dict(data, default_name=default_name, where=where)


#: The [failures] keys of failure classes and just-in-time saves.
_CLASS_KEYS = ("process_share", "peer_share", "jit_save_s", "hang_share", "hang_detect_s")


def _get(table: Mapping[str, Any], section: str, key: str, kind: type, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise ScenarioError(f"[{section}] {key} is required")
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ScenarioError(
            f"[{section}] {key} must be a {kind.__name__}, got {value!r} ({type(value).__name__})"
        )
    if kind is float and not math.isfinite(value):  # TOML has inf and nan
        raise ScenarioError(f"[{section}] {key} must be a finite number, got {value!r}")
    return value


def _known(table: Mapping[str, Any], section: str, keys: set[str]) -> None:
    extra = set(table) - keys
    if extra:
        raise ScenarioError(
            f"[{section}] has unknown key(s) {', '.join(sorted(extra))}; "
            f"known: {', '.join(sorted(keys))}"
        )


def from_dict(
    data: Mapping[str, Any], *, default_name: str = "scenario", where: str = ""
) -> Scenario:
    """Build and validate a :class:`Scenario` from parsed TOML."""
    try:
        return _from_dict(data, default_name)
    except ScenarioError as exc:
        raise ScenarioError(f"{where}: {exc}" if where else str(exc)) from None


def _from_dict(data: Mapping[str, Any], default_name: str) -> Scenario:
    _known(data, "top level", {"name", "description", "job", "checkpoint", "failures", "phases"})
    job = data.get("job") or {}
    ck = data.get("checkpoint") or {}
    fl = data.get("failures") or {}
    _known(job, "job", {"steps", "step_time_s", "first_step_s", "gpus"})
    # [checkpoint.local] is a table of its own, checked by _local
    plain = {key: value for key, value in ck.items() if key != "local"}
    _known(plain, "checkpoint", {"blocking_s", "latency_s", "slowdown", "restore_s"})
    _known(
        fl, "failures", {"distribution", "mtbf_gpu_hours", "weibull_shape", "trace", *_CLASS_KEYS}
    )
    steps = _get(job, "job", "steps", int)
    step_time = _get(job, "job", "step_time_s", float)
    first_step = _get(job, "job", "first_step_s", float, None)
    gpus = _get(job, "job", "gpus", int, 1)
    blocking = _get(ck, "checkpoint", "blocking_s", float)
    latency = _get(ck, "checkpoint", "latency_s", float, blocking)
    slowdown = _get(ck, "checkpoint", "slowdown", float, 0.0)
    restore = _get(ck, "checkpoint", "restore_s", float, 0.0)
    dist = _get(fl, "failures", "distribution", str, "exponential")
    mtbf_h = _get(fl, "failures", "mtbf_gpu_hours", float, 50_000.0)
    shape = _get(fl, "failures", "weibull_shape", float, 1.0)
    trace_raw = _get(fl, "failures", "trace", list, None)
    process_share = _get(fl, "failures", "process_share", float, 0.0)
    peer_share = _get(fl, "failures", "peer_share", float, 0.0)
    jit_save = _get(fl, "failures", "jit_save_s", float, None)
    hang_share = _get(fl, "failures", "hang_share", float, 0.0)
    hang_detect = _get(fl, "failures", "hang_detect_s", float, None)
    local = _local(ck.get("local"), slowdown)
    checks = [
        (steps >= 1, "[job] steps must be >= 1", steps),
        (step_time > 0, "[job] step_time_s must be > 0", step_time),
        (
            first_step is None or first_step >= step_time,
            "[job] first_step_s (the first step of each incarnation) must be >= step_time_s",
            first_step,
        ),
        (gpus >= 1, "[job] gpus must be >= 1", gpus),
        (blocking >= 0, "[checkpoint] blocking_s must be >= 0", blocking),
        (
            latency >= blocking,
            "[checkpoint] latency_s (save call to durable) must be >= blocking_s",
            latency,
        ),
        (0 <= slowdown < 1, "[checkpoint] slowdown must be a fraction in [0, 1)", slowdown),
        (restore >= 0, "[checkpoint] restore_s must be >= 0", restore),
        (
            dist in ("exponential", "weibull"),
            '[failures] distribution must be "exponential" or "weibull"',
            dist,
        ),
        (mtbf_h > 0, "[failures] mtbf_gpu_hours must be > 0", mtbf_h),
        (0.05 <= shape <= 20, "[failures] weibull_shape must be in [0.05, 20]", shape),
        (0 <= process_share <= 1, "[failures] process_share must be a share in [0, 1]",
         process_share),
        (0 <= peer_share <= 1, "[failures] peer_share must be a share in [0, 1]", peer_share),
        (
            peer_share == 0 or gpus >= 2,
            "[failures] peer_share needs a survivor: [job] gpus must be >= 2",
            gpus,
        ),
        (
            peer_share == 0 or jit_save is not None,
            "[failures] jit_save_s (what a just-in-time save takes) is required with "
            "peer_share > 0",
            jit_save,
        ),
        (jit_save is None or jit_save >= 0, "[failures] jit_save_s must be >= 0", jit_save),
        (0 <= hang_share <= 1, "[failures] hang_share must be a share in [0, 1]", hang_share),
        (
            hang_share == 0 or gpus >= 2,
            "[failures] hang_share needs ranks that wait on the hung one: [job] gpus must be >= 2",
            gpus,
        ),
        (hang_detect is None or hang_detect > 0, "[failures] hang_detect_s must be > 0",
         hang_detect),
    ]  # fmt: skip
    for ok, message, value in checks:
        if not ok:
            raise ScenarioError(f"{message}, got {value!r}")
    trace = None
    if trace_raw is not None:
        try:
            trace = tuple(sorted(float(x) for x in trace_raw))
        except (TypeError, ValueError):
            raise ScenarioError(
                f"[failures] trace must be a list of seconds, got {trace_raw!r}"
            ) from None
        if not all(math.isfinite(x) and x >= 0 for x in trace):
            raise ScenarioError(
                f"[failures] trace times must be finite and >= 0 seconds, got {trace_raw!r}"
            )
    phases = []
    for i, ph in enumerate(data.get("phases") or []):
        sec = f"phases.{i}"
        _known(ph, sec, {"start_s", "end_s", "blocking_factor", "latency_factor", "every_s"})
        p = Phase(
            start_s=_get(ph, sec, "start_s", float),
            end_s=_get(ph, sec, "end_s", float),
            blocking_factor=_get(ph, sec, "blocking_factor", float, 1.0),
            latency_factor=_get(ph, sec, "latency_factor", float, 1.0),
            every_s=_get(ph, sec, "every_s", float, None),
        )
        if not 0 <= p.start_s < p.end_s:
            raise ScenarioError(f"[{sec}] needs 0 <= start_s < end_s, got {p.start_s}, {p.end_s}")
        if p.blocking_factor <= 0 or p.latency_factor <= 0:
            raise ScenarioError(f"[{sec}] factors must be > 0")
        if p.every_s is not None and p.every_s < p.end_s - p.start_s:
            raise ScenarioError(f"[{sec}] every_s must be >= end_s - start_s, got {p.every_s}")
        phases.append(p)
    return Scenario(
        name=str(data.get("name") or default_name),
        description=str(data.get("description") or ""),
        steps=steps,
        step_time_s=step_time,
        first_step_s=first_step,
        gpus=gpus,
        blocking_s=blocking,
        latency_s=latency,
        slowdown=slowdown,
        restore_s=restore,
        distribution=dist,
        mtbf_gpu_hours=mtbf_h,
        weibull_shape=shape,
        trace=trace,
        phases=tuple(phases),
        local=local,
        process_share=process_share,
        peer_share=peer_share,
        jit_save_s=0.0 if jit_save is None else jit_save,
        hang_share=hang_share,
        hang_detect_s=hang_detect,
    )


def _local(table: Any, durable_slowdown: float) -> LocalTier | None:
    """``[checkpoint.local]``, validated; ``None`` when absent."""
    if table is None:
        return None
    sec = "checkpoint.local"
    if not isinstance(table, Mapping):
        raise ScenarioError(f"[{sec}] must be a table, got {table!r}")
    _known(table, sec, {"blocking_s", "latency_s", "slowdown", "restore_s"})
    blocking = _get(table, sec, "blocking_s", float)
    tier = LocalTier(
        blocking_s=blocking,
        latency_s=_get(table, sec, "latency_s", float, blocking),
        slowdown=_get(table, sec, "slowdown", float, 0.0),
        restore_s=_get(table, sec, "restore_s", float, 0.0),
    )
    checks = [
        (tier.blocking_s >= 0, "blocking_s must be >= 0", tier.blocking_s),
        (tier.latency_s >= tier.blocking_s, "latency_s must be >= blocking_s", tier.latency_s),
        (0 <= tier.slowdown < 1, "slowdown must be a fraction in [0, 1)", tier.slowdown),
        (
            tier.slowdown + durable_slowdown < 1,
            "slowdown plus [checkpoint] slowdown (both writes may run at once) must be < 1",
            tier.slowdown,
        ),
        (tier.restore_s >= 0, "restore_s must be >= 0", tier.restore_s),
    ]
    for ok, message, value in checks:
        if not ok:
            raise ScenarioError(f"[{sec}] {message}, got {value!r}")
    return tier
