"""GPU utilisation and memory over a benchmark phase, sampled with ``nvidia-smi``.

Why: the filters' wall time on one GPU can be bound by the CPU (compiles), by the GPU's memory
(tasks sized to fill the runtime window hold tens of GB each) or by the GPU lock's
serialisation; the per-stage worker clocks cannot tell these apart, the GPU's own counters
can. Standard library only; without ``nvidia-smi`` the sampler records nothing.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass

QUERY = "index,utilization.gpu,memory.used,memory.total"


@dataclass(frozen=True)
class Sample:
    gpu: int
    utilization_pct: float
    used_mib: float
    total_mib: float


def parse_line(line: str) -> Sample | None:
    """One ``--format=csv,noheader,nounits`` line of ``QUERY``; None for anything else."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        return Sample(int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]))
    except ValueError:
        return None


def summarise(samples: list[Sample], full_fraction: float = 0.9) -> dict[str, dict[str, float]]:
    """Per GPU: mean and median utilisation, peak memory used, and the share of samples with
    memory above ``full_fraction`` of the total (how often the GPU was nearly full)."""
    by_gpu: dict[int, list[Sample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    return {
        str(gpu): {
            "samples": len(rows),
            "utilization_mean_pct": round(statistics.mean(r.utilization_pct for r in rows), 1),
            "utilization_median_pct": round(statistics.median(r.utilization_pct for r in rows), 1),
            "memory_peak_gib": round(max(r.used_mib for r in rows) / 1024, 1),
            "memory_total_gib": round(rows[0].total_mib / 1024, 1),
            "memory_nearly_full_share": round(
                sum(r.used_mib > full_fraction * r.total_mib for r in rows) / len(rows), 3
            ),
        }
        for gpu, rows in sorted(by_gpu.items())
    }


class GpuSampler:
    """``with GpuSampler() as g: ...`` then ``g.summary()``; samples every ``every_ms``."""

    def __init__(self, every_ms: int = 500) -> None:
        self.every_ms = every_ms
        self.samples: list[Sample] = []
        self.stamps: list[float] = []  # time.time() at each sample's arrival
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        tool = shutil.which("nvidia-smi")
        if tool:
            self._proc = subprocess.Popen(
                [
                    tool,
                    f"--query-gpu={QUERY}",
                    "--format=csv,noheader,nounits",
                    f"--loop-ms={self.every_ms}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            sample = parse_line(line)
            if sample is not None:
                self.samples.append(sample)
                self.stamps.append(time.time())

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(
        self, between: tuple[float, float] | None = None
    ) -> dict[str, dict[str, float]] | None:
        """Over the whole phase, or over the samples that arrived within ``between``."""
        samples = self.samples
        if between is not None:
            low, high = between
            samples = [
                s for s, t in zip(self.samples, self.stamps, strict=True) if low <= t <= high
            ]
        return summarise(samples) if samples else None
