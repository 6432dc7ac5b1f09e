"""The layer rule of docs/design.md ("Where things live"), read from the package's imports.

- The node side (trace, collectors, push, sink) never imports fleet or echo, and neither
  does any other part but the CLI (the one place that wires the daemons up).
- fleet and echo never import each other: what passes between them is an OTLP contract.
- The contracts (otlp/, schema/) and the leaf helpers (security/, runtime/, sqlite/) may
  be imported by everyone, so they import nothing but each other. No module lies loose at
  ingero's root: each helper belongs to the leaf package named for what it is for.

Every import counts: module level, inside functions (the CLI's lazy ones) and under
TYPE_CHECKING.

- The node DB is the node's contract, as otlp/ is the wire's: no SQL on a node-DB table
  (a merged DB's too: the same tables with node, job_id and rank) outside ingero/nodedb/.
  ``ingero query --sql`` runs the user's SQL; what ingero writes itself lives there.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator
from pathlib import Path

from ingero.nodedb.merged import MERGED_TABLE
from ingero.nodedb.schema import connect

PACKAGE = Path(__file__).resolve().parents[3] / "ingero"

NODE_SIDE = frozenset({"trace", "collectors", "push", "sink", "annotate"})
DAEMONS = frozenset({"fleet", "echo"})
CONTRACTS = frozenset({"otlp"})
# Leaf packages: what every part may import.
LEAF_PACKAGES = frozenset({"security", "runtime", "sqlite", "schema"})
COMPOSITION_ROOT = "cli"


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    """The part a module belongs to: its subpackage, or the leaf module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, imported ingero module) for every import in the file, resolved."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # ``from ingero import nodedb`` imports ingero.nodedb
                yield node.lineno, f"{base}.{alias.name}" if base == "ingero" else base


def violations(root: Path = PACKAGE) -> list[str]:
    leaves = LEAF_PACKAGES | {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    found = []
    for path in sorted(root.rglob("*.py")):
        here = part_of(module_name(path, root))
        for line, target in sorted(set(imports(path, root))):
            if target != "ingero" and not target.startswith("ingero."):
                continue
            there = part_of(target)
            if there == here or there in ("", "__version__"):
                continue
            where = f"{path.relative_to(root.parent)}:{line} imports {target}"
            if there in DAEMONS and here in DAEMONS:
                found.append(f"{where}: fleet and echo never import each other")
            elif there in DAEMONS and here in NODE_SIDE:
                found.append(f"{where}: the node side never imports fleet or echo")
            elif (here in CONTRACTS or here in leaves) and not (
                there in CONTRACTS or there in leaves
            ):
                found.append(f"{where}: contracts and leaf helpers import only each other")
            elif there in DAEMONS and here != COMPOSITION_ROOT:
                found.append(f"{where}: only the CLI wires the daemons up")
    return found


def test_the_layer_rule_holds() -> None:
    assert violations() == []


def test_no_module_lies_loose_at_the_root() -> None:
    """A helper goes in the leaf package named for what it is for (LEAF_PACKAGES)."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    assert all((PACKAGE / name / "__init__.py").is_file() for name in LEAF_PACKAGES)


def where_things_live(design: Path = PACKAGE.parent / "docs" / "design.md") -> str:
    """The map of design.md's "Where things live": its first code block."""
    section = design.read_text().split("\n## Where things live\n", 1)[1]
    return section.split("```", 2)[1]


def test_the_map_of_where_things_live_names_every_package() -> None:
    """A newcomer finds each part on the map: a package missing from it (as ingero/cluster/
    once was) or one renamed without it fails here. Names are spelled ``fanout/``."""
    mapped = set(re.findall(r"([a-z_]+)/", where_things_live()))
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert sorted(packages - mapped) == []


def test_both_daemons_receive_and_both_senders_export_through_the_otlp_cores() -> None:
    """One receiver core (Fleet and Echo) and one exporter core (fleet-push and Fleet's
    forwarder to Echo): a second copy of either would show as a part that stopped using it."""
    users: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = module_name(path, PACKAGE)
        for _, target in imports(path, PACKAGE):
            users.setdefault(target, set()).add(here)
    assert {"ingero.fleet.otlp_http", "ingero.fleet.grpc_server", "ingero.echo.ingest"} <= users[
        "ingero.otlp.receiver"
    ]
    assert {"ingero.push.client", "ingero.fleet.forwarder"} <= users["ingero.otlp.exporter"]


def test_the_rule_reads_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself, on a small package: lazy, TYPE_CHECKING and relative imports are
    all seen, and each rule names itself."""
    root = tmp_path / "ingero"
    files = {
        "__init__.py": "",
        "events.py": "from ingero.push import agent\n",
        "push/__init__.py": "",
        "push/agent.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ingero.fleet import model\n"
            "def f() -> None:\n    import ingero.echo.store\n"
            "from ..fleet import state\nfrom ingero import otlp, events\n"
        ),
        "fleet/__init__.py": "",
        "fleet/model.py": "from ingero.echo import store\n",
        "echo/__init__.py": "",
        "echo/store.py": "",
        "slurm/__init__.py": "",
        "slurm/drain.py": "from ingero.fleet.config import DrainConfig\n",
        "cli/__init__.py": "",
        "cli/main.py": "from ingero.fleet import model\nfrom ingero.echo import store\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert violations(root) == [
        "ingero/events.py:1 imports ingero.push: contracts and leaf helpers import only each other",
        "ingero/fleet/model.py:1 imports ingero.echo: fleet and echo never import each other",
        "ingero/push/agent.py:3 imports ingero.fleet: the node side never imports fleet or echo",
        "ingero/push/agent.py:5 imports ingero.echo.store: the node side never imports fleet or echo",
        "ingero/push/agent.py:6 imports ingero.fleet: the node side never imports fleet or echo",
        "ingero/slurm/drain.py:1 imports ingero.fleet.config: only the CLI wires the daemons up",
    ]


def part_cycles(root: Path = PACKAGE) -> list[str]:
    """Pairs of parts that import each other (``a <-> b``): the parts must form layers, so a
    part's place is clear from what it uses (a sampler that needs the tracer's tags lives
    with the tracer, not in the collectors the tracer itself uses)."""
    uses: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        here = part_of(module_name(path, root))
        for _, target in imports(path, root):
            if target == "ingero" or not target.startswith("ingero."):
                continue
            there = part_of(target)
            if there not in (here, "", "__version__"):
                uses.setdefault(here, set()).add(there)
    return sorted(
        f"{a} <-> {b}" for a, used in uses.items() for b in used if a < b and a in uses.get(b, ())
    )


def write_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A small ``ingero`` package of ``files`` (path: text) under ``tmp_path``; its root."""
    root = tmp_path / "ingero"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_no_two_parts_import_each_other() -> None:
    assert part_cycles() == []


