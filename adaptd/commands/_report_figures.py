"""A job's save history as a picture (``adaptd report``): PNG, or HTML with a table.

Read from the daemon's state database (:mod:`adaptd.state.store`, opened read-only, so
it works beside a running daemon). Four panels share one time axis (UTC):

1. how long each save blocked the training loop, on a log scale (saves to the local
   tier only marked apart: :mod:`adaptd.commands._report_tiers`), with the alert
   threshold (:data:`ALERT_BLOCKING_S`, the ``AdaptdSaveBlockedLoop`` rule) and the
   "slow save" line (``metrics.slow_save_s``, the ``AdaptdSavesFailingOrSlow`` rule);
2. how long each save took to become durable, with the planned interval: a save
   slower than the interval is one the alert rules count as bad;
3. the interval the policy chose (a step line, one step per decision) and the
   interval actually seen between successive saves, with urgent save requests; with
   two tiers also k, "every k-th save durable", over time (on a right axis);
4. step time: as recorded with decisions, and the extra step time a save caused.

Failed saves are red crosses in panels 1-2 and red lines across all panels; job
failures (a job lost and resumed from an older step) are black dashed lines. With
several ranks a save is one point per step: the slowest rank, since the loop
waits for it. matplotlib (the ``report`` extra) is imported only when drawing, with
the Agg backend, so nothing here needs a display.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
import statistics
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adaptd.commands import _report_tiers as tiers
from adaptd.protocol.job import JIT_REASON, tier_name
from adaptd.state.records import STALL_POLICY
from adaptd.state.store import DecisionRecord, FailureRecord, SaveRecord, Store

__all__ = [
    "ALERT_BLOCKING_S",
    "FORMATS",
    "TABLE_ROWS",
    "History",
    "ReportError",
    "SavePoint",
    "Summary",
    "group",
    "html_page",
    "load",
    "png_bytes",
    "write",
]

#: A save that blocked the loop longer than this fires ``AdaptdSaveBlockedLoop``
#: (deploy/prometheus/adaptd-rules.yml counts saves above the le="5.0" bucket).
ALERT_BLOCKING_S = 5.0
#: Output formats by file suffix.
FORMATS = (".png", ".html")
#: Saves listed in the HTML table (newest first).
TABLE_ROWS = 50

_WIDTH_IN, _HEIGHT_IN, _DPI = 12.0, 11.0, 100


class ReportError(ValueError):
    """Nothing to draw, or a request that cannot be met; the message says what to do."""


@dataclass(frozen=True, slots=True)
class SavePoint:
    """One save of a job across its ranks: the slowest rank's figures."""

    step: int
    ended: float
    blocking_s: float
    durable_s: float
    bytes: int
    ranks: int
    ok: bool
    error: str
    path: str
    reason: str
    extra_step_s: float
    tier: str = ""  # "local": saved to the local tier only (two tiers)


@dataclass(frozen=True, slots=True)
class History:
    """What the report draws, read from the store."""

    job: str
    saves: tuple[SavePoint, ...]
    decisions: tuple[DecisionRecord, ...]
    failures: tuple[FailureRecord, ...]
    since: float | None = None

    @property
    def failed(self) -> int:
        return sum(not s.ok for s in self.saves)

    @property
    def stalls(self) -> tuple[DecisionRecord, ...]:
        """The hang aborts: decisions the daemon's hang detection made when the job
        stalled (docs/multiworker.md, "Hangs"), each with its threshold and culprit."""
        return tuple(d for d in self.decisions if d.policy == STALL_POLICY)

    @property
    def covered(self) -> int:
        """Job failures a just-in-time save covered: the job resumed from one."""
        jit = {s.step for s in self.saves if s.ok and s.reason == JIT_REASON}
        return sum(f.resumed_step in jit for f in self.failures)


@dataclass(frozen=True, slots=True)
class Summary:
    """Figures of the report, returned to the caller (and printed by the command)."""

    out: Path
    format: str
    saves: int
    failed: int
    decisions: int
    over_alert: int
    stalls: int
    width_px: int
    height_px: int
    bytes: int


