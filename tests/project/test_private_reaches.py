"""No module in ``src/tierlog`` reaches into another file's private members.

A name with one leading underscore is its file's business: a class's ``_field`` may be
read and written by the class (``self._field``, ``cls._field``) and by other code of the
same file, never from another file. A reach across files couples the reaching code to
an implementation detail that no interface declares (issue 31: the acceptor wrote
``StreamLog``'s fields, the message store's compaction called ``store._fd``); the fix is
a narrow port the owner implements (``log/acceptor.py:FollowerSink``,
``msgstore/port.py:StoreFiles``).

The check is by name, from the syntax tree: ``x._name`` (and ``from m import _name``)
where ``x`` is not ``self``, ``cls`` or ``super()`` and no definition in the same file
(a function, a class, an assigned name, a ``self._name``/``cls._name`` assignment) has
that name. ``REMAINING`` lists the reaches of ``server/`` that the redesign of issue 31
has not removed yet: it may only shrink, and an entry that no longer matches a reach
fails too, so the list stays true.
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tierlog"

# Private names of other libraries that are their documented or only way in.
FOREIGN = {
    "_make": "namedtuple API (documented; the underscore avoids field-name clashes)",
    "_fields": "namedtuple API",
    "_replace": "namedtuple API",
    "_asdict": "namedtuple API",
    "_SubParsersAction": "argparse: the type of add_subparsers(), for annotations",
    "_jvm": "PySpark: the py4j gateway, the only way to call a JVM API",
    "_jsc": "PySpark: the JavaSparkContext, the only way to reach the Hadoop conf",
    "_ensure_initialized": "PySpark: start the gateway before a session exists",
}

# (file under src/tierlog, private attribute) -> reaches of that file; ClusterService's
# members reached by the services split out of it. Only ever remove entries.
REMAINING = {
    ("server/cluster_admin.py", "_directory"): 5,
    ("server/cluster_gates.py", "_apply"): 1,
    ("server/cluster_gates.py", "_feed"): 3,
    ("server/delayed_service.py", "_new_voters"): 1,
    ("server/deleted_streams.py", "_directory"): 2,
    ("server/deleted_streams.py", "_step_down"): 2,
    ("server/member_changes.py", "_directory"): 6,
    ("server/member_changes.py", "_feed"): 2,
    ("server/member_changes.py", "_lease_thread"): 1,
    ("server/member_changes.py", "_spawn"): 1,
    ("server/member_changes.py", "_step_down"): 3,
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in FOREIGN


def _defined(tree: ast.AST) -> set[str]:
    """Every name a file defines: functions, classes, assigned names, own attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return names


def _own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def reaches_in(source: str, filename: str = "<src>") -> list[tuple[int, str]]:
    """``(line, private name)`` of every reach into another file's private member."""
    tree = ast.parse(source, filename)
    own = _defined(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not _own(node.value) and node.attr not in own:
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, a.name) for a in node.names if _private(a.name))
    return found


@functools.cache
def all_reaches() -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for _line, name in reaches_in(path.read_text(), str(path)):
            counts[(rel, name)] += 1
    return counts


def test_no_private_reach_across_files() -> None:
    counts = all_reaches()
    new = {
        f"{file}: .{name} x{n}"
        for (file, name), n in counts.items()
        if n > REMAINING.get((file, name), 0)
    }
    assert not new, (
        "private members reached from another file (declare what you need as a port the "
        f"owner implements): {sorted(new)}"
    )


def test_remaining_list_is_true() -> None:
    counts = all_reaches()
    stale = {
        f"{file}: .{name} listed x{n}, found x{counts.get((file, name), 0)}"
        for (file, name), n in REMAINING.items()
        if counts.get((file, name), 0) != n
    }
    assert not stale, f"update REMAINING (it may only shrink): {sorted(stale)}"
    assert all(file.startswith("server/") for file, _name in REMAINING)


def test_the_check_sees_a_reach() -> None:
    """The rule itself: what counts as a reach and what does not."""
    source = (
        "from m import _hidden\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, other, log):\n"
        "        other._mine = self._mine + super()._base()\n"  # same file: allowed
        "        log._next_offset = 2\n"  # another file's field
        "        return log._roll(), t._replace(a=1), type(self).__name__\n"
    )
    assert reaches_in(source) == [(1, "_hidden"), (7, "_next_offset"), (8, "_roll")]
