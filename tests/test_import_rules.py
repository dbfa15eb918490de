"""The import rules of ARCHITECTURE.md, read from the source with ``ast``: every import, at
module level or inside a function, of every package module. A change that breaks a rule fails
here, naming the file and the import."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# package -> the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "opsynth": set(),
    "synth": {"opsynth"},
    "filters": {"opsynth"},
    "ast_dedup": {"opsynth"},
    "evaluator": {"opsynth", "filters"},
    "trainer": {"opsynth", "filters", "evaluator"},
    "flows": {"opsynth", "synth", "filters", "ast_dedup", "evaluator", "trainer"},
}
ONLY_IN_FLOWS = ("prefect", "prefect_dask")
STAGES = tuple(name for name in ALLOWED if name != "opsynth")


def modules() -> dict[str, Path]:
    found = {}
    for package in ALLOWED:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def raw_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in the file, ``from a import b`` as both
    ``a`` and ``a.b``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def imports(path: Path) -> list[tuple[int, str]]:
    """``raw_imports`` by stage: ``opsynth.filters.judge`` is ``filters.judge``; opsynth's own
    modules (the core) keep their names."""
    found = []
    for line, target in raw_imports(path):
        parts = target.split(".")
        if parts[0] == "opsynth" and len(parts) > 1 and parts[1] in STAGES:
            target = ".".join(parts[1:])
        found.append((line, target))
    return found


def test_every_import_goes_through_the_one_import_name() -> None:
    """The stages are installed as opsynth's subpackages only: an import of a bare stage name
    works in a checkout by accident and fails from the wheel."""
    broken = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for top in (*ALLOWED, "tests", "benchmarks")
        for path in sorted((ROOT / top).rglob("*.py"))
        for line, target in raw_imports(path)
        if target.split(".")[0] in STAGES
    ]
    assert broken == [], "\n".join(broken)


def test_no_package_imports_above_or_beside_itself() -> None:
    broken = []
    for name, path in modules().items():
        package = name.split(".")[0]
        for line, target in imports(path):
            top = target.split(".")[0]
            if top in ALLOWED and top != package and top not in ALLOWED[package]:
                broken.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert broken == [], "\n".join(sorted(set(broken)))


def test_prefect_is_imported_in_flows_only() -> None:
    broken = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for name, path in modules().items()
        if not name.startswith("flows")
        for line, target in imports(path)
        if target.split(".")[0] in ONLY_IN_FLOWS
    ]
    assert broken == [], "\n".join(broken)


def test_no_import_cycles_between_modules() -> None:
    """Imports inside functions count: a cycle they hide is still two modules that each need
    the other."""
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in known.items():
        for _, target in imports(path):
            if target in known and target != name:
                edges[name].add(target)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(known):
        if name not in state:
            visit(name, [])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_rules_catch_a_broken_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from opsynth.evaluator import judge\n    import filters\n")
    assert (2, "evaluator") in imports(bad) and (2, "evaluator.judge") in imports(bad)
    assert (3, "filters") in raw_imports(bad)


def test_a_run_and_an_audit_import_without_polars() -> None:
    """GPU hosts run ``opsynth run`` and ``opsynth audit`` without polars (the report and
    publish need it; the flows that filter and export do not)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['polars'] = None\n"
        "import opsynth.flows.regenerate, opsynth.flows.audit, opsynth.flows.cli\n"
        "from opsynth.rechecked import read_rechecked\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
