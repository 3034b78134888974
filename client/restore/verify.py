"""Is a TensorFlow checkpoint complete and restorable? (``adaptd verify``)

A TF2 checkpoint ``ckpt-N`` is a *tensor bundle*: ``ckpt-N.index``, an SSTable
(LevelDB's table format) whose key ``""`` holds a ``BundleHeaderProto`` (number of
data shards, endianness, format version) and whose other keys are tensor names
mapping to ``BundleEntryProto`` (dtype, shape, shard, offset, size, CRC32C of the
bytes); and ``ckpt-N.data-SSSSS-of-NNNNN``, the shards those entries point into.
See ``tensorflow/core/util/tensor_bundle/tensor_bundle.{h,cc}`` and
``tensorflow/core/protobuf/tensor_bundle.proto``.

What is checked, in order, each failure naming what is wrong:

1. the index: footer magic, every block's masked CRC32C, header and entries parse
   (our own small reader, so a damaged index is reported as such and the size
   check below knows where every tensor should be);
2. the shards: every ``data-SSSSS-of-NNNNN`` the header promises exists and has
   exactly the size the entries imply (the end of the furthest tensor): smaller
   is a truncated write, larger is a file that does not belong to this index;
3. TensorFlow's own reader (:func:`tf.train.load_checkpoint`) opens the index and
   reads every tensor in full, which checks each tensor's CRC32C: flipped bytes
   in a shard are found here;
4. the object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``) of an object-based
   checkpoint names only tensors that are present, so ``Checkpoint.restore``
   finds everything it will look for;
5. for a step of a multi-worker job (``ckpt-N`` with per-rank parts beside it,
   :mod:`adaptd.checkpoints.rank_parts`), every rank's part is there and passes 1-4 too: a
   step missing one rank's part is not complete for the job (``missing_part``).

:func:`verify` never raises for a bad checkpoint: it returns a :class:`Report`
whose ``problems`` say what is wrong. It needs TensorFlow (``adaptd[tensorflow]``).

``verify(path, read_tensors=False)`` is the check the hook runs at every start
(:mod:`adaptd.client.restore.intact`): steps 1, 2 and 4, reading only the object graph and
the step, so its cost is the index's size, not the checkpoint's; flipped bytes in
a shard are then found by TensorFlow's restore itself, which checks every tensor's
CRC32C as it reads it. :func:`candidates` lists what a resume may fall back to.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from adaptd.checkpoints import rank_parts
from adaptd.checkpoints.files import DATA_SHARD, STATE_FILE, state_file_outside, state_file_path
from adaptd.client.restore.sstable import crc32c, read_index

__all__ = [
    "CORRUPTED",
    "MISSING_PART",
    "MISSING_SHARD",
    "MISSING_TENSOR",
    "NO_CHECKPOINT",
    "OVERSIZED",
    "TRUNCATED",
    "UNREADABLE_INDEX",
    "UNREADABLE_TENSOR",
    "Problem",
    "Report",
    "crc32c",
    "find",
    "read_index",
    "verify",
]

#: Kinds of :class:`Problem`, for scripts that branch on them.
NO_CHECKPOINT = "no_checkpoint"
UNREADABLE_INDEX = "unreadable_index"
MISSING_SHARD = "missing_shard"
TRUNCATED = "truncated"
OVERSIZED = "oversized"
CORRUPTED = "corrupted"
UNREADABLE_TENSOR = "unreadable_tensor"
MISSING_TENSOR = "missing_tensor"
MISSING_PART = "missing_part"

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_NUMBERED = re.compile(r"-(\d+)$")
_STEP_NAME = re.compile(r"ckpt-(\d+)")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the checkpoint. ``kind`` is one of the module constants."""

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of :func:`verify`; ``ok`` when ``problems`` is empty."""

    path: str  # what was asked about
    prefix: str | None  # the checkpoint verified (None: none found)
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()  # worth knowing, not wrong (e.g. a fallback was taken)
    tensors: int = 0  # tensors TF's reader lists (slices of one tensor count once)
    tensors_read: int = 0
    data_bytes: int = 0  # bytes in the data shards on disk
    index_bytes: int = 0
    shards: int = 0
    step: int | None = None  # adaptd's global step, when the checkpoint has it
    seconds: float = 0.0
    world_size: int = 1  # ranks whose parts the step has (1: none, one process)
    parts: int = 0  # rank parts checked

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``adaptd verify --json``)."""
        out = asdict(self)
        out["ok"] = self.ok
        return out


