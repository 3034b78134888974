"""The two tiers in ``adaptd report`` (docs/tiers.md): the plan's durable cadence k
and which saves went to the local tier only.

Kept apart from the drawing (:mod:`adaptd.commands._report_figures`): each function
takes the store's records, or the report's save points, and says what to show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from adaptd.state.store import DecisionRecord

__all__ = ["cadence", "draw_local", "stats_row", "title_part"]


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
