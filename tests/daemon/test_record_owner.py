"""A job's record changes only through its own methods (issue 22: "the Job record changed
from seven modules").

:class:`~adaptd.daemon.jobs.table.Job` and :class:`~adaptd.daemon.jobs.table.Rank` say,
in :mod:`adaptd.daemon.jobs.table`, every way they change (a rank joined, a save was
counted, a plan was pushed, the job was lost); every other module of the runtime only
reads them. This reads the runtime's source and fails on a write to one of their fields
from anywhere else: an assignment (``job.urgent = ...``), an augmented one, a ``del``, or
a mutating call on one of their containers (``job.ranks.pop(...)``), on the names the
code gives jobs and ranks.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from adaptd.daemon.jobs.table import Job, Rank

ROOT = Path(__file__).resolve().parents[2]
#: The module of the records, where only the records' own classes may change them
#: (the job table beside them is held to the rule like every other part).
RECORDS = ROOT / "adaptd" / "daemon" / "jobs" / "table.py"
OWNERS = {"Job", "Rank"}
#: What the runtime calls a job or a rank record.
NAMES = {"job", "j", "rank", "r", "rk", "old", "replaced"}
FIELDS = {f.name for f in dataclasses.fields(Job)} | {f.name for f in dataclasses.fields(Rank)}
MUTATORS = {"add", "discard", "clear", "pop", "popitem", "update", "append", "remove",
            "setdefault", "extend", "insert"}  # fmt: skip


def _record_field(node: ast.AST) -> str | None:
    """``job.urgent`` (or ``job.ranks[...]``) -> the field, for a record's name."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in NAMES
        and node.attr in FIELDS
    ):
        return node.attr
    return None


def writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every write to a record's field in ``tree``."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in _flat(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _record_field(node.func.value)
        ):
            found.append((node.lineno, ast.unparse(node.func)))
        found += [(node.lineno, ast.unparse(t)) for t in targets if _record_field(t)]
    return found


def _flat(target: ast.AST) -> list[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _flat(e)]
    return [target]


def test_only_the_records_module_changes_a_job_or_a_rank() -> None:
    offenders = []
    for path in sorted((ROOT / "adaptd").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path == RECORDS:
            tree.body = [
                n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name in OWNERS)
            ]
        offenders += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in writes(tree)]
    assert offenders == [], "write these through a method of Job or Rank:\n" + "\n".join(offenders)


def test_the_check_sees_each_kind_of_write() -> None:
    code = (
        "job.urgent = 'x'\n"
        "rank.step += 1\n"
        "del job.ranks[0]\n"
        "job.joined.add(1)\n"
        "a, job.plan = 1, None\n"
        "entry.step = 3\n"  # not a record: a drain's entry
        "self.plan = None\n"  # a record's own method
    )
    assert sorted(writes(ast.parse(code))) == [
        (1, "job.urgent"),
        (2, "rank.step"),
        (3, "job.ranks[0]"),
        (4, "job.joined.add"),
        (5, "job.plan"),
    ]
