"""State that plain TensorFlow async checkpointing misses, trips over or disturbs.

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

2. **tf.data iterators.** The helper's host copy of an iterator is
   ``OwnedIterator(dataset=self._dataset)``: a *second live iterator over the same
   dataset*, refreshed from the training iterator's state at each save call and
   serialised later, by the async thread. Both iterators share the dataset's shuffle
   seed generator (``shuffle(..., reshuffle_each_iteration=True)``), and the
   serialised state includes that generator's *current* value. (a) Creating the copy
   draws from the generator, so every later epoch of the training iterator is
   shuffled differently than without the save. (b) When the training loop crosses an
   epoch boundary before the async thread writes (a save a step or two before the
   boundary, a loaded host), the generator has moved on and the checkpoint holds the
   *next* epoch's seed: a run resumed from it shuffles differently from then on (found
   by tests/faults/test_training_crash.py under load). The fix keeps no second
   iterator: the host copy is the training iterator's serialised state itself, taken
   at the save call into a variant-typed ``tf.Variable`` (``_IteratorState``), which
   the async thread writes as it is. The files are the standard layout
   (``.ATTRIBUTES/ITERATOR_STATE``), read by a plain ``tf.train.Checkpoint``.

3. **SeedGenerator state.** Keras 3 layers such as ``Dropout`` draw their randomness
   from a ``keras.random.SeedGenerator`` whose ``state`` variable is not reachable
   from the model's checkpoint dependencies, so a resumed run would replay the
   dropout masks of step 0. :func:`seed_states` collects those variables so the hook
   checkpoints them next to the model.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "GLOBAL_SEED",
    "build_optimizers",
    "fix_async_copies",
    "seed_states",
]

#: Key of Keras' global seed generator among :func:`seed_states`.
GLOBAL_SEED = "global"


def _keras_variable_class() -> type | None:
    # Only if Keras (TF backend) is already loaded: no import of Keras for plain TF users.
    mod = sys.modules.get("keras.src.backend.tensorflow.core")
    return getattr(mod, "Variable", None) if mod is not None else None


def _owned_iterator_class() -> type | None:
    mod = sys.modules.get("tensorflow.python.data.ops.iterator_ops")
    return getattr(mod, "OwnedIterator", None) if mod is not None else None


def fix_async_copies(trackables: Iterable[Any]) -> int:
    """Install the fixes above on the Keras variables and tf.data iterators among
    ``trackables`` (every object the checkpoint reaches, e.g.
    ``tf.train.TrackableView(ckpt).descendants()``). Call before the first async
    save. Returns how many objects were fixed; idempotent."""
    kv_cls = _keras_variable_class()
    it_cls = _owned_iterator_class()
    fixed = 0
    for obj in trackables:
        if "_copy_trackable_to_cpu" in vars(obj):
            continue
        if kv_cls is not None and isinstance(obj, kv_cls):
            obj._copy_trackable_to_cpu = _SharedHostCopy(obj)
        elif it_cls is not None and isinstance(obj, it_cls) and obj._dataset is not None:
            obj._copy_trackable_to_cpu = _IteratorCopy(obj, it_cls)
        else:
            continue
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


class _IteratorCopy:
    """``_copy_trackable_to_cpu`` for one tf.data iterator: snapshot its state at the
    save call (eagerly on the first save, inside TF's ``_copy_to_cpu`` function later)."""

    __slots__ = ("_cls", "_it")

    def __init__(self, iterator: Any, cls: type) -> None:
        self._it = iterator
        self._cls = cls

    def __call__(self, object_map: Any) -> None:
        it = self._it
        state = it._serialize_to_tensors()["_STATE"]
        if it not in object_map:
            object_map[it] = _iterator_state(it, state)
        else:
            object_map[it].state.assign(state)


def _iterator_state(iterator: Any, state: Any) -> Any:
    """A trackable holding a serialised iterator state, saved under the iterator's own
    keys (its class's legacy saveable name, ``ITERATOR``, + ``_STATE``)."""
    import tensorflow as tf
    from tensorflow.python.checkpoint import saveable_compat

    class _IteratorState(tf.__internal__.tracking.Trackable):
        def __init__(self, value: Any) -> None:
            self.state = tf.Variable(value, trainable=False, shape=tf.TensorShape(None))

        def _serialize_to_tensors(self) -> dict[str, Any]:
            return {"_STATE": self.state.read_value()}

    name = saveable_compat.get_saveable_name(iterator)
    if name is not None:
        _IteratorState = saveable_compat.legacy_saveable_name(name)(_IteratorState)
    return _IteratorState(state)


def _layers(obj: Any) -> list[Any]:
    flatten = getattr(obj, "_flatten_layers", None)
    if flatten is None:
        return []
    return list(flatten(include_self=True, recursive=True))


def seed_states(objects: Mapping[str, Any]) -> dict[str, Any]:
    """The ``state`` variables of every Keras SeedGenerator in the layers among
    ``objects`` (models included), plus Keras' global seed generator if one exists.

    Keys are structural (``<keyword>.<layer index>.<generator index>``, layers in
    the model's own flattening order), not layer names: Keras numbers auto-named
    layers per process (``dropout_3``), so names differ between two models built
    the same way and would not match on restore.
    """
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for key, obj in objects.items():
        for li, layer in enumerate(_layers(obj)):
            for gi, gen in enumerate(getattr(layer, "_seed_generators", ()) or ()):
                state = getattr(gen, "state", None)
                if state is None or id(state) in seen:
                    continue
                seen.add(id(state))
                out[f"{key}.{li}.{gi}"] = state
    state_mod = sys.modules.get("keras.src.backend.common.global_state")
    seed_mod = sys.modules.get("keras.src.random.seed_generator")
    if state_mod is not None and seed_mod is not None:
        gen = state_mod.get_global_attribute(getattr(seed_mod, "GLOBAL_SEED_GENERATOR", ""))
        state = getattr(gen, "state", None)
        if state is not None and id(state) not in seen:
            out[GLOBAL_SEED] = state
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
            # An optimizer created under a tf.distribute strategy makes its slot
            # variables only inside that strategy's scope (RuntimeError otherwise).
            strategy = getattr(opt, "_distribution_strategy", None)
            scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
            with scope:
                opt.build(models[0].trainable_variables)
