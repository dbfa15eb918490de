"""Extract seed libraries, each in its own subprocess with a deadline.

A library's adapter is third-party code that may raise, hang or crash the interpreter; a
subprocess per library (``synth.catalog.worker``) contains all three. Its seeds stream back as
JSON lines, so a library killed at ``seeds.library_timeout_s`` keeps every seed it finished
and gets one ``library_timeout`` verdict for the rest; a dead process gets
``library_crashed``. The other libraries are unaffected. Workers stay in the caller's process
group, so a run killed as a group (Ctrl-C, SIGKILL of the group) takes them along instead of
leaving them to load the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import opsynth
from opsynth.config import SeedsConfig
from opsynth.record import Task, Verdict
from opsynth.synth.catalog.plugins import resolve_names
from opsynth.synth.catalog.spec import CatalogSpec
from opsynth.synth.catalog.validate import rejection

# The folder holding the opsynth package (the checkout, or site-packages): the worker's path.
ROOT = Path(opsynth.__file__).resolve().parents[1]


@dataclass
class LibraryResult:
    name: str
    tasks: list[Task] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    elapsed_s: float = 0.0
    status: str = "ok"


@dataclass
class Extraction:
    libraries: list[LibraryResult]

    @property
    def tasks(self) -> list[Task]:
        return [t for lib in self.libraries for t in lib.tasks]

    @property
    def verdicts(self) -> list[Verdict]:
        return [v for lib in self.libraries for v in lib.verdicts]


def extract(names: list[str], cfg: SeedsConfig) -> Extraction:
    """Every named library, ``cfg.workers`` at a time; unknown names raise ValueError."""
    refs = resolve_names(names, cfg)
    workers = cfg.workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(refs) or 1))) as pool:
        results = list(pool.map(lambda item: run_library(*item, cfg), refs.items()))
    return Extraction(results)


def _read_lines(path: Path) -> tuple[list[Task], list[Verdict]]:
    tasks, verdicts = [], []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if row.get("task"):
            tasks.append(Task.from_row(row["task"]))
        verdicts.append(Verdict.from_row(row["verdict"]))
    return tasks, verdicts


def run_library(name: str, ref: str, cfg: SeedsConfig) -> LibraryResult:
    t0 = time.perf_counter()
    library = CatalogSpec(library=name, name=f"<{name}>", kind="function")
    with tempfile.TemporaryDirectory(prefix="opsynth-seeds-") as tmp:
        out = Path(tmp) / "seeds.jsonl"
        out.touch()
        cmd = [
            sys.executable,
            "-m",
            "opsynth.synth.catalog.worker",
            name,
            ref,
            cfg.model_dump_json(),
            str(out),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        status = "ok"
        try:
            _, stderr = proc.communicate(timeout=cfg.library_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
            status = "timeout"
        tasks, verdicts = _read_lines(out)
    if status == "timeout":
        detail = f"killed after {cfg.library_timeout_s:g} s with {len(verdicts)} seeds done"
        verdicts.append(rejection(library, "library_timeout", detail))
    elif proc.returncode != 0:
        status = "crashed"
        tail = (stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        verdicts.append(rejection(library, "library_crashed", tail[0][:300]))
    elif any(v.reason == "library_error" for v in verdicts):
        status = "error"
    return LibraryResult(name, tasks, verdicts, round(time.perf_counter() - t0, 2), status)


def seeds_in_process(operators: list[str], libraries: list[str] | None = None) -> list[Task]:
    """The validated seeds of the named operators, extracted in this process: for tests,
    benchmarks and notebooks that need a few real catalogue seeds without the subprocesses
    and deadlines of a full extraction. Unknown or unrunnable names are left out."""
    from opsynth.synth.catalog.plugins import load_adapter
    from opsynth.synth.catalog.validate import validate

    cfg = SeedsConfig(libraries=libraries or ["torch"], operators=list(operators))
    tasks: list[Task] = []
    for name, ref in resolve_names(cfg.libraries, cfg).items():
        for spec in load_adapter(ref, cfg).specs():
            if spec.name in cfg.operators:
                seed = replace(spec, library=name)
                task, _ = validate(seed, cfg.seed_timeout_s, cfg.fill_uninitialized)
                if task is not None:
                    tasks.append(task)
    return tasks