def group(records: Sequence[SaveRecord]) -> tuple[SavePoint, ...]:
    """One :class:`SavePoint` per step: the slowest rank's blocking and durable
    time, the newest end, the total bytes, failed when any rank failed."""
    by_step: dict[int, list[SaveRecord]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r)
    out = []
    for step, rs in by_step.items():
        bad = [r for r in rs if not r.ok]
        out.append(
            SavePoint(
                step=step,
                ended=max(r.ended for r in rs),
                blocking_s=max(r.blocking_s for r in rs),
                durable_s=max(r.durable_s for r in rs),
                bytes=sum(r.bytes for r in rs),
                ranks=len({r.rank for r in rs}),
                ok=not bad,
                error="; ".join(sorted({f"rank {r.rank}: {r.error}" for r in bad})),
                path=rs[0].path,
                reason=rs[0].reason,
                extra_step_s=max(r.extra_step_s for r in rs),
                tier=rs[0].tier,
            )
        )
    return tuple(sorted(out, key=lambda s: (s.ended, s.step)))


def load(store: Store, job: str, *, since: float | None = None) -> History:
    """The job's history from ``store``. Raises :class:`ReportError` when the store
    has no such job (naming the jobs it has) or nothing in the window."""
    known = store.jobs()
    if job not in {j.job for j in known}:
        names = ", ".join(j.job for j in known) or "none: the database is empty"
        raise ReportError(f"no job {job!r} in {store.path}; jobs with history: {names}")
    saves = group(store.saves(job, since=since))
    decisions = tuple(store.decisions(job, since=since))
    failures = tuple(f for f in store.failures(job) if since is None or f.time >= since)
    if not saves and not decisions:
        summary = next(j for j in known if j.job == job)
        last = f", the newest at {_utc(summary.last_save)}" if summary.last_save else ""
        raise ReportError(
            f"job {job!r} has no saves or decisions since {_utc(since)} "
            f"({summary.saves} saves in all{last}); use an earlier --since"
            if since is not None
            else f"job {job!r} has no saves or decisions recorded yet"
        )
    return History(job, saves, decisions, failures, since)


def _utc(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# --------------------------------------------------------------------------- drawing


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "drawing needs matplotlib; install it (pip install 'adaptd[report]')"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _dates(ts: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, tz=timezone.utc) for t in ts]


def _fmt_s(v: float) -> str:
    if v < 1:
        return f"{v * 1000:.0f} ms"
    if v < 120:
        return f"{v:.3g} s"
    return f"{v / 60:.1f} min"