# --------------------------------------------------------------------------- finding the checkpoint


def _prefix_of(path: Path) -> Path:
    name = path.name
    if name.endswith(".index"):
        return path.with_name(name[: -len(".index")])
    m = DATA_SHARD.search(name)
    return path.with_name(name[: m.start()]) if m else path


def complete(prefix: str | os.PathLike[str]) -> bool:
    """The index exists and every data shard its file names promise exists (a cheap
    check of a checkpoint's files, without reading them)."""
    prefix = Path(prefix)
    if not Path(f"{prefix}.index").is_file():
        return False
    shards = list(prefix.parent.glob(f"{_glob_escape(prefix.name)}.data-*-of-*"))
    if not shards:
        return False
    m = DATA_SHARD.search(shards[0].name)
    n = int(m.group(2)) if m else 0
    return all(Path(f"{prefix}.data-{i:05d}-of-{n:05d}").is_file() for i in range(n))


def _glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped (for checkpoint names with ``[``)."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def find(path: str | os.PathLike[str]) -> tuple[Path | None, list[str]]:
    """The checkpoint prefix ``path`` means, and notes on how it was chosen.

    A prefix (``ckpts/ckpt-120``, or its ``.index`` / a data file) means itself. A
    directory means the checkpoint its ``checkpoint`` state file names (as
    ``tf.train.latest_checkpoint`` would restore), or, when there is no state
    file or it names a checkpoint whose index is gone, the highest-numbered
    complete one. Returns ``(None, notes)`` when there is none.
    """
    p = Path(path)
    notes: list[str] = []
    if not p.is_dir():
        prefix = _prefix_of(p)
        return (prefix if Path(f"{prefix}.index").is_file() else None), notes
    named = _state_file_names(p, notes)
    if named is not None:
        if Path(f"{named}.index").is_file():
            return named, notes
        notes.append(
            f"the checkpoint state file names {named.name}, which has no index; "
            "tf.train.latest_checkpoint would return None and training would start over"
        )
    numbered = []
    for index in p.glob("*.index"):
        if rank_parts.part_of(index.name):
            continue  # a rank's part: verified with its step
        prefix = index.with_suffix("")
        m = _NUMBERED.search(prefix.name)
        if m and complete(prefix):
            numbered.append((int(m.group(1)), prefix))
    if not numbered:
        return None, notes
    chosen = max(numbered)[1]
    if named is not None or (p / "checkpoint").exists():
        notes.append(f"verified the highest-numbered complete checkpoint, {chosen.name}")
    return chosen, notes


def _state_file_names(directory: Path, notes: list[str]) -> Path | None:
    state = directory / STATE_FILE
    if not state.is_file():
        return None
    try:
        text = state.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        notes.append(f"cannot read the checkpoint state file: {exc.strerror}")
        return None
    named_path = state_file_path(text)
    if named_path is None:
        notes.append("the checkpoint state file names no model_checkpoint_path")
        return None
    outside = state_file_outside(directory, text)
    if outside is not None:
        notes.append(
            f"the checkpoint state file's {outside[0]} is {outside[1]!r}, outside the "
            "directory: ignored (written by another tool, or copied from elsewhere)"
        )
        return None
    named = Path(named_path)
    return named if named.is_absolute() else directory / named


# --------------------------------------------------------------------------- verify


@dataclass
class _Acc:
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, message: str) -> None:
        self.problems.append(Problem(kind, message))


