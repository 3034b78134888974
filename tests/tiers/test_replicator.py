"""The Replicator's pure scheduling rules and the config it is built from.

Scheduling is a table of inputs and the upload that must start next (no threads, no
clock); the config tests go through :func:`adaptd.config.loader.loads` and, once, through
``adaptd serve --check-config``. The daemon end to end is in test_replicator_serve.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ops._tools import tool
from prometheus_client.parser import text_string_to_metric_families

from adaptd.config import loader as config
from adaptd.metrics.exporter import Metrics
from adaptd.protocol.admin import ReplicationInfo
from adaptd.tiers.replicator import (
    Pending,
    jobs_in_staging,
    merge,
    newest_local_step,
    next_upload,
    parse_state_file,
    retry_delay,
)

# ---------------------------------------------------------------------- scheduling


def p(job: str, step: int, since: float, *, not_before: float = 0.0) -> Pending:
    return Pending(job, step, saved=since, waiting_since=since, not_before=not_before)


@pytest.mark.parametrize(
    ("pending", "uploading", "last_started", "now", "expected"),
    [
        ([], [], {}, 0.0, None),
        # the job waiting longest goes first
        ([p("a", 10, 5.0), p("b", 7, 3.0)], [], {}, 9.0, "b"),
        # ... unless it is already uploading to this destination (one upload per job)
        ([p("a", 10, 5.0), p("b", 7, 3.0)], ["b"], {}, 9.0, "a"),
        ([p("a", 10, 5.0)], ["a"], {}, 9.0, None),
        # a retry waits out its delay; the other job goes meanwhile
        ([p("a", 10, 1.0, not_before=20.0), p("b", 7, 3.0)], [], {}, 9.0, "b"),
        ([p("a", 10, 1.0, not_before=20.0)], [], {}, 9.0, None),
        ([p("a", 10, 1.0, not_before=20.0), p("b", 7, 3.0)], [], {}, 20.0, "a"),
        # equal waits: the job whose last upload started longest ago (round-robin)
        ([p("a", 10, 3.0), p("b", 7, 3.0)], [], {"a": 5.0, "b": 8.0}, 9.0, "a"),
        ([p("a", 10, 3.0), p("b", 7, 3.0)], [], {"a": 8.0, "b": 5.0}, 9.0, "b"),
        ([p("a", 10, 3.0), p("b", 7, 3.0)], [], {"a": 8.0}, 9.0, "b"),  # b never started
    ],
)
def test_next_upload(pending, uploading, last_started, now, expected):
    got = next_upload({x.job: x for x in pending}, uploading, last_started, now)
    assert (got.job if got else None) == expected


def test_a_newer_checkpoint_replaces_the_pending_one_and_keeps_its_place():
    old = Pending("a", 10, saved=100.0, waiting_since=100.0, not_before=150.0, attempts=3)
    new = p("a", 20, 130.0)
    merged = merge(old, new)
    assert merged.step == 20 and merged.saved == 130.0
    assert merged.waiting_since == 100.0  # the job keeps its place in line
    assert merged.attempts == 0 and merged.not_before == 0.0  # the old step's retry is gone
    assert merge(new, old) is new  # an older step never replaces a newer one
    assert merge(None, new) is new


def test_retry_delay_doubles_up_to_a_cap():
    delays = [retry_delay(n) for n in range(1, 12)]
    assert delays[:4] == [2.0, 4.0, 8.0, 16.0]
    assert delays == sorted(delays) and max(delays) == 300.0


def test_state_file_and_newest_local_step(tmp_path: Path):
    text = 'model_checkpoint_path: "ckpt-30"\nall_model_checkpoint_paths: "ckpt-20"\n'
    assert parse_state_file(text) == 30
    assert parse_state_file('model_checkpoint_path: "/abs/dir/ckpt-7"\n') == 7
    assert parse_state_file("garbage") is None
    assert newest_local_step(tmp_path) is None  # no state file
    (tmp_path / "checkpoint").write_text(text)
    assert newest_local_step(tmp_path) is None  # names a checkpoint whose index is gone
    (tmp_path / "ckpt-30.index").write_bytes(b"x")
    assert newest_local_step(tmp_path) == 30


def test_jobs_found_under_a_glob_patterns_staging_template(tmp_path: Path):
    for name in ("run-a", "run-b", "other"):
        (tmp_path / "ckpts" / name / "tf").mkdir(parents=True)
    (tmp_path / "ckpts" / "run-file").write_text("not a directory")
    template = str(tmp_path / "ckpts" / "{job}" / "tf")
    assert jobs_in_staging(template, "run-*") == ["run-a", "run-b"]
    assert jobs_in_staging(template, "run-a") == ["run-a"]
    assert jobs_in_staging(str(tmp_path / "nowhere" / "{job}"), "*") == []
    prefixed = str(tmp_path / "ckpts" / "run-{job}")
    assert jobs_in_staging(prefixed, "?") == ["a", "b"]


# ---------------------------------------------------------------------- config

GOOD = """
[destinations.nfs]
url = "{dest}"
bandwidth_mib_s = 50
max_concurrent = 2
keep_last = 2
keep_every_hours = 24

