"""The KernelBench reference index: what decontamination compares against, stored offline.

The metric only reads AST structure (node types and children), so the index keeps exactly that
for each problem's ``Model`` class, as one shared table of interned trees, plus the problem's
level, id, name and path and a digest of its source. No source text is stored, so the index
can ship with the project and decontamination runs on a fresh machine without network access.

Build it with::

    python -m opsynth.ast_dedup.index --source /path/to/kernelbench.jsonl   # a local export
    python -m opsynth.ast_dedup.index --hub                    # ScalingIntelligence/KernelBench

A structure index is tied to the Python AST grammar it was built with: node types can differ
between minor versions. ``--verify-with python3.12 python3.13`` rebuilds it under each of those
interpreters and records in the index (``meta["pythons"]``) every version that produced the same
structure; loading it under a version not listed warns.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsynth.ast_dedup.source import parse_task_code
from opsynth.ast_dedup.tree import Interner
from opsynth.data import data_file

FORMAT = 1
HUB_DATASET = "ScalingIntelligence/KernelBench"
DEFAULT_INDEX_PATH = data_file("kernelbench_index.json.gz")
DEFAULT_LEVELS = (1, 2, 3)
SOURCE_NOTE = {
    "repository": "github.com/ScalingIntelligence/KernelBench",
    "hub_dataset": HUB_DATASET,
    "commit": "423217d9fda91e0c2d67e4a43bf62f96f6d104f1",
    "folder": "KernelBench/",
    "license": "MIT",
    "copyright": "Copyright (c) 2023 Anne Ouyang, Simon Guo, Azalia Mirhoseini",
    "content": (
        "AST structure (node types and children) of each problem's Model class, with level, "
        "problem_id, name, path and the sha256 of the source; no source text"
    ),
}


class KernelBenchIndexError(ValueError):
    """The index file is missing, malformed, or lacks what was asked of it."""


@dataclass(frozen=True)
class Problem:
    """One KernelBench problem as the index knows it; ``root`` indexes ``KernelBenchIndex.rows``
    (None when the problem has no parseable ``Model`` class)."""

    level: int
    problem_id: int
    name: str
    path: str
    code_sha256: str
    root: int | None

    @property
    def key(self) -> tuple[int, int]:
        return (self.level, self.problem_id)


@dataclass(frozen=True)
class KernelBenchIndex:
    problems: tuple[Problem, ...]
    label_names: tuple[str, ...]
    rows: tuple[tuple[int, ...], ...]
    meta: dict[str, Any]

    @property
    def levels(self) -> list[int]:
        return sorted({p.level for p in self.problems})

    def select(self, levels: Iterable[int]) -> list[Problem]:
        """Problems of ``levels`` that have a Model class, in (level, problem_id) order."""
        wanted = set(levels)
        missing = wanted - set(self.levels)
        if missing:
            raise KernelBenchIndexError(
                f"the KernelBench index has levels {self.levels}, not {sorted(missing)}; "
                "rebuild it with `python -m opsynth.ast_dedup.index --levels ...`"
            )
        chosen = [p for p in self.problems if p.level in wanted and p.root is not None]
        return sorted(chosen, key=lambda p: p.key)

    def intern_into(self, trees: Interner, problems: Sequence[Problem]) -> list[int]:
        """Intern the Model trees of ``problems`` into ``trees``; returns their root ids."""
        return trees.load(
            list(self.label_names), [list(r) for r in self.rows], [p.root for p in problems]
        )

    # -- persistence ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "meta": self.meta,
            "labels": list(self.label_names),
            "nodes": [list(r) for r in self.rows],
            "problems": [
                {
                    "level": p.level,
                    "problem_id": p.problem_id,
                    "name": p.name,
                    "path": p.path,
                    "code_sha256": p.code_sha256,
                    "root": p.root,
                }
                for p in self.problems
            ],
        }

    def save(self, path: Path) -> None:
        """Write gzip'd JSON deterministically (no name or mtime in the gzip header), so
        rebuilding from the same source yields the same bytes."""
        from opsynth.store import write_bytes_atomic  # here: the builder runs on bare Pythons

        blob = json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()
        raw = io.BytesIO()
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(blob)
        write_bytes_atomic(Path(path), raw.getvalue())

    @classmethod
    def load(cls, path: Path | None = None) -> KernelBenchIndex:
        path = Path(path) if path is not None else DEFAULT_INDEX_PATH
        if not path.is_file():
            raise KernelBenchIndexError(
                f"KernelBench index {path} does not exist; build it with "
                "`python -m opsynth.ast_dedup.index --source kernelbench.jsonl`"
            )
        try:
            with gzip.open(path, "rt") as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError, EOFError) as exc:
            raise KernelBenchIndexError(f"KernelBench index {path} is unreadable: {exc}") from exc
        if data.get("format") != FORMAT:
            raise KernelBenchIndexError(f"KernelBench index {path} has format {data.get('format')}")
        meta = data.get("meta", {})
        checked = meta.get("pythons") or [meta.get("python")]
        running = python_version()
        if running not in checked:
            warnings.warn(
                f"KernelBench index built with the AST of Python {', '.join(map(str, checked))}, "
                f"running {running}; rebuild it with this Python for exact scores",
                stacklevel=2,
            )
        problems = tuple(Problem(**p) for p in data["problems"])
        return cls(
            problems=problems,
            label_names=tuple(data["labels"]),
            rows=tuple(tuple(r) for r in data["nodes"]),
            meta=data.get("meta", {}),
        )


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def structure_digest(index: KernelBenchIndex) -> str:
    """A digest of everything the index holds but its ``meta``: equal for two builds whose
    Pythons parse every problem into the same structure."""
    data = index.to_json()
    del data["meta"]
    blob = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


# Run by another interpreter: builds the index from the same source and prints its version and
# the structure's digest. Imports only this module's pure-Python dependencies.
VERIFY = """
import json, sys
sys.path.insert(0, sys.argv[1])
from opsynth.ast_dedup.index import build_index, python_version, read_jsonl, structure_digest
index = build_index(read_jsonl(sys.argv[2]), json.loads(sys.argv[3]))
print(python_version(), structure_digest(index))
"""


def verify_with(
    interpreters: Sequence[str], source: Path, levels: Sequence[int], digest: str
) -> tuple[list[str], list[str]]:
    """The Python versions among ``interpreters`` whose build of ``source`` has ``digest``, and
    one line for each interpreter that did not (failed to run, or parsed differently)."""
    import opsynth

    root = str(Path(opsynth.__file__).resolve().parent.parent)
    same, problems = [], []
    for python in interpreters:
        cmd = [python, "-c", VERIFY, root, str(source), json.dumps(list(levels))]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{python}: did not run ({type(exc).__name__}: {exc})")
            continue
        found = out.stdout.split()
        if out.returncode != 0 or len(found) != 2:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            problems.append(f"{python}: exit {out.returncode}: {tail}")
        elif found[1] != digest:
            problems.append(f"{python}: Python {found[0]} parses KernelBench differently")
        else:
            same.append(found[0])
    return same, problems


def build_index(records: Iterable[dict[str, Any]], levels: Iterable[int]) -> KernelBenchIndex:
    """Index the ``Model`` classes of KernelBench records (``level``, ``problem_id``, ``name``,
    ``code``, optional ``path``) of the given levels."""
    wanted = set(levels)
    trees = Interner()
    entries: list[tuple[dict[str, Any], int | None]] = []
    for rec in records:
        level = int(rec["level"])
        if level not in wanted:
            continue
        parsed = parse_task_code(rec["code"])
        root = trees.add_ast(parsed.model) if parsed.ok else None
        entries.append((rec, root))
    entries.sort(key=lambda e: (int(e[0]["level"]), int(e[0]["problem_id"])))
    roots = [root for _, root in entries if root is not None]
    label_names, rows, new_roots = trees.export(roots)
    remap = dict(zip(roots, new_roots, strict=True))
    problems = tuple(
        Problem(
            level=int(rec["level"]),
            problem_id=int(rec["problem_id"]),
            name=str(rec["name"]),
            path=str(rec.get("path") or ""),
            code_sha256=hashlib.sha256(rec["code"].encode()).hexdigest(),
            root=remap[root] if root is not None else None,
        )
        for rec, root in entries
    )
    meta = {
        "source": SOURCE_NOTE,
        "levels": sorted({p.level for p in problems}),
        "python": python_version(),
        "problems": len(problems),
        "without_model_class": sum(p.root is None for p in problems),
    }
    return KernelBenchIndex(problems, tuple(label_names), tuple(tuple(r) for r in rows), meta)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_hub(levels: Iterable[int]) -> list[dict[str, Any]]:
    """Records from the Hugging Face dataset (splits ``level_<n>``); needs network access."""
    from datasets import load_dataset

    records = []
    for level in sorted(set(levels)):
        for row in load_dataset(HUB_DATASET, split=f"level_{level}"):
            records.append(
                {
                    "level": int(row.get("level", level)),
                    "problem_id": int(row["problem_id"]),
                    "name": row["name"],
                    "path": f"KernelBench/level{level}/{row['problem_id']}_{row['name']}.py",
                    "code": row["code"],
                }
            )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opsynth.ast_dedup.index", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", type=Path, help="KernelBench jsonl (level, problem_id, ...)")
    where.add_argument("--hub", action="store_true", help=f"download {HUB_DATASET}")
    parser.add_argument("--levels", type=int, nargs="+", default=list(DEFAULT_LEVELS))
    parser.add_argument("--out", type=Path, default=DEFAULT_INDEX_PATH)
    parser.add_argument(
        "--verify-with",
        nargs="+",
        default=[],
        metavar="PYTHON",
        help="other interpreters (e.g. python3.12) to rebuild the index under (--source only); "
        "each that gives the same structure is recorded as one the index is exact for",
    )
    args = parser.parse_args(argv)
    if args.verify_with and not args.source:
        print("--verify-with needs --source (a local jsonl)", file=sys.stderr)
        return 2
    records = read_jsonl(args.source) if args.source else read_hub(args.levels)
    index = build_index(records, args.levels)
    if not index.problems:
        print(f"no KernelBench problems of levels {args.levels} in the source", file=sys.stderr)
        return 1
    problems: list[str] = []
    if args.verify_with:
        digest = structure_digest(index)
        same, problems = verify_with(args.verify_with, args.source, args.levels, digest)
        index.meta["pythons"] = sorted({index.meta["python"], *same})
        for line in problems:
            print(f"not recorded: {line}", file=sys.stderr)
    index.save(args.out)
    counts = {lvl: sum(p.level == lvl for p in index.problems) for lvl in index.levels}
    print(
        f"wrote {args.out}: {len(index.problems)} problems {counts}, "
        f"{len(index.rows)} distinct subtrees, {index.meta['without_model_class']} without Model"
        + (f"; exact under Python {', '.join(index.meta['pythons'])}" if args.verify_with else "")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
