"""``adaptd report``: a real state database filled through the Store's API with a
seeded, realistic history, drawn to PNG and HTML, and the errors an operator meets.

The history: a 2-rank job saving every ~10 min for 12 hours, blocking tens of
milliseconds with one 7 s stall, durable in ~20 s until a 2-hour storage storm
(60-150 s) during which the policy lengthens the interval, three failed saves,
an urgent save request and one job failure.
"""

from __future__ import annotations

import base64
import io
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
from PIL import Image

from adaptd import cli
from adaptd.commands import _report_figures as report
from adaptd.state.store import DecisionRecord, FailureRecord, SaveRecord, Store

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_760_000_000.0  # 2025-10-09 08:53:20 UTC
HOURS = 12
JOB = "llama-7b"


def _history(seed: int) -> tuple[list[SaveRecord], list[DecisionRecord], list[FailureRecord]]:
    rng = random.Random(seed)
    saves: list[SaveRecord] = []
    decisions: list[DecisionRecord] = []
    step_time = 0.8
    interval = 600.0
    t = T0
    step = 0
    storm = (T0 + 4 * 3600, T0 + 6 * 3600)
    decisions.append(
        DecisionRecord(JOB, t, 0, 750, 750, policy="default", reason="Young/Daly, start",
                       interval_s=interval, waste=0.02, step_time_s=step_time)
    )  # fmt: skip
    stall_at = rng.randrange(20, 40)
    failed_at = set(rng.sample(range(10, 60), 3))
    n = 0
    while t < T0 + HOURS * 3600:
        n += 1
        t += interval * rng.uniform(0.95, 1.05)
        step += int(interval / step_time)
        in_storm = storm[0] <= t < storm[1]
        durable = rng.uniform(60, 150) if in_storm else rng.lognormvariate(math.log(20), 0.25)
        blocking = 7.0 if n == stall_at else rng.lognormvariate(math.log(0.04), 0.4)
        ok = n not in failed_at
        for rank in (0, 1):
            saves.append(
                SaveRecord(
                    job=JOB, rank=rank, step=step, started=t - durable, ended=t + rank * 0.2,
                    blocking_s=blocking * (1 + 0.05 * rank), durable_s=durable + 0.1 * rank,
                    bytes=7_000_000_000 // 2, ok=ok,
                    error="" if ok else "ENOSPC: no space left on device",
                    path=f"/ckpt/llama/ckpt-{step}", extra_step_s=rng.uniform(0.0, 0.05),
                    reason="planned",
                )
            )  # fmt: skip
        new = 1200.0 if in_storm else 600.0
        step_time = 0.8 * rng.uniform(0.97, 1.03)
        if new != interval:
            interval = new
            decisions.append(
                DecisionRecord(JOB, t + 1, step, step + int(interval / step_time),
                               int(interval / step_time), policy="default",
                               reason=f"storage slow: durable p90 {durable:.0f} s" if in_storm
                               else "storage recovered", interval_s=interval, waste=0.03,
                               step_time_s=step_time)
            )  # fmt: skip
        elif n % 6 == 0:
            decisions.append(
                DecisionRecord(JOB, t + 1, step, step + int(interval / step_time),
                               int(interval / step_time), policy="default", reason="refit",
                               interval_s=interval, waste=0.02, step_time_s=step_time)
            )  # fmt: skip
    decisions.append(DecisionRecord(JOB, T0 + 9 * 3600, step, None, urgent=True, reason="drain"))
    decisions.sort(key=lambda d: d.time)
    failures = [FailureRecord(JOB, T0 + 8 * 3600, lost_at_step=40000, resumed_step=39000,
                              restart_s=240.0)]  # fmt: skip
    return saves, decisions, failures


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("state") / "adaptd.sqlite3"
    saves, decisions, failures = _history(seed=5)
    # the clock only drives retention: keep "now" right after the history
    with Store.open(path, clock=lambda: T0 + HOURS * 3600 + 60) as store:
        for r in saves:
            store.record_save(r)
        for d in decisions:
            store.record_decision(d)
        for f in failures:
            store.record_failure(f)
        store.record_save(SaveRecord("bert-base", 0, 100, T0, T0 + 3, 0.01, 3.0, 400_000_000))
    return path