[destinations.s3]
url = "s3://ckpts/prod"
storage_options = {{ endpoint_url = "http://127.0.0.1:9000", secret = "hunter2" }}

[jobs."llama-*"]
staging = "/local/nvme/{{job}}"
replicate_to = ["nfs", "s3"]

[jobs."llama-7"]
policy = "fixed:steps=100"
"""


def test_destinations_and_job_replication_parse(tmp_path: Path):
    cfg = config.loads(GOOD.format(dest=tmp_path / "nfs"))
    nfs = cfg.destinations["nfs"]
    assert nfs.url == str(tmp_path / "nfs")
    assert nfs.bandwidth_bytes_s == 50 * 2**20 and nfs.max_concurrent == 2
    assert (nfs.keep_last, nfs.keep_every_hours) == (2, 24.0)
    assert cfg.destinations["s3"].max_concurrent == 1 and cfg.destinations["s3"].keep_last == 3
    # an exact id's entry and the matching glob merge: llama-7 keeps the glob's staging
    staging, dests = cfg.replication_for("llama-7")
    assert staging == Path("/local/nvme/llama-7")
    assert [d.name for d in dests] == ["nfs", "s3"]
    assert dests[0].job_url("llama-7") == f"{tmp_path / 'nfs'}/llama-7"
    assert cfg.policy_for("llama-7") == "fixed:steps=100"
    assert cfg.replication_for("bert") is None


def test_check_config_shows_destinations_with_credentials_hidden(tmp_path: Path):
    path = tmp_path / "adaptd.toml"
    path.write_text(GOOD.format(dest=tmp_path / "nfs"))
    out = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "serve", "--check-config", "--json", "--config",
         str(path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    shown = json.loads(out.stdout)
    s3 = shown["destinations"]["s3"]
    assert s3["url"] == "s3://ckpts/prod"
    assert s3["storage_options"] == {"endpoint_url": "http://127.0.0.1:9000", "secret": "***"}
    assert shown["destinations"]["nfs"]["bandwidth_mib_s"] == 50
    job = shown["jobs"]["llama-*"]
    assert job["staging"] == "/local/nvme/{job}" and job["replicate_to"] == ["nfs", "s3"]
    assert "hunter2" not in out.stdout


def test_the_shipped_example_validates_with_its_tiered_storage_lines_uncommented():
    text = (Path(__file__).parents[2] / "systemd" / "adaptd.toml").read_text()
    keys = "url|bandwidth_mib_s|max_concurrent|keep_last|keep_every_hours|storage_options|"
    keys += "staging|replicate_to"
    wanted = re.compile(rf"#(\[destinations\.|\[jobs\.|({keys}) = )")
    lines = [ln[1:] if wanted.match(ln) else ln for ln in text.splitlines()]
    cfg = config.loads("\n".join(lines))
    assert set(cfg.destinations) == {"nfs", "s3"}
    staging, dests = cfg.replication_for("llama-70b-run3")
    assert staging == Path("/local/nvme/ckpts/llama-70b-run3")
    assert [(d.name, d.bandwidth_mib_s, d.keep_every_hours) for d in dests] == [
        ("nfs", 200.0, 24.0),
        ("s3", None, None),
    ]


BAD = [
    ('[destinations.a]\nurl = "rel/dir"', "destinations.a.url", "absolute path"),
    ("[destinations.a]\nkeep_last = 2", "destinations.a.url", "is required"),
    ('[destinations.a]\nurl = "/x"\nmax_concurent = 2', "destinations.a.max_concurent",
     "did you mean 'max_concurrent'"),
    ('[destinations.a]\nurl = "/x"\nmax_concurrent = 0', "destinations.a.max_concurrent",
     "must be >= 1, got 0"),
    ('[destinations.a]\nurl = "/x"\nkeep_last = 1.5', "destinations.a.keep_last",
     "must be an integer"),
    ('[destinations.a]\nurl = "/x"\nbandwidth_mib_s = -1', "destinations.a.bandwidth_mib_s",
     "must be > 0"),
    ('[destinations.a]\nurl = "/x"\nkeep_every_hours = 0', "destinations.a.keep_every_hours",
     "must be > 0"),
    ('[destinations.a]\nurl = "gopher://x/y"', "destinations.a.url", "unknown protocol 'gopher'"),
    ('[destinations.a]\nurl = "s3:///nobucket"', "destinations.a.url", "needs a bucket"),
    ('[destinations.a]\nurl = "/x"\nstorage_options = "x"', "destinations.a.storage_options",
     "must be a table"),
    ('[destinations.nfs]\nurl = "/x"\n[jobs."j"]\nstaging = "/s"\nreplicate_to = ["nsf"]',
     'jobs."j".replicate_to', "unknown destination 'nsf'; did you mean 'nfs'?"),
    ('[jobs."j"]\nstaging = "/s"\nreplicate_to = ["nfs"]', 'jobs."j".replicate_to',
     "add a [destinations.NAME] section"),
    ('[destinations.nfs]\nurl = "/x"\n[jobs."j"]\nreplicate_to = ["nfs"]',
     'jobs."j".replicate_to', 'needs jobs."j".staging'),
    ('[destinations.nfs]\nurl = "/x"\n[jobs."j"]\nstaging = "/s"\nreplicate_to = ["nfs", "nfs"]',
     'jobs."j".replicate_to', "twice"),
    ('[jobs."j"]\nstaging = "/s"\nreplicate_to = 3', 'jobs."j".replicate_to',
     "must be a list of destination names"),
    ('[jobs."j-*"]\nstaging = "/s"', 'jobs."j-*".staging', "needs {job}"),
    ('[jobs."j"]\nstaging = "/s/{user}"', 'jobs."j".staging', "only placeholder allowed"),
    ('[jobs."j"]\nstaging = "s/{job}"', 'jobs."j".staging', "absolute path"),
    ('[jobs."j"]\nstagin = "/s"', 'jobs."j".stagin', "did you mean 'staging'"),
    ('[destinaton.a]\nurl = "/x"', "destinaton", "did you mean 'destinations'"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "message"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_replication_settings_are_named(text: str, key: str, message: str):
    with pytest.raises(config.ConfigError) as info:
        config.loads(text, source="/etc/adaptd/adaptd.toml")
    assert info.value.key == key
    assert message in str(info.value)
    assert str(info.value).startswith(f"/etc/adaptd/adaptd.toml: {key}: ")


def test_s3_destination_without_s3fs_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # what `import s3fs` sees when not installed
    with pytest.raises(config.ConfigError, match=r"needs s3fs.*pip install 'adaptd\[s3\]'"):
        config.loads('[destinations.a]\nurl = "s3://bucket/prefix"')


def test_check_config_refuses_a_destination_whose_filesystem_is_not_installed(tmp_path: Path):
    """gs:// was accepted without gcsfs; the failure came only at upload or restore time."""
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    path = tmp_path / "adaptd.toml"
    path.write_text('[destinations.gcs]\nurl = "gs://bucket/ckpts"\n')
    out = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "serve", "--check-config", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == (
        f"adaptd serve: {path}: destinations.gcs.url: 'gs://bucket/ckpts' needs gcsfs, "
        "which is not installed; install gcsfs"
    )


