"""Config: defaults without a file, the shipped example, and errors that say where and what."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adaptd.config import loader as config
from adaptd.config import schema as config_schema
from adaptd.config.loader import ConfigError
from adaptd.core.estimators import PRIOR_GPU_MTBF_S
from adaptd.core.policy import DEFAULT_SPEC
from adaptd.protocol import paths

from ._tools import ROOT

EXAMPLE = ROOT / "systemd" / "adaptd.toml"


def test_no_file_gives_working_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(config.CONFIG_ENV, raising=False)
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
    monkeypatch.delenv("ADAPTD_SOCKET", raising=False)
    c = config.from_mapping({})
    assert c.socket == str(tmp_path / "run" / "adaptd.sock")
    assert c.endpoint == f"ipc://{tmp_path / 'run' / 'adaptd.sock'}"
    assert c.admin_socket == tmp_path / "run" / "adaptd.admin.sock"  # where the daemon binds
    assert c.db_path == tmp_path / "state" / "adaptd.sqlite3"
    assert c.default_policy == DEFAULT_SPEC
    assert c.metrics_listen == ("127.0.0.1", 9465)
    assert c.metrics_url == "http://127.0.0.1:9465/metrics"
    assert c.gpu_mtbf_s == pytest.approx(PRIOR_GPU_MTBF_S)
    assert (c.socket_mode, c.admin_socket_mode) == (0o660, 0o600)
    assert c.log_level_number == 20
    assert c.jobs == () and dict(c.storage) == {}


def test_load_without_path_uses_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('[policy]\ndefault = "fixed:steps=7"\n')
    monkeypatch.setenv(config.CONFIG_ENV, str(f))
    c = config.load()
    assert c.default_policy == "fixed:steps=7"
    assert c.source == str(f)


def test_shipped_example_is_valid_as_is_and_fully_uncommented(tmp_path: Path) -> None:
    as_shipped = config.load(EXAMPLE)
    assert as_shipped.default_policy == DEFAULT_SPEC
    # every commented-out setting is a real setting with a valid value
    text = re.sub(r"^#(?=[\w\[])", "", EXAMPLE.read_text(), flags=re.M)
    assert text.count("\n#") < EXAMPLE.read_text().count("\n#")
    full = config.loads(text, source="uncommented example")
    assert full.socket == "/run/adaptd/adaptd.sock"
    assert full.db_path == Path("/var/lib/adaptd/adaptd.sqlite3")
    assert full.socket_group == "adaptd"
    assert full.retention_rows == 200_000
    assert full.gpu_mtbf_s == pytest.approx(PRIOR_GPU_MTBF_S, rel=1e-4)
    assert full.storage["scratch"].max_concurrent_saves == 2
    assert full.policy_for("llama-70b-run3") == "fixed:steps=1000"
    # the defaults the example documents are the defaults
    defaults = config.from_mapping({}).as_dict()
    documented = full.as_dict()
    for key in ("daemon.log_level", "daemon.sample_interval_s", "daemon.liveness_timeout_s",
                "daemon.drain_grace_s", "daemon.watchdog", "policy.default", "metrics.slow_save_s",
                "metrics.listen", "retention.days", "retention.rows", "daemon.socket_mode",
                "daemon.admin_socket_mode", "metrics.scrape_interval_s",
                "metrics.job_series_grace_s"):  # fmt: skip
        section, name = key.split(".")
        assert documented[section][name] == defaults[section][name], key


def test_full_file_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "adaptd.toml"
    f.write_text(
        f"""
[daemon]
socket = "ipc://{tmp_path}/j.sock"
admin_socket = "{tmp_path}/j.admin.sock"
socket_mode = 0o640
admin_socket_mode = "0600"
state_dir = "{tmp_path}/state"
log_level = "DEBUG"
sample_interval_s = 2
liveness_timeout_s = 10
drain_grace_s = 30.5
watchdog = false

[policy]
default = "fixed:steps=500+phased"
gpu_mtbf_hours = 1000

[metrics]
listen = "[::1]:0"
slow_save_s = 0.25
scrape_interval_s = 15

[retention]
days = 7
rows = 50

[jobs."bert-*"]
policy = "fixed:seconds=600"

[jobs."bert-base"]
paused = true