def test_a_cycle_between_parts_is_found(tmp_path: Path) -> None:
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "trace/__init__.py": "",
            "trace/tracer.py": "from ingero.collectors.gpusampler import GpuRows\n",
            "collectors/__init__.py": "",
            "collectors/gpusampler.py": "def f() -> None:\n    from ingero.trace import tags\n",
        },
    )
    assert part_cycles(root) == ["collectors <-> trace"]


def imported_modules(path: Path, root: Path, known: set[str]) -> Iterator[str]:
    """Every module of ``known`` the file imports: ``from ingero.slurm import backend``
    names the module ``ingero.slurm.backend``, ``from ingero.slurm.backend import X`` a
    member of that module."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base


def module_cycles(root: Path = PACKAGE) -> list[str]:
    """Modules that import each other, directly or round a longer circle (every import
    counts, a function's lazy one too): each circle as its modules, sorted, joined by
    ``<->``. A circle means neither module can be read, tested or moved without the other;
    the lazy import that hides one from Python's import machinery does not make it one
    module less."""
    paths = {module_name(path, root): path for path in root.rglob("*.py")}
    # A package's __init__ is not a module of the circles: Python imports it before any of
    # its modules, and an __init__ that imports its own modules is no circle anyone reads.
    modules = {name for name, path in paths.items() if path.name != "__init__.py"}
    uses: dict[str, set[str]] = {}
    for name in sorted(modules):
        for target in imported_modules(paths[name], root, set(paths)):
            if target in modules and target != name:
                uses.setdefault(name, set()).add(target)
    # Tarjan's strongly connected components, iterative (no recursion limit to meet).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[str] = []
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(uses.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(uses.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        circles.append(" <-> ".join(sorted(members)))
    return sorted(circles)


def test_no_import_circle_between_modules() -> None:
    assert module_cycles() == []


def test_an_import_circle_between_modules_is_found(tmp_path: Path) -> None:
    """A lazy import closing a circle of three counts, a package's __init__ does not."""
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "slurm/__init__.py": "from ingero.slurm import backend\n",
            "slurm/backend.py": "def make() -> None:\n    from ingero.slurm.pyslurm_backend import P\n",
            "slurm/pyslurm_backend.py": "from ingero.slurm import worker\n",
            "slurm/worker.py": "from ingero.slurm.backend import SlurmError\n",
            "slurm/drain.py": "from ingero.slurm.backend import make\n",
        },
    )
    assert module_cycles(root) == [
        "ingero.slurm.backend <-> ingero.slurm.pyslurm_backend <-> ingero.slurm.worker"
    ]


# SQL: a statement's keyword, then a table after FROM, INTO, JOIN, UPDATE, TABLE or
# table_info( (quoted or not); or a table named at run time there (an f-string's field).
_SQL_KEYWORD = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|PRAGMA|WITH)\b")
_TABLE_AT = r"(?i)\b(?:from|into|join|update|table|table_info\()\s*[\"'`]?"
NODE_DB_PACKAGE = "nodedb"


