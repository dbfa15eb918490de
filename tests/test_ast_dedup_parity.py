"""Parity with the reference ``PythonASTSimilarity`` (continuous-eval 0.3.14.post2) to 4 decimals.

The reference pins clash with ours, so it lives in its own venv under ``.cache/refenv``
(git-ignored), created on first use (about 30 s with PyPI reachable) and reused afterwards.
The test skips, saying why, only when that venv cannot be created (no PyPI).
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import random
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opsynth.ast_dedup.similarity import Engine, python_ast_similarity
from opsynth.refdata import KERNELBENCH, OPS6K, ROOT, shared_file

REFERENCE = "continuous-eval==0.3.14.post2"
REFENV = ROOT / ".cache" / "refenv"

_RUNNER = textwrap.dedent(
    """
    import json, sys
    from continuous_eval.metrics.code.python import PythonASTSimilarity
    metric = PythonASTSimilarity()
    scores = []
    for line in sys.stdin:
        answer, truth = json.loads(line)
        scores.append(metric.compute(answer=answer, ground_truth_answers=[truth])[
            "Python_AST_Similarity"])
    print(json.dumps(scores))
    """
)


def _python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def _reference_python() -> Path:
    """The reference venv's interpreter, creating the venv once (under a lock)."""
    REFENV.parent.mkdir(parents=True, exist_ok=True)
    with open(REFENV.parent / "refenv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = REFENV / ".installed"
        if marker.is_file() and marker.read_text() == REFERENCE:
            return _python(REFENV)
        venv.EnvBuilder(with_pip=True, clear=True).create(REFENV)
        proc = subprocess.run(
            [str(_python(REFENV)), "-m", "pip", "install", "--quiet", REFERENCE],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot install {REFERENCE} from PyPI: {proc.stderr.strip()[-300:]}")
        marker.write_text(REFERENCE)
        return _python(REFENV)


def _reference_scores(pairs: list[tuple[str, str]]) -> list[float]:
    env = dict(os.environ)
    env["CONTINUOUS_EVAL_DO_NOT_TRACK"] = "true"  # no telemetry
    env["XDG_DATA_HOME"] = str(REFENV / "data")  # its user id file stays in the cache
    proc = subprocess.run(
        [str(_reference_python()), "-c", _RUNNER],
        input="\n".join(json.dumps(p) for p in pairs),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(proc.stdout)


def _model_source(code: str) -> str | None:
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            return ast.get_source_segment(code, node)
    return None


class _Rename(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = f"{node.id}_q"
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = f"{node.arg}_q"
        return node


def _perturb(code: str, rng: random.Random) -> str:
    """A structurally changed variant: renamed names, one statement dropped or duplicated."""
    tree = _Rename().visit(ast.parse(code))
    bodies = [n.body for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and len(n.body) > 1]
    if bodies:
        body = rng.choice(bodies)
        i = rng.randrange(len(body) - 1)
        if rng.random() < 0.5:
            del body[i]
        else:
            body.insert(i, body[i])
    return ast.unparse(tree)


@pytest.fixture(scope="module")
def corpora() -> tuple[list[str], list[str]]:
    kb_path, ops_path = shared_file(KERNELBENCH), shared_file(OPS6K)
    if kb_path is None or ops_path is None:
        pytest.skip("reference data (KernelBench jsonl, Ops-6K parquet) not found")
    kb = [json.loads(line) for line in kb_path.read_text().splitlines() if line.strip()]
    kb_codes = [r["code"] for r in kb if r["level"] <= 3]
    ops = pq.read_table(ops_path, columns=["code"]).column("code").to_pylist()
    return kb_codes, ops


def _pairs(kb: list[str], ops: list[str]) -> list[tuple[str, str]]:
    rng = random.Random(7)
    pairs: list[tuple[str, str]] = []
    for _ in range(120):  # Model classes: what decontamination scores
        pairs.append((_model_source(rng.choice(ops)), _model_source(rng.choice(kb))))
    for _ in range(40):  # whole programs
        pairs.append((rng.choice(ops), rng.choice(kb)))
    for _ in range(40):  # perturbed KernelBench problems against their originals
        original = rng.choice(kb)
        pairs.append((_perturb(original, rng), original))
    for _ in range(40):  # perturbed Ops-6K rows against KernelBench Model classes
        pairs.append((_model_source(_perturb(rng.choice(ops), rng)), _model_source(rng.choice(kb))))
    pairs += [
        ("import torch\n", rng.choice(kb)),  # one significant subtree: the reference gives 0
        ("def f(x):\n    return x + 1\n", "def g(y):\n    return y * 2\n"),
        ("class A:\n    pass\n", "class B:\n    x = 1\n"),
        ("def f(:\n", rng.choice(kb)),  # syntax error: the reference gives -1
    ]
    return [p for p in pairs if p[0] is not None and p[1] is not None]


def test_matches_reference_to_4_decimals(corpora):
    kb, ops = corpora
    pairs = _pairs(kb, ops)
    assert len(pairs) >= 200
    expected = _reference_scores(pairs)
    engine = Engine()
    ours = [python_ast_similarity(a, b, engine) for a, b in pairs]
    mismatches = [
        (i, e, o) for i, (e, o) in enumerate(zip(expected, ours, strict=True)) if abs(e - o) > 1e-4
    ]
    assert not mismatches, f"{len(mismatches)} of {len(pairs)} differ: {mismatches[:5]}"
    exact = sum(e == o for e, o in zip(expected, ours, strict=True))
    print(f"parity: {exact}/{len(pairs)} identical, all within 1e-4", file=sys.stderr)
    assert len({round(e, 4) for e in expected}) > 50  # the pairs span many distinct scores
