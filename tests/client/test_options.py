"""The hook's settings as one frozen, validated object (issue 22): ``HookOptions``, taken
beside the keywords (which keep working, and override it), and the option objects of
the agreement and the restore agreement. Every refusal names the setting and the value.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import tensorflow as tf

from adaptd.client import AdaptiveCheckpointer, HookOptions
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import AgreementOptions
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.restore.job_restore import JobRestoreOptions
from adaptd.core.policy import DEFAULT_SPEC, PolicyError, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("max_to_keep", 0, "max_to_keep must be an integer >= 1 or None, got 0"),
        ("max_to_keep", True, "max_to_keep must be an integer >= 1 or None, got True"),
        ("daemon_timeout", 0, "daemon_timeout must be > 0 seconds, got 0"),
        ("poll_interval", -1, "poll_interval must be > 0 seconds, got -1"),
        ("report_interval", "1", "report_interval must be > 0 seconds, got '1'"),
        ("decide_interval", 0.0, "decide_interval must be > 0 seconds, got 0.0"),
        ("writer_nice", 25, "writer_nice must be .* got 25"),
        ("writer_nice", "low", "writer_nice must be .* got 'low'"),
        ("storage_options", ["endpoint_url"], "storage_options must be a mapping .* got list"),
        ("stall_floor", 0, "stall_floor = 0: must be a positive number of seconds"),
        ("stall_floor", float("nan"), "stall_floor = nan: must be a positive"),
        ("stall_cap", -1.0, "stall_cap = -1.0: must be a positive"),
        ("stall_cap", 5, r"stall_cap = 5 is below stall_floor = 7\.0"),
    ],
)
def test_each_setting_is_checked_and_the_message_names_it(field, value, match):
    with pytest.raises(ValueError, match=match):
        HookOptions(**{field: value})
    with pytest.raises(ValueError, match=match):  # a replacement is checked the same way
        HookOptions().replace(**{field: value})


def test_a_floor_above_the_default_cap_raises_the_cap_with_it():
    """Only ``stall_floor`` set, above the default cap: the cap follows it (no error
    about a cap the user did not set); both set, the cap must be at least the floor."""
    assert HookOptions(stall_floor=400).stall_floor == 400
    with pytest.raises(ValueError, match=r"stall_cap = 10 is below stall_floor = 20"):
        HookOptions(stall_floor=20, stall_cap=10)


def test_a_policy_spec_is_parsed_when_the_settings_are_made():
    with pytest.raises(PolicyError, match="unknown policy"):
        HookOptions(policy="nope")
    with pytest.raises(PolicyError, match="expected a policy spec string or a policy object"):
        HookOptions(policy=3)  # type: ignore[arg-type]


def test_settings_are_frozen_with_a_private_copy_of_what_they_hold():
    storage = {"endpoint_url": "http://a"}
    ranks = ["counter"]
    opts = HookOptions(storage_options=storage, per_rank=ranks)
    storage["endpoint_url"] = "http://b"
    ranks.append("other")
    assert dict(opts.storage_options) == {"endpoint_url": "http://a"}
    assert opts.per_rank == ("counter",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.max_to_keep = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts.storage_options["endpoint_url"] = "http://c"  # type: ignore[index]


def test_every_setting_is_a_documented_keyword_of_the_hook():
    """docs/client.md's options table lists exactly the settings (one list of them)."""
    table = (ROOT / "docs" / "client.md").read_text().split("Options (all keyword):", 1)[1]
    rows = [line for line in table.split("\n\n", 2)[1].splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(HookOptions.names())


def _saved(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("ckpt-*.index"))


def test_the_hook_takes_an_options_object_and_keywords_override_it(tmp_path):
    nodaemon = f"ipc://{tmp_path}/none.sock"
    base = HookOptions(
        max_to_keep=2, policy="fixed:steps=1", socket=nodaemon, handle_sigterm=False,
        daemon_timeout=0.2, save_on_close=False,
    )  # fmt: skip
    v = tf.Variable(1.0)
    for name, keywords, kept in (("object", {}, 2), ("override", {"max_to_keep": 3}, 3)):
        d = tmp_path / name
        with AdaptiveCheckpointer(d, job="opts", options=base, v=v, **keywords) as ckptr:
            assert ckptr.options == base.replace(**keywords)
            ckptr.restore_or_initialize()
            for _ in range(5):
                ckptr.step()
                ckptr.save()  # every step, as fixed:steps=1 plans too
        assert _saved(d) == [f"ckpt-{n}.index" for n in range(6 - kept, 6)], name


def test_options_must_be_a_hook_options(tmp_path):
    with pytest.raises(ValueError, match=r"options must be an adaptd\.client\.HookOptions .* dict"):
        AdaptiveCheckpointer(tmp_path, job="j", options={"max_to_keep": 2}, v=tf.Variable(1.0))


def test_the_parts_options_are_checked_too():
    with pytest.raises(ValueError, match="timeout_s must be > 0 seconds, got 0"):
        AgreementOptions(timeout_s=0)
    with pytest.raises(ValueError, match="slice_s must be > 0 seconds, got -1"):
        AgreementOptions(slice_s=-1)
    with pytest.raises(ValueError, match=r"lead_time_s must be >= 0 seconds, got -0\.5"):
        AgreementOptions(lead_time_s=-0.5)
    with pytest.raises(ValueError, match="offer_timeout_s must be > 0 seconds, got 0"):
        JobRestoreOptions(offer_timeout_s=0)
    with pytest.raises(ValueError, match="restore_timeout_s must be > 0 seconds, got None"):
        JobRestoreOptions(restore_timeout_s=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank 2 is not below world_size 2"):
        Identity("j", 2, 2)


def test_the_policy_choice_of_each_kind_of_policy_argument():
    assert PolicyChoice.of(None) == PolicyChoice(None, parse(DEFAULT_SPEC), DEFAULT_SPEC)
    spec = "fixed:steps=10"
    assert PolicyChoice.of(spec) == PolicyChoice(spec, parse(spec), spec)
    obj = parse(spec)
    chosen = PolicyChoice.of(obj)  # an object cannot be sent: run here, daemon plans ignored
    assert (chosen.spec, chosen.policy, chosen.local_only) == (None, obj, True)
    assert chosen.label == type(obj).__name__