def test_serve_refuses_a_bad_destination_in_one_line(tmp_path: Path):
    path = tmp_path / "adaptd.toml"
    path.write_text('[destinations.nfs]\nurl = "/x"\n[jobs."j"]\nstaging = "/s/{job}"\n'
                    'replicate_to = ["NFS"]\n')  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "serve", "--config", str(path),
         "--socket", str(tmp_path / "a.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"adaptd serve: {path}: jobs.\"j\".replicate_to: unknown destination 'NFS'; "
        "did you mean 'nfs'? (defined: nfs)"
    ]
    assert not (tmp_path / "a.sock").exists()


# ---------------------------------------------------------------------- metrics


def _row(job: str, **kw: object) -> ReplicationInfo:
    base: dict[str, object] = dict(
        destination="nfs", job=job, url=f"/mnt/nfs/{job}", last_step=None, uploading_step=None,
        pending_step=None, pending_uploads=0, pending_bytes=0, seconds_behind=0.0,
        throughput_bytes_s=None, last_throughput_bytes_s=None, uploaded_bytes=0, uploads=0,
        failures=0, skipped=0, yields=0,
    )  # fmt: skip
    return ReplicationInfo(**{**base, **kw})  # type: ignore[arg-type]


def test_replication_metrics_render_the_replicators_rows_and_pass_promtool():
    m = Metrics()
    assert "adaptd_replication_lag_seconds" in m.names()  # described (for the alert rules)
    assert "adaptd_replication_lag_seconds{" not in m.render().decode()  # but no samples
    rows = [
        _row("llama", last_step=900, uploading_step=1000, pending_step=1100, pending_uploads=2,
             pending_bytes=7 * 2**30, seconds_behind=412.5, uploaded_bytes=10**10, uploads=9,
             failures=2, skipped=1, yields=3),
        _row("bert", last_step=50, uploads=1, uploaded_bytes=10**6),
    ]  # fmt: skip
    m = Metrics(replication=lambda: (rows, {"nfs": 123e6}))
    m.on_upload("nfs", 42.0)
    text = m.render().decode()
    got = {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    llama = frozenset({("destination", "nfs"), ("job_id", "llama")})
    assert got[("adaptd_replication_pending_bytes", llama)] == 7 * 2**30
    assert got[("adaptd_replication_pending_uploads", llama)] == 2
    assert got[("adaptd_replication_lag_seconds", llama)] == 412.5
    assert got[("adaptd_replication_last_step", llama)] == 900
    assert got[("adaptd_replication_uploaded_bytes_total", llama)] == 10**10
    assert got[("adaptd_replication_uploads_total", llama | {("result", "failed")})] == 2
    assert got[("adaptd_replication_uploads_total", llama | {("result", "skipped")})] == 1
    assert got[("adaptd_replication_yields_total", llama)] == 3
    nfs = frozenset({("destination", "nfs")})
    assert got[("adaptd_replication_throughput_bytes_per_second", nfs)] == 123e6
    assert got[("adaptd_replication_upload_seconds_count", nfs)] == 1

    promtool = tool("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), (
        checked.stdout + checked.stderr
    )


def test_only_the_durable_saves_of_two_tiers_are_replicated(tmp_path: Path):
    """A save to the job's local tier (two tiers) is not queued for the destinations:
    its files are not in the staging directory, and only every k-th save is durable."""
    from adaptd import events as ev
    from adaptd.protocol import job as p
    from adaptd.tiers.replicator import Replicator

    rep = Replicator(config.loads(GOOD.format(dest=tmp_path / "nfs")))

    def reported(step: int, tier: str) -> None:
        report = p.SaveReport(v=p.VERSION, job="llama-7", rank=0, step=step, blocking_s=0.1,
                              durable_s=0.2, bytes=1, tier=tier)  # fmt: skip
        rep.on_event(ev.SaveReported(1.0, 1.0, "llama-7", report, True))

    reported(5, "local")
    assert rep._intake.empty()
    reported(10, "")
    assert rep._intake.get_nowait().report.step == 10
