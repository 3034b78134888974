"""The two tiers in ``adaptd report`` (docs/tiers.md): the plan's durable cadence k
(named in the title, and drawn over time on the interval panel) and which saves went
to the local tier only.

Kept apart from the drawing (:mod:`adaptd.commands._report_figures`): each function
takes the store's records, or the report's save points, and says what to show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from adaptd.state.store import DecisionRecord

__all__ = ["CADENCE_COLOUR", "cadence", "draw_cadence", "draw_local", "stats_row", "title_part"]

#: The k line's colour: no other line of the figure has it.
CADENCE_COLOUR = "tab:pink"


class _Save(Protocol):
    ended: float
    blocking_s: float
    ok: bool
    tier: str


def cadence(decisions: Sequence[DecisionRecord]) -> int | None:
    """The durable cadence k of the newest plan (None: one tier, or no plan)."""
    planned = [d for d in decisions if not d.urgent]
    return planned[-1].durable_every if planned else None


def title_part(k: int | None) -> str:
    """What the figure's title says of the tiers ("" with one)."""
    return f"; two tiers: every {k}th save durable" if k else ""


def stats_row(saves: Sequence[_Save], k: int | None) -> tuple[str, str] | None:
    """The key figures' row on the tiers (None for a job that never had two)."""
    local = sum(s.tier == "local" for s in saves)
    if not k and not local:
        return None
    cadence_text = f"every {k}th save durable" if k else "one tier now"
    return ("tiers", f"{cadence_text}; {local} local saves, {len(saves) - local} durable")


def draw_local(ax: Any, dates: Any, saves: Sequence[_Save]) -> None:
    """Mark the saves that went to the local tier only on the blocking-time panel
    (hollow green squares over the line of all saves)."""
    local = [s for s in saves if s.ok and s.tier == "local"]
    if local:
        ax.scatter(
            dates([s.ended for s in local]),
            [max(s.blocking_s, 1e-4) for s in local],
            s=40, marker="s", facecolors="none", edgecolors="tab:green", linewidths=1.2,
            zorder=4, label=f"saved to the local tier only ({len(local)})",
        )  # fmt: skip


def draw_cadence(ax: Any, dates: Any, decisions: Sequence[DecisionRecord], end: float) -> Any:
    """Draw k over time, one step per plan up to ``end``, on a second y axis (right) of
    the interval panel ``ax``, when a plan in the window had two tiers; a one-tier plan
    among them is k = 1 (every save durable). Returns that axis, or None (one tier: no
    axis, no line). The line's legend entry joins ``ax``'s."""
    planned = [d for d in decisions if not d.urgent]
    if not any(d.durable_every for d in planned):
        return None
    from matplotlib.ticker import MaxNLocator

    ks = [d.durable_every or 1 for d in planned]
    xs = dates([d.time for d in planned] + [max(end, planned[-1].time)])
    style = {"color": CADENCE_COLOUR, "lw": 1.6, "ls": "--"}
    twin = ax.twinx()
    twin.step(xs, [*ks, ks[-1]], where="post", **style)
    twin.set_ylim(0, max(ks) + 1)
    twin.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
    twin.tick_params(axis="y", colors=CADENCE_COLOUR, labelsize=8)
    ax.plot([], [], label="k: every k-th save durable (right axis)", **style)
    return twin
