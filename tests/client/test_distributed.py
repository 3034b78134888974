"""The hook with a tf.distribute strategy in this process (one CPU replica)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from adaptd.client import AdaptiveCheckpointer  # noqa: E402

pytestmark = pytest.mark.tf


def mirrored_state(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        opt = keras.optimizers.Adam(1e-2)
    return model, opt


def test_resume_builds_the_optimizer_inside_its_strategy(tmp_path) -> None:
    # Keras makes a distributed optimizer's slots only inside its strategy's scope;
    # the restore builds the optimizer first (so its slots are restored at once) and
    # raised "Need to be inside with strategy.scope()" for a restore outside it.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    model, opt = mirrored_state(strategy)

    @tf.function
    def train_step():
        def fn():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(tf.ones((2, 4))) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(fn)

    options = dict(
        job="mirrored",
        policy="fixed:steps=2",
        socket=f"ipc://{tmp_path}/none.sock",
        daemon_timeout=0.2,
        handle_sigterm=False,
    )
    with AdaptiveCheckpointer(tmp_path / "ck", model=model, optimizer=opt, **options) as ckptr:
        ckptr.restore_or_initialize()
        for _ in range(4):
            train_step()
            ckptr.step()
    model2, opt2 = mirrored_state(strategy)
    with AdaptiveCheckpointer(tmp_path / "ck", model=model2, optimizer=opt2, **options) as ckptr:
        assert ckptr.restore_or_initialize() == 4
        for a, b in zip(opt.variables, opt2.variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