[storage.nfs]
path = "/mnt/nfs"
"""
    )
    c = config.load(f)
    assert c.socket == f"{tmp_path}/j.sock"
    assert (c.socket_mode, c.admin_socket_mode) == (0o640, 0o600)
    assert c.db_path == tmp_path / "state" / "adaptd.sqlite3"
    assert c.log_level == "debug" and c.log_level_number == 10
    assert c.sample_interval_s == 2.0 and isinstance(c.sample_interval_s, float)
    assert c.watchdog is False
    assert c.gpu_mtbf_s == 3_600_000.0
    assert c.metrics_listen == ("::1", 0)
    assert (c.scrape_interval_s, c.job_series_grace_s) == (15.0, 30.0)  # two scrapes
    assert c.metrics_url == "http://[::1]:0/metrics"
    assert (c.retention_days, c.retention_rows) == (7.0, 50)
    # an exact id's entry wins; a matching glob fills what it leaves unset
    assert c.job_override("bert-base").paused is True
    assert c.job_override("bert-base").pattern == "bert-base"
    assert c.policy_for("bert-base") == "fixed:seconds=600"
    assert c.job_override("bert-large").paused is None
    assert c.job_override("gpt") is None
    assert c.policy_for("bert-large") == "fixed:seconds=600"
    assert c.policy_for("gpt") == "fixed:steps=500+phased"
    assert c.storage["nfs"].path == Path("/mnt/nfs")
    assert c.storage["nfs"].max_concurrent_saves is None
    d = c.as_dict()
    assert d["daemon"]["admin_socket_mode"] == "0600" and d["storage"]["nfs"]["path"] == "/mnt/nfs"


@pytest.mark.parametrize("off", ['"off"', '""', "false", '"disabled"'])
def test_metrics_can_be_switched_off(off: str) -> None:
    c = config.loads(f"[metrics]\nlisten = {off}\n")
    assert c.metrics_listen is None and c.metrics_url is None


# Each bad document, the dotted key the error must name, and words it must contain.
BAD = [
    ("[daemon]\nsockt = '/x'", "daemon.sockt", ["unknown setting", "did you mean 'socket'"]),
    ("[polcy]\ndefault = 'phased'", "polcy", ["unknown section", "did you mean 'policy'"]),
    ("[daemon]\nsample_interval_s = 'fast'", "daemon.sample_interval_s",
     ['"fast" (string)', "must be a number"]),
    ("[daemon]\nsample_interval_s = true", "daemon.sample_interval_s", ["true (boolean)"]),
    ("[daemon]\nsample_interval_s = 0", "daemon.sample_interval_s", ["must be > 0", "0 (integer)"]),
    ("[daemon]\nliveness_timeout_s = 0.5", "daemon.liveness_timeout_s",
     ["at least daemon.sample_interval_s"]),
    ("[daemon]\nlog_level = 'loud'", "daemon.log_level", ["debug, info, warning, error", "'loud'"]),
    ("[daemon]\nstate_dir = 'relative/dir'", "daemon.state_dir", ["absolute path"]),
    ("[daemon]\nsocket = 'tcp://nohost'", "daemon.socket", ["tcp://HOST:PORT"]),
    ("[daemon]\nsocket = 'udp://x:1'", "daemon.socket", ["ipc://PATH"]),
    ("[daemon]\nsocket_mode = '0999'", "daemon.socket_mode", ["octal"]),
    ("[daemon]\nadmin_socket_mode = 0o400", "daemon.admin_socket_mode", ["u+w"]),
    ("[daemon]\nwatchdog = 'yes'", "daemon.watchdog", ["true or false"]),
    ("[daemon]\nmemory_tier_share = 0", "daemon.memory_tier_share", ["> 0"]),
    ("[daemon]\nmemory_tier_share = 1.5", "daemon.memory_tier_share", ["<= 1", "1.5"]),
    ("[policy]\ndefault = 'nosuch'", "policy.default", ["unknown policy 'nosuch'", "fixed"]),
    ("[policy]\ndefault = 'fixed:steps=0'", "policy.default", ["steps must be >= 1"]),
    ("[policy]\ndefault = 'fixed:step=10'", "policy.default", ["no setting 'step'"]),
    ("[metrics]\nlisten = '9465'", "metrics.listen", ["HOST:PORT", "'9465'"]),
    ("[metrics]\nlisten = 'localhost:99999'", "metrics.listen", ["HOST:PORT"]),
    ("[metrics]\nlisten = 9465", "metrics.listen", ["9465 (integer)"]),
    ("[daemon]\ndrain_grace_s = -1", "daemon.drain_grace_s", [">= 0", "-1 (integer)"]),
    ("[metrics]\nscrape_interval_s = 0", "metrics.scrape_interval_s", ["> 0"]),
    ("[metrics]\njob_series_grace_s = -5", "metrics.job_series_grace_s", [">= 0", "-5"]),
    ("[retention]\nrows = 0", "retention.rows", [">= 1"]),
    ("[retention]\nrows = 1.5", "retention.rows", ["must be an integer"]),
    ("[retention]\ndays = -1", "retention.days", ["> 0"]),
    ('[jobs."a*"]\npolicy = "phased:late_every=0"', 'jobs."a*".policy', ["late_every"]),
    ('[jobs."a*"]\npoliccy = "phased"', 'jobs."a*".policcy', ["did you mean 'policy'"]),
    ("[jobs]\nx = 1", 'jobs."x"', ["must be a table"]),
    # hang detection (docs/multiworker.md): positive durations, the cap not below the floor
    ('[jobs."a*"]\nstall_floor_s = 0', 'jobs."a*".stall_floor_s', ["must be > 0", "0 (integer)"]),
    ('[jobs."a*"]\nstall_cap_s = -5.0', 'jobs."a*".stall_cap_s', ["must be > 0", "-5.0"]),
    ('[jobs."a*"]\nstall_floor_s = 60\nstall_cap_s = 30', 'jobs."a*".stall_cap_s',
     ["at least jobs.\"a*\".stall_floor_s (60 s", "30 (integer)"]),
    ('[jobs."a*"]\nstall_cap_s = 5', 'jobs."a*".stall_cap_s', ["at least", "(7 s", "5 (integer)"]),
    ('[jobs."a*"]\nhang_detection = "no"', 'jobs."a*".hang_detection', ['"no" (string)']),
    ("[storage.s]\nmax_concurrent_saves = 1", 'storage."s".path', ["is required"]),
    ("[storage.s]\npath = '/s'\nmax_concurrent_saves = 0", 'storage."s".max_concurrent_saves',
     [">= 1"]),
    ("daemon = 3", "daemon", ["must be a table", "3 (integer)"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "words"), BAD, ids=[b[1] for b in BAD])
def test_errors_name_key_value_and_allowed(text: str, key: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        config.loads(text, source="/etc/adaptd/adaptd.toml")
    err = info.value
    assert err.key == key
    message = str(err)
    assert message.startswith(f"/etc/adaptd/adaptd.toml: {key}: "), message
    for w in words:
        assert w in message, (w, message)


def test_chosen_names_what_the_file_and_the_flags_set_and_nothing_else() -> None:
    """``chosen`` is what ``adaptd serve`` asks before it makes a busy metrics port
    fatal: the keys the file sets and the flags given, never a default."""
    cfg = config.loads('[daemon]\nlog_level = "debug"\n[policy]\ndefault = "daly"\n')
    assert cfg.chosen == {"daemon.log_level", "policy.default"}
    assert config.loads("").chosen == frozenset()
    flagged = cfg.with_overrides(metrics_listen="127.0.0.1:0", drain_grace_s=5)
    assert flagged.chosen == cfg.chosen | {"metrics.listen", "daemon.drain_grace_s"}
    assert cfg.with_overrides().chosen == cfg.chosen
    assert "metrics.listen" in config.loads('[metrics]\nlisten = "off"\n').chosen


def test_drain_grace_zero_in_the_file_means_no_drain_as_on_the_command_line() -> None:
    assert config.loads("[daemon]\ndrain_grace_s = 0").drain_grace_s == 0.0


def test_unknown_key_lists_what_is_allowed_when_nothing_is_close() -> None:
    with pytest.raises(ConfigError, match=r"daemon\.zzz: unknown setting \(allowed here: socket, "):
        config.loads("[daemon]\nzzz = 1")


def test_missing_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found") as info:
        config.load(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(info.value)
    with pytest.raises(ConfigError, match="cannot read config file"):
        config.load(tmp_path)  # a directory
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\nsocket = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML: .*line 1"):
        config.load(bad)


def test_socket_forms(tmp_path: Path) -> None:
    assert config.loads(f'[daemon]\nsocket = "{tmp_path}/s"').socket == f"{tmp_path}/s"
    assert (
        config.loads(f'[daemon]\nsocket = "ipc://{tmp_path}/s"').endpoint == f"ipc://{tmp_path}/s"
    )
    curve = 'curve_secret_key = "/k/server.key_secret"\ncurve_client_keys = "/k/clients"'
    tcp = config.loads(f'[daemon]\nsocket = "tcp://10.0.0.1:5555"\n{curve}')
    assert tcp.endpoint == "tcp://10.0.0.1:5555"
    home = config.loads('[daemon]\nsocket = "~/adaptd.sock"')
    assert home.socket == str(Path.home() / "adaptd.sock")


def test_defaults_follow_the_shared_path_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTD_SOCKET", "ipc:///tmp/elsewhere.sock")
    assert config.from_mapping({}).socket == str(paths.socket_path())
    assert config.from_mapping({}).socket == "/tmp/elsewhere.sock"


def test_command_line_overrides_move_the_admin_socket_and_database(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text(f'[daemon]\nstate_dir = "{tmp_path}/st"\ndb_path = "{tmp_path}/st/x.db"\n')
    c = config.load(f).with_overrides(
        socket=f"ipc://{tmp_path}/s/j.sock",
        state_dir=tmp_path / "other",
        metrics_listen="off",
        drain_grace_s=0,
        policy="fixed:steps=5",
        liveness_timeout_s=12,
        log_level="DEBUG",
    )
    assert c.socket == f"{tmp_path}/s/j.sock"
    assert c.admin_socket == tmp_path / "s" / "j.admin.sock"
    assert c.db_path == tmp_path / "other" / "adaptd.sqlite3"
    assert c.metrics_listen is None and c.drain_grace_s == 0.0
    assert (c.default_policy, c.liveness_timeout_s, c.log_level) == ("fixed:steps=5", 12.0, "debug")
    assert c.with_overrides() == c  # no flag: the file's values
    assert c.with_overrides(metrics_listen="[::1]:0").metrics_listen == ("::1", 0)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"policy": "nope"}, "--policy"),
        ({"liveness_timeout_s": 0}, "--silence-timeout"),
        ({"drain_grace_s": -1}, "--drain-grace"),
        ({"log_level": "loud"}, "--log-level"),
        ({"metrics_listen": "9465"}, "--metrics-listen"),
    ],
)
def test_bad_command_line_override_names_the_flag(flags: dict, named: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(named)):
        config.from_mapping({}).with_overrides(**flags)


def test_admin_socket_elsewhere_than_beside_the_job_socket_is_refused(tmp_path: Path) -> None:
    text = f'[daemon]\nsocket = "{tmp_path}/j.sock"\nadmin_socket = "{tmp_path}/admin.sock"\n'
    with pytest.raises(config.ConfigError, match=re.escape(f"{tmp_path}/j.admin.sock")) as e:
        config.loads(text)
    assert e.value.key == "daemon.admin_socket"


def _uncommented_example() -> config.Config:
    return config.loads(re.sub(r"^#(?=[\w\[])", "", EXAMPLE.read_text(), flags=re.M))


def test_check_config_names_and_writes_each_setting_as_the_file_does() -> None:
    """``serve --check-config`` (text, and ``--json``) uses the file's names: every key of
    the schema under its section, no internal names (``gpu_mtbf_s``), modes as the file
    writes them; and the printed text is a config that reads back to the same settings."""
    cfg = _uncommented_example()
    shown = cfg.as_dict()
    for section, settings in config_schema.SETTINGS.items():
        assert set(shown[section]) == {s.key for s in settings}, section
    for section, (_, settings) in config_schema.TABLES.items():
        assert shown[section], section  # the example sets one of each
        for entry in shown[section].values():
            assert set(entry) == {s.key for s in settings}, section
    assert set(shown) == {"source", "fleet", *config_schema.SECTIONS}  # [fleet]: its own schema
    assert (
        shown["daemon"]["socket_mode"] == "0660" and shown["daemon"]["admin_socket_mode"] == "0600"
    )
    assert shown["policy"]["gpu_mtbf_hours"] == pytest.approx(PRIOR_GPU_MTBF_S / 3600, rel=1e-4)
    assert "gpu_mtbf_s" not in json.dumps(shown) and "0o6" not in json.dumps(shown)
    again = config.loads(cfg.to_toml(), source=cfg.source)
    assert again.as_dict() == shown
    assert again.gpu_mtbf_s == pytest.approx(cfg.gpu_mtbf_s)


def test_the_settings_table_in_the_docs_is_the_schemas() -> None:
    """docs/operations.md's table is generated from the schema (python -m adaptd.config.schema)."""
    assert config_schema.docs_table() in (ROOT / "docs" / "operations.md").read_text()
