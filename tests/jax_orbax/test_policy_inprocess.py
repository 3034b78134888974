"""SavePolicy in this process: bad input refused naming the value, and the policy inside
Orbax's own ``AnySavePolicy`` with a real ``CheckpointManager`` (JAX on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd.client.orbax import SavePolicy
from adaptd.core.policy import PolicyError
from jax_orbax.jobs import MISSING


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"job": 5}, "job must be 1-256 characters"),
        ({"job": ""}, "got ''"),
        ({"job": "j", "policy": "fixed:steps=x"}, "'x'"),
        ({"job": "j", "policy": "no-such-policy"}, "no-such-policy"),
        ({"job": "j", "directory": 3}, "directory must be a non-empty path, got 3"),
        ({"job": "j", "poll_interval": -1}, "poll_interval must be > 0 seconds, got -1"),
        ({"job": "j", "agree_timeout": "soon"}, "agree_timeout must be > 0 seconds, got 'soon'"),
    ],
)
def test_bad_input_is_refused_naming_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError) as err:  # PolicyError is a ValueError
        SavePolicy(**kwargs)
    assert named in str(err.value)
    if "policy" in kwargs:
        assert isinstance(err.value, PolicyError)
    if kwargs["job"] == 5:
        assert str(err.value).endswith("got 5")


def test_inside_orbaxs_any_policy_its_plan_counts_from_the_other_policys_save(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``AnySavePolicy([InitialSavePolicy(), ours])``: Orbax's policy saves the first
    step (ours is not even asked then), ours saves on its grid after it; the first
    save is not taken for a resume."""
    pytest.importorskip("orbax.checkpoint", reason=MISSING)
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from orbax.checkpoint.checkpoint_managers import save_decision_policy as sdp

    ours = SavePolicy(job="any", directory=tmp_path, policy="fixed:steps=4",
                      socket=tmp_path / "none.sock")  # fmt: skip
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=sdp.AnySavePolicy([sdp.InitialSavePolicy(), ours]),
        enable_async_checkpointing=False,
    )
    with ocp.CheckpointManager(tmp_path, options=options) as manager:
        for step in range(1, 11):
            manager.save(step, args=ocp.args.StandardSave({"w": jnp.full(4, float(step))}))
        manager.wait_until_finished()
        assert manager.all_steps() == [1, 4, 8]
    ours.close()
    assert [r.step for r in ours.reports] == [4, 8]
    assert all(r.ok and r.bytes > 0 for r in ours.reports)
    assert "starting fresh: no Orbax checkpoint" in capfd.readouterr().err