def _linear_unit(ax: Any, what: str, values: Sequence[float]) -> None:
    """Label a linear seconds axis in the unit that suits its largest value, with
    round ticks in that unit (10 min, not 600 s or 3.3 min)."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    top = max(values, default=0.0)
    scale, unit = (1e-3, "ms") if top < 1 else (1.0, "s") if top < 300 else (60.0, "min")
    ax.set_ylim(bottom=0, top=max(top * 1.15, scale))
    span = ax.get_ylim()[1] / scale
    nice = next((n for n in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if span / n <= 6), 2000)
    ax.yaxis.set_major_locator(MultipleLocator(nice * scale))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / scale:g}"))
    ax.set_ylabel(f"{what} ({unit})")


#: An interval panel whose values span this factor or more is drawn on a log axis:
#: a 300 s probe beside 4.6 s intervals made a minutes axis with the 4.6 s on zero.
LOG_SPREAD = 20.0


def _seconds_axis(ax: Any, what: str, values: Sequence[float]) -> None:
    """A seconds axis that shows every value: linear (:func:`_linear_unit`) unless the
    positive values span :data:`LOG_SPREAD` or more, then logarithmic with labels in
    the unit of each tick (``5 s``, ``5 min``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    positive = [v for v in values if v > 0]
    if not positive or max(positive) / min(positive) < LOG_SPREAD:
        _linear_unit(ax, what, values)
        return
    ax.set_yscale("log")
    ax.set_ylim(min(positive) / 1.5, max(positive) * 1.5)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _fmt_s(v)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
    ax.set_ylabel(f"{what} (log scale)")


def _time_limits(times: Sequence[float]) -> tuple[float, float]:
    """The time axis's ends: the data's span and 2 % of it on each side (at least a
    second), or a minute around a single moment. A ±5 minute minimum made a 90 s run
    fill 15 % of the width."""
    lo, hi = min(times), max(times)
    if hi <= lo:
        return lo - 30.0, hi + 30.0
    pad = max((hi - lo) * 0.02, 1.0)
    return lo - pad, hi + pad


def png_bytes(h: History, *, slow_save_s: float = 1.0) -> bytes:
    """The four-panel figure as PNG bytes (see the module docstring)."""
    plt = _pyplot()
    import matplotlib.dates as mdates
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(
        4, 1, figsize=(_WIDTH_IN, _HEIGHT_IN), dpi=_DPI, sharex=True, layout="constrained"
    )
    ax_block, ax_dur, ax_int, ax_step = axes
    ok = [s for s in h.saves if s.ok]
    bad = [s for s in h.saves if not s.ok]
    seconds = FuncFormatter(lambda v, _pos: _fmt_s(v) if v > 0 else "0")
    ranks = max((s.ranks for s in h.saves), default=1)
    window = f"since {_utc(h.since)}" if h.since is not None else "whole history"
    fig.suptitle(
        f"adaptd save history: job {h.job}  ({len(h.saves)} saves, {len(bad)} failed, "
        f"{len(h.decisions)} decisions; {window}{tiers.title_part(tiers.cadence(h.decisions))})",
        fontsize=13,
        fontweight="bold",
    )

    # 1. blocking time, log scale, with the alert and slow-save lines
    over = [s for s in ok if s.blocking_s > ALERT_BLOCKING_S]
    if ok:
        ax_block.plot(
            _dates([s.ended for s in ok]),
            [max(s.blocking_s, 1e-4) for s in ok],
            "o-",
            ms=3,
            lw=0.8,
            color="tab:blue",
            label="loop blocked by the save"
            + (f" (slowest of {ranks} ranks)" if ranks > 1 else ""),
        )
    tiers.draw_local(ax_block, _dates, ok)
    if over:
        ax_block.scatter(
            _dates([s.ended for s in over]),
            [s.blocking_s for s in over],
            s=60,
            facecolors="none",
            edgecolors="tab:red",
            linewidths=1.5,
            zorder=5,
            label=f"over the alert threshold ({len(over)})",
        )
    ax_block.axhline(
        ALERT_BLOCKING_S,
        color="tab:red",
        ls="--",
        lw=1.2,
        label=f"alert: blocked > {_fmt_s(ALERT_BLOCKING_S)} (AdaptdSaveBlockedLoop)",
    )
    ax_block.axhline(
        slow_save_s,
        color="tab:orange",
        ls=":",
        lw=1.2,
        label=f"slow save: > {_fmt_s(slow_save_s)} (metrics.slow_save_s)",
    )
    ax_block.set_yscale("log")
    ax_block.yaxis.set_major_formatter(seconds)
    ax_block.set_ylabel("blocking time (log)")
    ax_block.set_title("How long each save blocked the training loop", loc="left")

    # 2. durable time, with the planned interval for comparison
    if ok:
        ax_dur.plot(
            _dates([s.ended for s in ok]),
            [s.durable_s for s in ok],
            "o-",
            ms=3,
            lw=0.8,
            color="tab:green",
            label="time until durable",
        )
    ax_dur.set_title("How long each save took to become durable on storage", loc="left")

    # 3. the chosen interval (step line) and the interval actually seen
    planned = [d for d in h.decisions if not d.urgent and d.interval_s is not None]
    if planned:
        end = max([planned[-1].time, *(s.ended for s in h.saves)])
        xs = _dates([d.time for d in planned] + [end])
        ys = [d.interval_s for d in planned] + [planned[-1].interval_s]
        ax_int.step(xs, ys, where="post", color="tab:purple", lw=1.8, label="interval chosen")
    elif h.decisions:
        ax_int.text(
            0.5, 0.5, "decisions recorded without an interval in seconds",
            transform=ax_int.transAxes, ha="center", va="center", color="grey",
        )  # fmt: skip
    seen = [(b.ended, b.ended - a.ended) for a, b in itertools.pairwise(ok)]
    if seen:
        ax_int.plot(
            _dates([t for t, _ in seen]),
            [d for _, d in seen],
            ".",
            ms=5,
            color="tab:gray",
            label="time since the previous save",
        )
    urgent = [d for d in h.decisions if d.urgent and d.policy != STALL_POLICY]
    for i, d in enumerate(urgent):
        ax_int.axvline(
            _dates([d.time])[0],
            color="tab:cyan",
            lw=1,
            ls="-.",
            label="urgent save requested" if i == 0 else None,
        )
    for i, d in enumerate(h.stalls):
        ax_int.axvline(
            _dates([d.time])[0],
            color="tab:red",
            lw=1.5,
            ls="--",
            label="hang detected: survivors freed to save" if i == 0 else None,
        )
    cadence = tiers.draw_cadence(
        ax_int,
        _dates,
        h.decisions,
        max([*(s.ended for s in h.saves), *(d.time for d in h.decisions)], default=0.0),
    )
    ax_int.set_title("Save interval chosen by the policy", loc="left")

    # 4. step time
    stepped = [d for d in h.decisions if d.step_time_s is not None]
    extra = [s for s in ok if s.extra_step_s > 0]
    if stepped:
        ax_step.plot(
            _dates([d.time for d in stepped]),
            [d.step_time_s for d in stepped],
            "-",
            color="tab:brown",
            lw=1.2,
            label="step time (at each decision)",
        )
    if extra:
        ax_step.plot(
            _dates([s.ended for s in extra]),
            [s.extra_step_s for s in extra],
            "^",
            ms=4,
            color="tab:olive",
            label="extra step time during a save",
        )
    if not stepped and not extra:
        ax_step.text(
            0.5, 0.5, "no step time recorded for this job",
            transform=ax_step.transAxes, ha="center", va="center", color="grey",
        )  # fmt: skip
    ax_step.set_title("Training step time", loc="left")

    # failed saves and job failures, across every panel
    for ax in axes:
        for i, s in enumerate(bad):
            ax.axvline(
                _dates([s.ended])[0],
                color="tab:red",
                lw=1,
                alpha=0.6,
                label=f"failed save ({len(bad)})" if i == 0 and ax is ax_int else None,
            )
        for i, f in enumerate(h.failures):
            ax.axvline(
                _dates([f.time])[0],
                color="black",
                ls="--",
                lw=1.2,
                label=f"job failure ({_failures(h)})" if i == 0 and ax is ax_int else None,
            )
        ax.grid(True, which="major", alpha=0.3)
    for ax, vals in ((ax_block, "blocking_s"), (ax_dur, "durable_s")):
        # a failed save with a figure is a cross; one without (0) only its red line
        marked = [s for s in bad if getattr(s, vals) > 0]
        if marked:
            ax.scatter(
                _dates([s.ended for s in marked]),
                [getattr(s, vals) for s in marked],
                marker="x",
                s=50,
                color="tab:red",
                zorder=6,
                label=f"failed save ({len(marked)})",
            )
    for ax, empty, text in (
        (ax_block, not ok, "no successful save in this window"),
        (ax_dur, not ok, "no successful save in this window"),
        (ax_int, not h.decisions and not seen, "no decisions recorded for this job"),
    ):
        if empty:
            ax.text(
                0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey"
            )  # fmt: skip
    for ax in axes:
        handles, _ = ax.get_legend_handles_labels()
        if handles:  # beside the panel, so it never hides a point or a threshold
            x = 1.04 if cadence is not None and ax is ax_int else 1.01  # past k's ticks
            ax.legend(loc="upper left", bbox_to_anchor=(x, 1.0), fontsize=8, frameon=False)
    top = max([ALERT_BLOCKING_S, *(s.blocking_s for s in h.saves)])
    ax_block.set_ylim(top=top * 3)
    _linear_unit(ax_dur, "durable time", [s.durable_s for s in h.saves])
    _seconds_axis(
        ax_int,
        "interval",
        [d.interval_s or 0.0 for d in h.decisions] + [d for _, d in seen],
    )
    _linear_unit(
        ax_step,
        "step time",
        [d.step_time_s or 0.0 for d in stepped] + [s.extra_step_s for s in extra],
    )

    times = [s.ended for s in h.saves] + [d.time for d in h.decisions]
    times += [f.time for f in h.failures]
    ax_step.set_xlim(*_dates(_time_limits(times)))
    locator = mdates.AutoDateLocator(tz=timezone.utc)
    ax_step.xaxis.set_major_locator(locator)
    ax_step.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    ax_step.set_xlabel("time (UTC)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    plt.close(fig)
    return buf.getvalue()


# --------------------------------------------------------------------------- HTML


def _failures(h: History) -> str:
    n, covered = len(h.failures), h.covered
    return f"{n}: {covered} covered just in time, {n - covered} not" if covered else str(n)


def _stats_rows(h: History) -> list[tuple[str, str]]:
    ok = [s for s in h.saves if s.ok]
    rows = [("saves", f"{len(h.saves)} ({h.failed} failed)"), ("decisions", str(len(h.decisions)))]
    if h.failures:
        rows.append(("job failures", _failures(h)))
    if h.stalls:
        last = h.stalls[-1]
        rows.append(("hangs detected", f"{len(h.stalls)}; last {_utc(last.time)} at step "
                     f"{last.step}: {last.reason}"))  # fmt: skip
    if ok:
        for label, attr in (("blocking", "blocking_s"), ("durable", "durable_s")):
            vals = sorted(getattr(s, attr) for s in ok)
            p95 = vals[min(len(vals) - 1, math.ceil(0.95 * len(vals)) - 1)]
            rows.append(
                (
                    label,
                    f"median {_fmt_s(statistics.median(vals))}, p95 {_fmt_s(p95)}, "
                    f"max {_fmt_s(vals[-1])}",
                )
            )
        rows.append(("first / last save", f"{_utc(h.saves[0].ended)} / {_utc(h.saves[-1].ended)}"))
    if (row := tiers.stats_row(h.saves, tiers.cadence(h.decisions))) is not None:
        rows.append(row)
    planned = [d for d in h.decisions if d.interval_s is not None and not d.urgent]
    if planned:
        d = planned[-1]
        rows.append(("current interval", f"{_fmt_s(d.interval_s or 0)} ({d.policy}: {d.reason})"))
    return rows


def html_page(h: History, png: bytes, *, rows: int = TABLE_ROWS) -> str:
    """A self-contained page: the figure embedded as base64 PNG, key figures, and
    the newest ``rows`` saves as a table (failed ones highlighted)."""
    e = html.escape
    img = base64.b64encode(png).decode("ascii")
    stats = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _stats_rows(h))
    body = []
    for s in reversed(h.saves[-rows:]):
        cls = ' class="failed"' if not s.ok else ""
        body.append(
            f"<tr{cls}><td>{e(_utc(s.ended))}</td><td>{s.step}</td><td>{s.ranks}</td>"
            f"<td>{s.blocking_s * 1000:.1f}</td><td>{s.durable_s:.2f}</td>"
            f"<td>{s.bytes / 1e6:.1f}</td><td>{tier_name(s.tier)}</td>"
            f"<td>{'ok' if s.ok else 'FAILED'}</td>"
            f"<td>{e(s.error or s.reason)}</td><td>{e(s.path)}</td></tr>"
        )
    title = f"adaptd save history: {h.job}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
table.saves td:nth-child(n+2):nth-child(-n+6) {{ text-align: right; }}
tr.failed {{ background: #fdd; }}
img {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1>{e(title)}</h1>
<table class="stats">
{stats}
</table>
<p><img alt="save blocking and durable time, interval and step time of job {e(h.job)}"
 src="data:image/png;base64,{img}"></p>
<h2>Last {len(body)} saves (newest first)</h2>
<table class="saves">
<tr><th>ended</th><th>step</th><th>ranks</th><th>blocking (ms)</th><th>durable (s)</th>
<th>MB</th><th>tier</th><th>result</th><th>error / reason</th><th>path</th></tr>
{chr(10).join(body)}
</table>
</body></html>
"""


def write(h: History, out: str | Path, *, slow_save_s: float = 1.0) -> Summary:
    """Draw ``h`` into ``out`` (``.png`` or ``.html``, by suffix), writing a temporary
    file first so a reader never sees half a report. Raises :class:`ReportError`
    for another suffix, and :class:`OSError` when the file cannot be written."""
    out = Path(out)
    fmt = out.suffix.lower()
    if fmt not in FORMATS:
        raise ReportError(f"--out {out}: unknown extension {out.suffix!r}; use .png or .html")
    png = png_bytes(h, slow_save_s=slow_save_s)
    data = png if fmt == ".png" else html_page(h, png).encode("utf-8")
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    return Summary(
        out=out,
        format=fmt[1:],
        saves=len(h.saves),
        failed=h.failed,
        decisions=len(h.decisions),
        over_alert=sum(s.ok and s.blocking_s > ALERT_BLOCKING_S for s in h.saves),
        stalls=len(h.stalls),
        width_px=width,
        height_px=height,
        bytes=len(data),
    )
