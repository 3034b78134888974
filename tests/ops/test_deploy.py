"""Alert rules (promtool check + unit tests) and the Grafana dashboard, against real metrics."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from adaptd.metrics.exporter import Metrics

from ._tools import ROOT, run, tool

RULES = ROOT / "deploy" / "prometheus" / "adaptd-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "adaptd-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "adaptd-dashboard.json"

#: Series that come from Prometheus itself, not from adaptd.
PROMETHEUS_OWN = {"up"}


def adaptd_names(expr: str) -> set[str]:
    return set(re.findall(r"\badaptd_[a-z0-9_]+", expr))


def rule_exprs() -> list[str]:
    # the rules file is plain YAML; its expressions are the "expr:" blocks
    text = RULES.read_text()
    exprs = re.findall(r"expr: \|\n((?:\s{10}.*\n)+)|expr: (.+)\n", text)
    return [(block or line).strip() for block, line in exprs]


def dashboard_exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def test_rules_pass_promtool_check() -> None:
    res = run(tool("promtool"), "check", "rules", RULES)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 7 rules found" in res.stdout


def test_rule_unit_tests_pass() -> None:
    res = run(tool("promtool"), "test", "rules", RULE_TESTS)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rule_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The unit tests bite: a rule with the wrong factor fails them."""
    promtool = tool("promtool")
    text = RULES.read_text()
    assert "> 2 * adaptd_job_interval_seconds" in text
    (tmp_path / RULES.name).write_text(text.replace("> 2 * adaptd_job", "> 3 * adaptd_job"))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    res = run(promtool, "test", "rules", tmp_path / RULE_TESTS.name)
    assert res.returncode != 0
    assert "AdaptdNoRecentSave" in res.stdout + res.stderr


def test_every_alert_the_issue_asks_for_exists() -> None:
    text = RULES.read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    assert alerts == [
        "AdaptdSaveBlockedLoop",  # a save blocked the loop over 5 s
        "AdaptdSavesFailingOrSlow",  # three slow or failed saves in a row
        "AdaptdNoRecentSave",  # no save for more than twice the planned interval
        "AdaptdReplicationLagging",  # tiered storage: a destination over an hour behind
        "AdaptdReplicationFailing",  # tiered storage: uploads failing, none succeeding
        "AdaptdDown",  # adaptd down
        "AdaptdTargetMissing",
    ]
    assert 'le="5.0"' in text  # the 5 s threshold is the histogram's bucket boundary
    assert "adaptd_job_bad_save_streak >= 3" in text
    # every alert is exercised by the unit tests
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == set(alerts)


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name the daemon's registry can expose."""
    return Metrics().names()


def test_rules_reference_only_exported_metrics(exported: set[str]) -> None:
    exprs = rule_exprs()
    assert len(exprs) == 7
    used = set().union(*(adaptd_names(e) for e in exprs))
    assert used, exprs
    assert used - exported == set()


def test_dashboard_is_valid_and_references_only_exported_metrics(exported: set[str]) -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for p in d["panels"]:
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            names = adaptd_names(t["expr"])
            assert names, t["expr"]
            used |= names
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            used |= adaptd_names(v["definition"])
    assert used - exported == set()
    titles = " | ".join(p["title"].lower() for p in d["panels"])
    for wanted in ("save time", "interval", "waste", "gpu utilisation"):
        assert wanted in titles


def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    """Each panel query becomes a recording rule, so promtool parses every one."""
    promtool = tool("promtool")
    exprs = dashboard_exprs()
    subst = {"$__rate_interval": "5m", "$instance": ".*", "$job_id": ".*"}
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, e in enumerate(exprs):
        for k, v in subst.items():
            e = e.replace(k, v)
        assert "$" not in e, e
        lines += [f"      - record: dashboard:query{i}", f"        expr: {json.dumps(e)}"]
    f = tmp_path / "dashboard-rules.yml"
    f.write_text("\n".join(lines) + "\n")
    res = run(promtool, "check", "rules", f)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in res.stdout