def node_db_tables(tmp: Path) -> frozenset[str]:
    """The tables of a node DB as the schema makes it, and the merged DB's own."""
    db = connect(tmp / "schema.db")
    try:
        names = set(db.table_names())
    finally:
        db.conn.close()
    return frozenset({*names, MERGED_TABLE})


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string but docstrings; an f-string with ``{}`` for its fields."""
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    parts: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts.update(id(v) for v in node.values)
            text = "".join(
                str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values
            )
            yield node.lineno, str(text)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs | parts
        ):
            yield node.lineno, node.value


def _named(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def sql_outside_nodedb(root: Path, tables: Collection[str]) -> list[str]:
    """Where a module outside ``nodedb/`` runs SQL on a node-DB table: in a string (SQL by
    its keywords), through sqlite-utils (``db.table("t")``, ``db["t"]``), or on a table it
    names at run time. The daemons (fleet, echo) never import the node side's nodedb, so
    the tables they name at run time are their own stores'."""
    names = "|".join(sorted(tables))
    literal = re.compile(rf"{_TABLE_AT}({names})\b")
    dynamic = re.compile(rf"{_TABLE_AT}\{{")
    found = []
    for path in sorted(root.rglob("*.py")):
        part = part_of(module_name(path, root))
        if part == NODE_DB_PACKAGE:
            continue
        where = path.relative_to(root.parent)
        tree = ast.parse(path.read_text(), str(path))
        hits = set()
        for line, text in _strings(tree):
            if not _SQL_KEYWORD.search(text):
                continue
            if m := literal.search(text):
                hits.add((line, f"SQL on {m.group(1)}"))
            elif part not in DAEMONS and dynamic.search(text):
                hits.add((line, "SQL on a table named at run time"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "table"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in tables
            ):
                hits.add((node.lineno, f"sqlite-utils on {node.args[0].value!s}"))
            elif (
                isinstance(node, ast.Subscript)
                and _named(node.value).endswith("db")
                and isinstance(node.slice, ast.Constant)
                and node.slice.value in tables
            ):
                hits.add((node.lineno, f"sqlite-utils on {node.slice.value!s}"))
        found += [f"{where}:{line}: {what}" for line, what in sorted(hits)]
    return found


def test_no_sql_on_the_node_db_outside_its_package(tmp_path: Path) -> None:
    assert sql_outside_nodedb(PACKAGE, node_db_tables(tmp_path)) == []


def test_sql_on_the_node_db_is_found_in_every_form(tmp_path: Path) -> None:
    """The checker itself: plain, f-string, multi-line and sqlite-utils forms are found;
    docstrings, prose, nodedb/ itself and the daemons' own tables are not."""
    root = tmp_path / "ingero"
    files = {
        "__init__.py": "",
        "nodedb/__init__.py": "",
        "nodedb/window.py": 'Q = "SELECT * FROM intervals"\n',
        "push/__init__.py": "",
        "push/reader.py": (
            '"""Reads SELECT ts FROM intervals (a docstring)."""\n'
            'A = "SELECT max(ts) FROM host_intervals"\n'
            'def f(t: str) -> str:\n    return f"DELETE FROM {t} WHERE ts < ?"\n'
            'B = """\nSELECT pid\nFROM\n  nccl_comms\n"""\n'
            "C = f\"SELECT {A} FROM 'marks' WHERE x\"\n"
            'D = "the rows come from intervals"\n'
            'E = "PRAGMA table_info(gpu_intervals)"\n'
        ),
        "workload/__init__.py": "",
        "workload/runner.py": (
            "def g(db, self) -> None:\n"
            '    db.table("processes").upsert({}, pk="pid")\n'
            '    self._db["stacks"].insert({})\n'
            '    event = {}\n    event["stacks"]\n'
        ),
        "echo/__init__.py": "",
        "echo/sql.py": 'def h(t: str) -> str:\n    return f"SELECT * FROM {t}"\n',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    tables = {"intervals", "host_intervals", "nccl_comms", "marks", "gpu_intervals",
              "processes", "stacks"}  # fmt: skip
    assert sql_outside_nodedb(root, tables) == [
        "ingero/push/reader.py:2: SQL on host_intervals",
        "ingero/push/reader.py:4: SQL on a table named at run time",
        "ingero/push/reader.py:5: SQL on nccl_comms",
        "ingero/push/reader.py:10: SQL on marks",
        "ingero/push/reader.py:12: SQL on gpu_intervals",
        "ingero/workload/runner.py:2: sqlite-utils on processes",
        "ingero/workload/runner.py:3: sqlite-utils on stacks",
    ]


def test_the_node_db_tables_checked_are_the_schemas(tmp_path: Path) -> None:
    """A table a new schema version adds is checked without a line here."""
    assert {"intervals", "nccl_comms", "stacks", "marks", "engines", "stream_intervals",
            MERGED_TABLE} <= node_db_tables(tmp_path)  # fmt: skip
