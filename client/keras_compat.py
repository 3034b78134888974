"""Keras 3 state that plain TensorFlow async checkpointing misses or trips over.

1. **Repeated async saves.** TF's async checkpoint helper
   (``tensorflow/python/checkpoint/async_checkpoint_helper.py``) keeps an
   ``object_map`` from each variable to its host copy and, from the second save on,
   refreshes the copies inside a ``tf.function`` (``_copy_to_cpu``). Keras 3's
   TensorFlow-backend ``Variable._copy_trackable_to_cpu`` copies its inner
   ``tf.Variable`` correctly but then does ``object_map[self] =
   tf.Variable(object_map[self.value])``: a *new* variable on every call, which a
   ``tf.function`` refuses after its first trace (``ValueError: tf.function only
   supports singleton tf.Variables created on the first call``). We give each Keras
   variable in the checkpoint an instance-level ``_copy_trackable_to_cpu`` that
   copies the inner variable the same way and maps the Keras variable to that same
   host copy. A Keras variable serialises as its inner variable
   (``VARIABLE_VALUE``), so the file layout is exactly the standard one and
   ``tf.train.Checkpoint(model=model).restore(path)`` reads it; it also saves one
   redundant host copy per variable. Only the instances we checkpoint are touched;
   the Keras class is not modified.

2. **SeedGenerator state.** Keras 3 layers such as ``Dropout`` draw their randomness
   from a ``keras.random.SeedGenerator`` whose ``state`` variable is not reachable
   from the model's checkpoint dependencies, so a resumed run would replay the
   dropout masks of step 0. :func:`seed_states` collects those variables so the hook
   checkpoints them next to the model.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def _keras_variable_class() -> type | None:
    # Only if Keras (TF backend) is already loaded: no import of Keras for plain TF users.
    mod = sys.modules.get("keras.src.backend.tensorflow.core")
    return getattr(mod, "Variable", None) if mod is not None else None


def fix_async_copies(trackables: Iterable[Any]) -> int:
    """Make repeated async saves of the Keras variables in ``trackables`` work.

    ``trackables`` is every object the checkpoint reaches (e.g.
    ``tf.train.TrackableView(ckpt).descendants()``). Returns how many variables were
    fixed; idempotent.
    """
    cls = _keras_variable_class()
    if cls is None:
        return 0
    fixed = 0
    for obj in trackables:
        if not isinstance(obj, cls) or "_copy_trackable_to_cpu" in vars(obj):
            continue
        obj._copy_trackable_to_cpu = _SharedHostCopy(obj)
        fixed += 1
    return fixed


class _SharedHostCopy:
    """``_copy_trackable_to_cpu`` for one Keras variable: reuse the inner variable's copy."""

    __slots__ = ("_var",)

    def __init__(self, var: Any) -> None:
        self._var = var

    def __call__(self, object_map: Any) -> None:
        inner = self._var.value
        inner._copy_trackable_to_cpu(object_map)
        object_map[self._var] = object_map[inner]


def _layers(obj: Any) -> list[Any]:
    flatten = getattr(obj, "_flatten_layers", None)
    if flatten is None:
        return []
    return list(flatten(include_self=True, recursive=True))


def seed_states(objects: Iterable[Any]) -> dict[str, Any]:
    """The ``state`` variables of every Keras SeedGenerator in the layers among
    ``objects`` (models included), keyed by a stable name (layer path + index),
    plus Keras' global seed generator if one exists."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for obj in objects:
        for layer in _layers(obj):
            for i, gen in enumerate(getattr(layer, "_seed_generators", ()) or ()):
                state = getattr(gen, "state", None)
                if state is None or id(state) in seen:
                    continue
                seen.add(id(state))
                name = str(getattr(layer, "path", None) or layer.name).replace("/", ".")
                out[f"{name}.{i}"] = state
    state_mod = sys.modules.get("keras.src.backend.common.global_state")
    seed_mod = sys.modules.get("keras.src.random.seed_generator")
    if state_mod is not None and seed_mod is not None:
        gen = state_mod.get_global_attribute(getattr(seed_mod, "GLOBAL_SEED_GENERATOR", ""))
        state = getattr(gen, "state", None)
        if state is not None and id(state) not in seen:
            out["global"] = state
    return out


def build_optimizers(objects: dict[str, Any]) -> None:
    """Build unbuilt Keras optimizers against the model's trainable variables, so a
    restore fills their slots now (as Keras' BackupAndRestore does) instead of
    leaving the values pending until the first step."""
    models = [o for o in objects.values() if hasattr(o, "trainable_variables") and _layers(o)]
    for opt in objects.values():
        if (
            hasattr(opt, "build")
            and hasattr(opt, "apply_gradients")
            and getattr(opt, "built", True) is False
            and len(models) == 1
        ):
            opt.build(models[0].trainable_variables)
