"""Small finished run directories built through the record/store API, for publish and report
tests: the same files, schema and manifest keys as ``opsynth run`` / ``opsynth audit`` write,
with tasks that meet every stage and rejections at several of them. Building one takes
milliseconds; a real CPU run takes minutes (the end-to-end tests cover that path).
"""

from __future__ import annotations

import random
from pathlib import Path

from opsynth.config import RunConfig
from opsynth.funnel import funnel_rows
from opsynth.record import Task, Verdict
from opsynth.store import RunDir, write_tasks, write_verdicts

CODE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """{ops}"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
{body}        return x


batch_size = {batch}


def get_inputs():
    return [torch.randn(batch_size, {width})]


def get_init_inputs():
    return []
'''
OPS = ["torch.relu", "torch.tanh", "torch.sigmoid", "torch.abs", "torch.exp", "torch.sin"]
FILTER_STAGES = ["static", "decontam", "eager", "randomness", "degenerate", "runtime", "compile"]
# candidate index -> (stage, reason) that rejects it; the rest are accepted
REJECT = {
    1: ("static", "forbidden_import"),
    3: ("decontam", "kernelbench_similar"),
    5: ("randomness", "nondeterministic"),
    7: ("runtime", "too_fast"),
    9: ("dedup", "near_duplicate"),
}
DEVICE, TORCH = "cpu:Test CPU", "2.13.0+cpu"


def make_task(rng: random.Random, index: int, audit: bool) -> Task:
    k = rng.randint(1, 3)
    ops = [rng.choice(OPS) for _ in range(k)]
    body = "".join(f"        x = {op}(x)\n" for op in ops)
    code = CODE.format(ops=", ".join(ops), body=body, batch=64 * (index + 1), width=256)
    return Task(
        ops=ops,
        data_source=f"torch#{k}",
        code=code,
        seed_ids=[] if audit else [f"seed{rng.randint(0, 9)}"],
        composer="" if audit else "offline",
        composer_version="" if audit else "0.1.0",
        config_hash="" if audit else RunConfig().config_hash(),
        meta={} if audit else {"round": 0, "batch_size": 64 * (index + 1)},
    )


def measures(stage: str, rng: random.Random, index: int, reason: str) -> dict:
    eager = 10 ** rng.uniform(0.2, 1.8) if reason != "too_fast" else 0.02
    return {
        "decontam": {
            "kb_similarity": 0.95 if reason == "kernelbench_similar" else rng.uniform(0.2, 0.7),
            "kb_nearest_level": 1 + index % 2,
            "kb_nearest_problem_id": 19 + index % 3,
            "kb_nearest_name": ["ReLU", "Tanh", "Sigmoid"][index % 3],
            "kb_threshold": 0.9,
        },
        "runtime": {
            "eager_ms_median": eager,
            "eager_ms_min": eager * 0.9,
            "scaled_ms": eager,
            "speed_factor": 1.0,
            "window_ms": [0.1, 1000.0],
            "device_name": "Test CPU",
        },
        "compile": {
            "compiled_ms_median": eager / 1.5,
            "speedup": 1.5,
            "compile_s": 4.0,
            "max_abs_diff": 1e-6,
        },
        "dedup": {"exact_cluster": f"e{index}", "near_cluster": f"n{index}"},
    }.get(stage, {})


def timed_in_verify(stage: str, rng: random.Random, index: int, reason: str) -> dict:
    """A stage's measures where verify times the task (``filters.timing_in_verify``): the
    runtime and compiled timings on verify's row, none on compile's."""
    if stage == "verify":
        compiled = measures("compile", rng, index, reason)
        timed = {k: compiled[k] for k in ("compiled_ms_median", "speedup")}
        return {**measures("runtime", rng, index, reason), **timed, "judged_ms": 1.0}
    found = measures(stage, rng, index, reason)
    return {k: v for k, v in found.items() if k not in ("compiled_ms_median", "speedup")}


def judge(
    task: Task,
    rng: random.Random,
    index: int,
    audit: bool,
    reject: dict | None = None,
    verify_times: bool = False,
) -> list[Verdict]:
    stop_stage, stop_reason = (REJECT if reject is None else reject).get(index, ("", ""))
    filters = FILTER_STAGES
    if verify_times:
        filters = [s for s in FILTER_STAGES if s != "runtime"] + ["verify"]
        stop_stage = "verify" if stop_stage == "runtime" else stop_stage
    stages = (["compose"] if not audit else []) + filters + ["dedup"]
    measured = timed_in_verify if verify_times else measures
    verdicts = []
    for stage in stages:
        failed = stage == stop_stage
        verdicts.append(
            Verdict(
                task.id,
                stage,
                not failed,
                stop_reason if failed else "ok",
                f"{stop_reason} at {stage}" if failed else "",
                measured(stage, rng, index, stop_reason if failed else ""),
                device=DEVICE if stage in filters[2:] else "",
                torch_version=TORCH if stage in filters[2:] else "",
            )
        )
        if failed:
            break
    return verdicts


def make_run(
    root: Path,
    *,
    seed: int = 0,
    n: int = 12,
    audit: bool = False,
    target: int | None = None,
    tasks: list[Task] | None = None,
    reject: dict[int, tuple[str, str]] | None = None,
    verify_times: bool = False,
) -> Path:
    """A finished run of ``n`` candidates at ``root``: five rejected (static, decontam,
    randomness, runtime, dedup), the rest accepted; ``target`` caps them with over_target.
    ``tasks``: these candidates instead (an audit of a given set); ``reject``: candidate
    index -> (stage, reason) instead of the five; ``verify_times``: timed in verify
    (``filters.timing_in_verify``: no runtime stage, its rejections verify's)."""
    rng = random.Random(seed)
    cfg = RunConfig()
    run = RunDir.create(root)
    candidates = tasks or [make_task(rng, i + 100 * seed, audit) for i in range(n)]
    n = len(candidates)
    verdicts: list[Verdict] = []
    accepted: list[Task] = []
    for index, task in enumerate(candidates):
        rows = judge(task, rng, index, audit, reject, verify_times)
        verdicts += rows
        if all(v.passed for v in rows):
            accepted.append(task)
    if target is not None:
        verdicts += [Verdict(t.id, "export", False, "over_target") for t in accepted[target:]]
        accepted = accepted[:target]
    for task in accepted:
        mine = [v for v in verdicts if v.task_id == task.id]
        filters = {v.stage: v.measures for v in mine if v.measures}
        task.meta = {**task.meta, "filters": {**filters, "device": DEVICE, "torch_version": TORCH}}
    rejected = [t for t in candidates if t not in accepted]
    write_tasks([], run.path("seeds.parquet"))
    write_tasks(candidates, run.path("candidates.parquet"))
    write_verdicts(verdicts, run.path("verdicts.parquet"))
    write_tasks(accepted, run.path("accepted.parquet"))
    write_tasks(rejected, run.path("rejected.parquet"))
    manifest = {
        "status": "complete",
        "config": cfg.model_dump(mode="json"),
        "config_hash": cfg.config_hash(),
        "device": "cpu",
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:10:00+00:00",
        "versions": {"opsynth": "0.1.0", "python": "3.11", "torch": TORCH, "cuda": "None"},
        "counts": {
            "seeds": 0,
            "candidates": len(candidates),
            "accepted": len(accepted),
            "rejected": len(rejected),
        },
        "funnel": funnel_rows(verdicts),
        "filters_runtime": {"device_name": "Test CPU", "sandbox": "rlimits"},
    }
    if audit:
        manifest |= {"kind": "audit", "source": "ops6k.parquet", "input_rows": n}
    run.write_manifest(manifest)
    return root
