"""Decontamination and dedup of a candidate pool in one pass over the code.

Parsing dominates the cost of both stages, so when they run back to back (screening a large
pool before the expensive execution filters, so duplicates are never executed) each distinct
code string is parsed once and both the nearest KernelBench problem and the dedup keys are
read from that one tree. The verdicts are exactly those of ``decontaminate_tasks`` followed by
``dedup`` on its survivors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from opsynth.ast_dedup.decontam import Decontaminator, decontam_result
from opsynth.ast_dedup.dedup import DedupKeys, dedup_with_keys, key_settings, make_keymaker
from opsynth.ast_dedup.index import KernelBenchIndex
from opsynth.ast_dedup.nearest import Nearest, Scorer
from opsynth.ast_dedup.parallel import map_chunks
from opsynth.ast_dedup.source import parse_task_code
from opsynth.config import DecontamConfig, DedupConfig
from opsynth.record import Task
from opsynth.stage import StepResult


class _Screener:
    """Both analyses from one parse. (Normalised code is no key for the nearest problem: it
    drops docstrings, which the similarity metric counts.)"""

    def __init__(self, index: KernelBenchIndex, levels: tuple[int, ...], settings, floor):
        self.scorer = Scorer(index, levels)
        self.keys = make_keymaker(settings)
        self.floor = floor

    def both(self, code: str) -> tuple[Nearest, DedupKeys]:
        parsed = parse_task_code(code)
        return self.scorer.nearest_parsed(parsed, self.floor), self.keys.keys_parsed(code, parsed)


def _make_screener(index, levels, settings, floor) -> _Screener:
    return _Screener(index, levels, settings, floor)


def _screen_chunk(screener: _Screener, codes: Sequence[str]) -> list[tuple[Nearest, DedupKeys]]:
    return [screener.both(code) for code in codes]


def screen(
    tasks: list[Task],
    decontam_cfg: DecontamConfig,
    dedup_cfg: DedupConfig,
    *,
    index_path: Path | None = None,
) -> tuple[StepResult, StepResult]:
    """``(decontam result over tasks, dedup result over the decontam survivors)``."""
    start = time.perf_counter()
    flt = Decontaminator(decontam_cfg, index_path)
    unique: dict[str, int] = {}
    for task in tasks:
        unique.setdefault(task.code, len(unique))
    pairs = map_chunks(
        _make_screener,
        (flt.index, tuple(decontam_cfg.levels), key_settings(dedup_cfg), flt.floor),
        _screen_chunk,
        list(unique),
        workers=decontam_cfg.workers,
    )
    nearest = [pairs[unique[t.code]][0] for t in tasks]
    decon = decontam_result(flt, tasks, nearest, started=start)
    middle = time.perf_counter()
    keys = [pairs[unique[t.code]][1] for t in decon.kept]
    return decon, dedup_with_keys(decon.kept, keys, dedup_cfg, started=middle)