def candidates(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints a resume from ``directory`` may use, newest first.

    The one the ``checkpoint`` state file names (what TensorFlow's
    ``CheckpointManager`` would restore, even when its index is gone) and every
    numbered checkpoint of the same name with an index or a data shard on disk,
    none newer than the named one: a checkpoint written after the state file's
    latest was never recorded as finished. Without a state file, every numbered
    checkpoint. Damaged ones are listed too; :func:`verify` says which.
    """
    d = Path(directory)
    if not d.is_dir():
        return []
    named = _state_file_names(d, [])
    found: dict[Path, tuple[int, str]] = {}  # prefix -> (number, name before it)
    for f in (*d.glob("*.index"), *d.glob("*.data-*-of-*")):
        if rank_parts.part_of(f.name):
            continue  # a rank's part of a step, not a checkpoint of its own
        prefix = _prefix_of(f)
        m = _NUMBERED.search(prefix.name)
        if m:
            found[prefix] = (int(m.group(1)), prefix.name[: m.start()])
    if named is not None:
        m = _NUMBERED.search(named.name)
        if m is None:
            return [named]
        number, stem = int(m.group(1)), named.name[: m.start()]
        found = {p: k for p, k in found.items() if k[1] == stem and k[0] < number}
        found[named] = (number, stem)
    return sorted(found, key=lambda p: found[p], reverse=True)


def verify(
    path: str | os.PathLike[str], *, read_tensors: bool = True, parts: bool = True
) -> Report:
    """Check the checkpoint ``path`` means (see :func:`find`); never raises for a bad
    or missing checkpoint, only for an unexpected fault of TensorFlow itself.

    ``read_tensors=False`` skips reading every tensor in full (step 3 then reads only
    the object graph and the step): the quick check of the module docstring.
    ``parts=False`` checks only that checkpoint, not the ranks' parts of its step.
    """
    t0 = time.perf_counter()
    prefix, notes = find(path)
    acc = _Acc(notes=notes)
    if prefix is None:
        p = Path(path)
        where = (
            f"no complete checkpoint (*.index with all its data shards) in directory {p}"
            if p.is_dir()
            else f"no checkpoint at {p}: {_prefix_of(p)}.index does not exist"
        )
        acc.add(NO_CHECKPOINT, where)
        return Report(str(path), None, tuple(acc.problems), tuple(acc.notes))
    one = _bundle(prefix, acc, read_tensors)
    world, checked = 1, 0
    step_name = _STEP_NAME.fullmatch(prefix.name)
    if parts and step_name:
        world, checked, more = _check_parts(prefix, int(step_name[1]), acc, read_tensors)
        one = _Bundle(*(a + b for a, b in zip(one[:5], more[:5], strict=True)), step=one.step)
    return Report(
        path=str(path),
        prefix=str(prefix),
        problems=tuple(acc.problems),
        notes=tuple(acc.notes),
        tensors=one.tensors,
        tensors_read=one.read,
        data_bytes=one.data_bytes,
        index_bytes=one.index_bytes,
        shards=one.shards,
        step=one.step,
        seconds=time.perf_counter() - t0,
        world_size=world,
        parts=checked,
    )


class _Bundle(NamedTuple):
    """What one checkpoint (a replicated part, or a rank's part) held."""

    tensors: int = 0
    read: int = 0
    data_bytes: int = 0
    index_bytes: int = 0
    shards: int = 0
    step: int | None = None


def _bundle(prefix: Path, acc: _Acc, read_tensors: bool) -> _Bundle:
    """Steps 1-4 for one checkpoint."""
    index = Path(f"{prefix}.index")
    index_bytes = index.stat().st_size
    entries, num_shards = _check_index(index, acc)
    shard_sizes, bad_shards = _check_shards(prefix, entries, num_shards, acc)
    tensors, read, step = _read_tensors(prefix, entries, bad_shards, acc, read_tensors)
    shards = num_shards or len(shard_sizes)
    return _Bundle(tensors, read, sum(shard_sizes.values()), index_bytes, shards, step)


def _check_parts(
    prefix: Path, step: int, acc: _Acc, read_tensors: bool
) -> tuple[int, int, _Bundle]:
    """Step 5: every rank's part of ``step`` (``prefix`` is its replicated part);
    ``(world size, parts checked, their sums)``."""
    names = rank_parts.listing(prefix.parent)
    st = rank_parts.status(names, step)
    if st.world == 1:
        return 1, 0, _Bundle()
    if st.missing:
        acc.add(MISSING_PART, st.why)
    total = _Bundle()
    for rank in st.parts:
        part = prefix.parent / rank_parts.part_name(step, rank, st.world)
        if not rank_parts.written(names, step, rank, st.world):  # a replay note: its base
            base = rank_parts.replay_base(names, step, rank, st.world)
            acc.notes.append(f"{part.name}: rebuilt at restore from step {base} (just in time)")
            if not base:
                continue
            part = prefix.parent / rank_parts.part_name(base, rank, st.world)
        sub = _Acc()
        got = _bundle(part, sub, read_tensors)
        acc.problems += [Problem(x.kind, f"{part.name}: {x.message}") for x in sub.problems]
        acc.notes += [f"{part.name}: {n}" for n in sub.notes]
        total = _Bundle(*(a + b for a, b in zip(total[:5], got[:5], strict=True)))
    return st.world, len(st.parts), total


def _check_index(index: Path, acc: _Acc) -> tuple[dict[str, Any] | None, int | None]:
    """Entries by key (``None`` when the index cannot be parsed) and the shard count."""
    from tensorflow.core.protobuf import tensor_bundle_pb2

    try:
        pairs = read_index(index)
    except (OSError, ValueError) as exc:
        acc.add(UNREADABLE_INDEX, f"{index.name}: {exc}")
        return None, None
    entries: dict[str, Any] = {}
    header = None
    try:
        for key, value in pairs:
            if key == b"":
                header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
            else:
                entries[key.decode("utf-8", "backslashreplace")] = (
                    tensor_bundle_pb2.BundleEntryProto.FromString(value)
                )
    except Exception as exc:  # protobuf's DecodeError, without importing protobuf here
        acc.add(UNREADABLE_INDEX, f"{index.name}: an entry does not parse ({exc})")
        return None, None
    if header is None:
        acc.add(UNREADABLE_INDEX, f"{index.name}: no bundle header (not a tensor bundle index)")
        return None, None
    if header.num_shards < 1:
        acc.add(UNREADABLE_INDEX, f"{index.name}: header says {header.num_shards} data shards")
        return None, None
    return entries, header.num_shards


def _shard_name(prefix: Path, shard: int, n: int) -> Path:
    return Path(f"{prefix}.data-{shard:05d}-of-{n:05d}")


def _check_shards(
    prefix: Path, entries: dict[str, Any] | None, n: int | None, acc: _Acc
) -> tuple[dict[int, int], set[int]]:
    """Sizes of the shards on disk, and the shards found missing or of the wrong size."""
    if n is None:  # index unreadable: count what is there
        found = prefix.parent.glob(f"{_glob_escape(prefix.name)}.data-*-of-*")
        return {i: f.stat().st_size for i, f in enumerate(sorted(found))}, set()
    expected = dict.fromkeys(range(n), 0)
    holders: dict[int, list[str]] = {i: [] for i in range(n)}
    for key, e in (entries or {}).items():
        if e.size == 0 and not e.slices:
            continue
        if e.size and not 0 <= e.shard_id < n:
            acc.add(UNREADABLE_INDEX, f"{key}: in shard {e.shard_id}, but there are only {n}")
            continue
        if e.size:
            expected[e.shard_id] = max(expected[e.shard_id], e.offset + e.size)
            holders[e.shard_id].append(key)
    sizes: dict[int, int] = {}
    bad: set[int] = set()
    for i in range(n):
        f = _shard_name(prefix, i, n)
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            acc.add(MISSING_SHARD, f"{f.name} is missing ({expected[i]} bytes expected)")
            bad.add(i)
            continue
        sizes[i] = size
        if size < expected[i]:
            cut = sorted(k for k in holders[i] if _end(entries, k) > size)
            acc.add(
                TRUNCATED,
                f"{f.name} is truncated: {size} bytes, the index expects {expected[i]} "
                f"({len(cut)} tensor(s) cut off, e.g. {_show(cut[0]) if cut else '?'})",
            )
            bad.add(i)
        elif size > expected[i]:
            acc.add(
                OVERSIZED,
                f"{f.name} is {size} bytes, {size - expected[i]} more than the index "
                f"expects ({expected[i]}): the shard does not belong to this index",
            )
    others = {
        p.name
        for p in prefix.parent.glob(f"{_glob_escape(prefix.name)}.data-*-of-*")
        if not p.name.endswith(f"-of-{n:05d}")
    }
    if others:
        acc.notes.append(f"ignored data files of another shard count: {', '.join(sorted(others))}")
    return sizes, bad


def _end(entries: dict[str, Any] | None, key: str) -> int:
    e = (entries or {})[key]
    return int(e.offset + e.size)


def _show(key: str) -> str:
    """A tensor key for humans (slice keys start with a binary marker)."""
    return repr(key) if not key.isprintable() else key


def _read_tensors(
    prefix: Path,
    entries: dict[str, Any] | None,
    bad_shards: set[int],
    acc: _Acc,
    read_all: bool = True,
) -> tuple[int, int, int | None]:
    """Read every tensor (or, without ``read_all``, only the object graph and the
    step) through TensorFlow's reader (CRC-checked); returns ``(tensors listed,
    tensors read, adaptd's step or None)``."""
    import tensorflow as tf

    from adaptd.client.save.state import STEP_KEY

    try:
        reader = tf.train.load_checkpoint(str(prefix))
        dtypes = reader.get_variable_to_dtype_map()
    except Exception as exc:  # TF raises its own error types for a damaged bundle
        acc.add(UNREADABLE_INDEX, f"TensorFlow cannot open {prefix.name}: {_tf_message(exc)}")
        return 0, 0, None
    skip = _on_shards(entries, bad_shards)
    read = 0
    step = None
    for name in sorted(dtypes):
        if name in skip:
            continue  # already reported with its shard
        if not read_all and name != _OBJECT_GRAPH_KEY and name.split("/", 1)[0] != STEP_KEY:
            continue
        try:
            if dtypes[name] == tf.variant:
                # a tf.data iterator's state: the numpy-based reader cannot convert a
                # variant, TensorFlow's restore op reads it (checking its CRC32C) as is
                value = tf.raw_ops.RestoreV2(
                    prefix=str(prefix), tensor_names=[name], shape_and_slices=[""],
                    dtypes=[tf.variant],
                )  # fmt: skip
            else:
                value = reader.get_tensor(name)
        except Exception as exc:
            msg = _tf_message(exc)
            kind = CORRUPTED if isinstance(exc, tf.errors.DataLossError) else UNREADABLE_TENSOR
            if "checksum" in msg.lower():
                kind = CORRUPTED
            what = "corrupted bytes" if kind == CORRUPTED else "unreadable"
            acc.add(kind, f"tensor {name}: {what} ({msg})")
            continue
        read += 1
        if name.split("/", 1)[0] == STEP_KEY:
            with contextlib.suppress(TypeError, ValueError):  # not a scalar: no step
                step = int(value)
        elif name == _OBJECT_GRAPH_KEY:
            _check_object_graph(value, dtypes, acc)
    return len(dtypes), read, step


def _on_shards(entries: dict[str, Any] | None, shards: set[int]) -> set[str]:
    """Full tensor names with bytes (or slice bytes) on ``shards``."""
    if not shards or not entries:
        return set()
    out = set()
    for key, e in entries.items():
        if e.size and e.shard_id in shards:
            # a slice key is "\x00" + ordered-code(name, slice...): keep the printable name
            out.add(key if key.isprintable() else _slice_owner(key, entries))
    return out


def _slice_owner(key: str, entries: dict[str, Any]) -> str:
    for name, e in entries.items():
        if e.slices and name in key:
            return name
    return key


def _check_object_graph(value: Any, present: dict[str, Any], acc: _Acc) -> None:
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    try:
        graph.ParseFromString(bytes(value))
    except Exception as exc:
        acc.add(CORRUPTED, f"{_OBJECT_GRAPH_KEY} does not parse ({exc})")
        return
    # A saveable may store its attribute under the key plus a suffix: a tf.data
    # iterator's ``.ATTRIBUTES/ITERATOR`` is the tensor ``.ATTRIBUTES/ITERATOR_STATE``.
    names = sorted(present)
    missing = sorted(
        attr.checkpoint_key
        for node in graph.nodes
        for attr in node.attributes
        if attr.checkpoint_key not in present and not _has_prefix(names, attr.checkpoint_key)
    )
    if missing:
        acc.add(
            MISSING_TENSOR,
            f"the object graph names {len(missing)} tensor(s) the index lacks, "
            f"e.g. {missing[0]}: Checkpoint.restore would fail",
        )


def _has_prefix(names: list[str], key: str) -> bool:
    """Whether a name in the sorted ``names`` starts with ``key``."""
    i = bisect.bisect_left(names, key)
    return i < len(names) and names[i].startswith(key)


def _tf_message(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or str(exc)
    return " ".join(msg.split())[:300]