def _png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        im.load()  # decodes every pixel: a truncated PNG raises here
        return im.size


def _colours(data: bytes) -> int:
    with Image.open(io.BytesIO(data)) as im:
        return len(im.convert("RGB").getcolors(maxcolors=1 << 20) or ())


def _main(*argv: str) -> int:
    return cli.main(["report", *argv])


# --------------------------------------------------------------------------- outputs


def test_png_is_a_real_figure(db: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.png"
    assert _main("--job", JOB, "--db", str(db), "--out", str(out)) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert _png_size(data) == (1200, 1100)
    assert len(data) > 60_000  # four panels of lines and text, not a blank canvas
    assert _colours(data) > 200  # anti-aliased lines in several colours
    # the summary line counts what the store holds (each save is one step of 2 ranks)
    saves, _, _ = _history(seed=5)
    steps = {r.step for r in saves}
    failed = {r.step for r in saves if not r.ok}
    line = capsys.readouterr().out
    assert f"{len(steps)} saves ({len(failed)} failed, 1 over the 5 s alert)" in line
    assert "1200x1100 px" in line


def test_html_embeds_the_image_and_lists_the_last_saves(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert _main("--job", JOB, "--db", str(db), "--out", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m, "no embedded PNG"
    assert _png_size(base64.b64decode(m.group(1))) == (1200, 1100)
    assert "<script" not in page and "http://" not in page and "https://" not in page
    rows = re.findall(r"<tr( class=\"failed\")?><td>", page)
    assert len(rows) == report.TABLE_ROWS
    # newest first: the newest save's step is the first row of the table
    with Store.open(db, readonly=True) as store:
        newest = store.saves(JOB)[-1]
        failed_steps = {s.step for s in store.saves(JOB) if not s.ok}
    first = re.search(r"<tr(?: class=\"failed\")?><td>[^<]*</td><td>(\d+)</td>", page)
    assert first and int(first.group(1)) == newest.step
    shown = [int(s) for s in re.findall(r"<tr class=\"failed\"><td>[^<]*</td><td>(\d+)<", page)]
    assert set(shown) <= failed_steps
    if shown:
        assert "ENOSPC: no space left on device" in page
    assert "median" in page and "p95" in page


def test_since_narrows_the_window(db: Path) -> None:
    with Store.open(db, readonly=True) as store:
        full = report.load(store, JOB)
        late = report.load(store, JOB, since=T0 + 10 * 3600)
    assert 0 < len(late.saves) < len(full.saves)
    assert all(s.ended >= T0 + 10 * 3600 for s in late.saves)
    assert late.failures == ()  # the job failure was at 8 h


def test_ranks_are_grouped_to_the_slowest(db: Path) -> None:
    with Store.open(db, readonly=True) as store:
        records = store.saves(JOB)
        h = report.load(store, JOB)
    assert len(h.saves) * 2 == len(records)
    for point in h.saves[:5]:
        same = [r for r in records if r.step == point.step]
        assert point.ranks == 2
        assert point.blocking_s == max(r.blocking_s for r in same)
        assert point.bytes == sum(r.bytes for r in same)


def test_alert_threshold_matches_the_prometheus_rule() -> None:
    rules = (ROOT / "deploy" / "prometheus" / "adaptd-rules.yml").read_text()
    block = rules.split("alert: AdaptdSaveBlockedLoop", 1)[1].split("- alert:", 1)[0]
    assert f'le="{report.ALERT_BLOCKING_S:.1f}"' in block


@pytest.mark.slow
def test_cli_in_a_subprocess(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub.png"
    p = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "report", "--job", JOB, "--db", str(db),
         "--out", str(out), "--since", "2025-10-09T18:00"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"wrote {out}")
    assert _png_size(out.read_bytes()) == (1200, 1100)


# --------------------------------------------------------------------------- errors


def test_unknown_job_lists_the_jobs(db: Path, tmp_path: Path, capsys) -> None:
    assert _main("--job", "gpt-9", "--db", str(db), "--out", str(tmp_path / "x.png")) == 2
    err = capsys.readouterr().err
    assert "no job 'gpt-9'" in err and JOB in err and "bert-base" in err
    assert not (tmp_path / "x.png").exists()


def test_empty_window_says_what_there_is(db: Path, tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "x.png")
    assert _main("--job", JOB, "--db", str(db), "--out", out, "--since", str(T0 + 86400)) == 2
    err = capsys.readouterr().err
    assert "no saves or decisions since" in err and "use an earlier --since" in err


def test_empty_database(tmp_path: Path, capsys) -> None:
    path = tmp_path / "empty.sqlite3"
    Store.open(path).close()
    assert _main("--job", JOB, "--db", str(path), "--out", str(tmp_path / "x.png")) == 2
    assert "the database is empty" in capsys.readouterr().err


def test_unknown_extension_and_bad_since(db: Path, tmp_path: Path, capsys) -> None:
    assert _main("--job", JOB, "--db", str(db), "--out", str(tmp_path / "x.svg")) == 2
    assert "unknown extension '.svg'; use .png or .html" in capsys.readouterr().err
    out = str(tmp_path / "x.png")
    assert _main("--job", JOB, "--db", str(db), "--out", out, "--since", "yesterday") == 2
    assert "--since 'yesterday'" in capsys.readouterr().err


def test_missing_database(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.sqlite3"
    assert _main("--job", JOB, "--db", str(missing), "--out", str(tmp_path / "x.png")) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no adaptd state database" in err


def test_since_parsing() -> None:
    from adaptd.commands.report import parse_since

    assert parse_since("6h", now=T0) == T0 - 6 * 3600
    assert parse_since("30m", now=T0) == T0 - 1800
    assert parse_since("2025-10-09T08:53:20") == T0
    assert parse_since("2025-10-09T10:53:20+02:00") == T0
    assert parse_since(str(T0)) == T0


def test_sparse_histories_still_draw(tmp_path: Path) -> None:
    """One save, no decisions; only failed saves with no figures: a figure, no error."""
    path = tmp_path / "sparse.sqlite3"
    with Store.open(path, clock=lambda: T0 + 3600) as store:
        store.record_save(SaveRecord("one", 0, 100, T0, T0 + 3, 0.01, 3.0, 400_000_000))
        for i in range(3):
            store.record_save(
                SaveRecord("broken", 0, i, T0 + i * 60, T0 + i * 60 + 1, 0.0, 0.0, 0,
                           ok=False, error="EIO")
            )  # fmt: skip
    with Store.open(path, readonly=True) as store:
        for job in ("one", "broken"):
            s = report.write(report.load(store, job), tmp_path / f"{job}.png")
            assert (s.width_px, s.height_px) == (1200, 1100)
            assert _png_size((tmp_path / f"{job}.png").read_bytes()) == (1200, 1100)
        assert report.load(store, "broken").failed == 3


def test_the_axes_fit_a_short_run_and_a_probe_beside_short_intervals() -> None:
    """A 90 s run filled 15 % of the width (the axis was padded by 5 minutes), and the
    interval panel, in minutes because of a 300 s probe, drew 4.6 s as a flat line on
    zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = report._time_limits([T0, T0 + 45, T0 + 90])
    assert 90 / (hi - lo) > 0.9
    assert report._time_limits([T0]) == (T0 - 30, T0 + 30)  # one moment: a minute around it
    fig, ax = plt.subplots()
    try:
        values = [300.0] + [4.6, 4.7, 4.5] * 10
        report._seconds_axis(ax, "interval", values)
        assert ax.get_yscale() == "log"
        bottom, top = ax.get_ylim()
        frac = (math.log(4.6) - math.log(bottom)) / (math.log(top) - math.log(bottom))
        assert 0.05 < frac < 0.5  # off the floor, below the probe
        report._seconds_axis(ax2 := fig.add_subplot(2, 1, 2), "interval", [4.6, 5.0, 9.0])
        assert ax2.get_yscale() == "linear"  # close values keep a linear axis
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- two tiers

PINK = (227, 119, 194)  # tab:pink, the k line's colour (_report_tiers.CADENCE_COLOUR)


def _pixels(data: bytes, rgb: tuple[int, int, int]) -> int:
    with Image.open(io.BytesIO(data)) as im:
        return sum(n for n, c in im.convert("RGB").getcolors(maxcolors=1 << 20) if c == rgb)


def _two_tiers(path: Path) -> None:
    """A job whose plan goes from k=4 to k=6 over an hour, a local save every 60 s and
    every k-th durable."""
    with Store.open(path, clock=lambda: T0 + 3600 + 60) as store:
        for t, k in ((T0, 4), (T0 + 1800, 6)):
            store.record_decision(DecisionRecord("two", t, int(t - T0), None, 60,
                                                 policy="tiers", reason="two tiers",
                                                 interval_s=60.0, durable_every=k))  # fmt: skip
        for n in range(1, 60):
            k = 4 if n * 60 < 1800 else 6
            durable = n % k == 0
            store.record_save(SaveRecord("two", 0, n * 60, T0 + n * 60 - 1, T0 + n * 60,
                                         2.0 if durable else 0.01, 20.0 if durable else 0.02,
                                         1 << 20, tier="" if durable else "local"))  # fmt: skip


def test_the_figure_draws_k_over_time_for_a_two_tier_job_only(db: Path, tmp_path: Path) -> None:
    """The interval panel gets a step line of k (durable_every), on its own right axis,
    for a job that had two tiers; a one-tier job's figure has no such line."""
    path = tmp_path / "two.sqlite3"
    _two_tiers(path)
    with Store.open(path, readonly=True) as store:
        two = report.png_bytes(report.load(store, "two"))
    with Store.open(db, readonly=True) as store:
        one = report.png_bytes(report.load(store, JOB))
    assert _png_size(two) == (1200, 1100)
    assert _pixels(one, PINK) == 0
    assert _pixels(two, PINK) > 300  # the line across the panel, its legend and its axis


def test_the_k_line_steps_with_each_plan() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adaptd.commands import _report_tiers as tiers

    plans = [DecisionRecord("j", T0, 0, None, durable_every=4),
             DecisionRecord("j", T0 + 5, 5, None, urgent=True),  # not a plan
             DecisionRecord("j", T0 + 10, 10, None),  # one tier for a while: k = 1
             DecisionRecord("j", T0 + 20, 20, None, durable_every=6)]  # fmt: skip
    fig, ax = plt.subplots()
    try:
        twin = tiers.draw_cadence(ax, report._dates, plans, T0 + 30)
        (line,) = twin.get_lines()
        assert list(line.get_ydata()) == [4, 1, 6, 6]
        assert twin.get_ylim() == (0, 7)
        assert "k: every k-th save durable" in ax.get_legend_handles_labels()[1][0]
        assert tiers.draw_cadence(ax, report._dates, plans[1:3], T0 + 30) is None
    finally:
        plt.close(fig)


def test_a_hang_the_daemon_detected_is_in_the_report(tmp_path: Path, capsys) -> None:
    """A fired stall reaches the database through the store's own sink (the daemon's
    event bus) and the report names it apart from other urgent saves: how many, the
    threshold, the culprit and the step; the printed summary counts it."""
    from adaptd import events

    path = tmp_path / "adaptd.sqlite3"
    with Store.open(path, clock=lambda: T0 + 600) as store:
        for i in range(4):
            t = T0 + 60 * i
            store.record_save(SaveRecord(JOB, 0, 100 * (i + 1), t, t + 2, 0.2, 2.0, 10**8))
        store.on_event(
            events.JobStalled(1.0, T0 + 250, JOB, step=431, silent_s=8.2, threshold_s=7.0,
                              culprit=1, reason="rank 1 stopped (T)", gpus=2)
        )  # fmt: skip
        store.on_event(
            events.SaveRequested(2.0, T0 + 120, JOB, step=200, reason="operator", ranks=2)
        )
    out = tmp_path / "r.html"
    assert _main("--job", JOB, "--db", str(path), "--out", str(out)) == 0
    assert "2 decisions, 1 hangs detected" in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    row = re.search(r"hangs detected</t[hd]><td>([^<]*)<", page)
    assert row, page[:2000]
    assert row.group(1).startswith("1; last ") and "at step 431" in row.group(1)
    assert "threshold 7.0 s" in row.group(1) and "culprit rank 1" in row.group(1)
    with Store.open(path, readonly=True) as store:
        urgent = [d for d in store.decisions(JOB) if d.urgent]
    # the operator's urgent save is not taken for a hang
    assert sorted(d.policy == "hang-detection" for d in urgent) == [False, True]
