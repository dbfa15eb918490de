"""The audit report's tables, as polars frames computed from a ``RunData`` alone.

The same functions feed the report, the notebook and the dataset card, so the three can never
disagree. Every table works on a regenerate run and on an ``opsynth audit`` of the released
Ops-6K (which has no compose stage, no seeds and may have no runtime rows at all).
"""

from __future__ import annotations

import json
import math

import polars as pl

from opsynth.config import OPS6K_MIX
from opsynth.funnel import funnel as funnel_counts
from opsynth.record import Verdict
from opsynth.rundata import RunData, decode_measures
from opsynth.verdicts import TIMING_MEASURE, TIMING_STAGE

TOP_REASONS = 3  # reasons named per stage in the funnel table
TOP_NEAREST = 10  # KernelBench problems listed as nearest
RUNTIME_BINS_PER_DECADE = 4  # log-scale runtime histogram resolution
QUANTILES = {"p10": 0.1, "median": 0.5, "p90": 0.9}
# stages whose "rejection" is no judgement of the task (export: accepted past the target)
NOT_FILTERS = ["export"]


def funnel(data: RunData) -> pl.DataFrame:
    """Per stage, in pipeline order: entered, passed, rejected, pass rate and top reasons
    (``opsynth.funnel`` computes it, as for run.json and ``opsynth status``)."""
    rows = data.verdicts.select("task_id", "stage", "passed", "reason").iter_rows()
    counts = funnel_counts(Verdict(t, s, p, r) for t, s, p, r in rows)
    return pl.DataFrame(
        {
            "stage": [c.stage for c in counts],
            "entered": [c.entered for c in counts],
            "passed": [c.passed for c in counts],
            "rejected": [c.rejected for c in counts],
            "pass_rate": [round(c.passed / c.entered, 4) if c.entered else None for c in counts],
            "top_reasons": [
                ", ".join(f"{r} {n}" for r, n in c.top_reasons(TOP_REASONS)) for c in counts
            ],
        },
        schema_overrides={"pass_rate": pl.Float64},
    )


def reasons(data: RunData) -> pl.DataFrame:
    """Every (stage, reason) that rejected something, its count, its share of that stage's
    rejections, and one example detail line."""
    failed = data.verdicts.filter(~pl.col("passed"))
    return (
        failed.group_by("stage", "reason")
        .agg(pl.len().alias("count"), pl.col("detail").first().alias("example"))
        .with_columns(
            (pl.col("count") / pl.col("count").sum().over("stage")).round(4).alias("share")
        )
        .sort(["count", "stage", "reason"], descending=[True, False, False])
        .select("stage", "reason", "count", "share", "example")
    )


def outcomes(data: RunData) -> pl.DataFrame:
    """One row per candidate: its ops, data_source, whether it was accepted and, if not, the
    stage and reason that stopped it."""
    stops = data.rejections().select("id", "stage", "reason")
    accepted = data.accepted.select("id").with_columns(pl.lit(True).alias("accepted"))
    return (
        data.candidates.select("id", "ops", "data_source")
        .join(accepted, on="id", how="left")
        .join(stops, on="id", how="left")
        .with_columns(pl.col("accepted").fill_null(False))
    )


def op_rejects(data: RunData) -> pl.DataFrame:
    """Per seed operator: candidates using it, how many a filter rejected, the rate and the
    most common reason, worst first (an op used twice in a task counts once for it)."""
    frame = outcomes(data).with_columns(
        pl.col("ops").map_elements(lambda s: sorted(set(json.loads(s))), pl.List(pl.String))
    )
    exploded = frame.explode("ops").rename({"ops": "op"}).drop_nulls("op")
    rejected = pl.col("stage").is_not_null() & ~pl.col("stage").is_in(NOT_FILTERS)
    return (
        exploded.group_by("op")
        .agg(
            pl.len().alias("candidates"),
            rejected.sum().alias("rejected"),
            pl.col("reason").filter(rejected).mode().sort().first().alias("top_reason"),
        )
        .with_columns((pl.col("rejected") / pl.col("candidates")).round(4).alias("reject_rate"))
        .sort(["rejected", "reject_rate", "op"], descending=[True, True, False])
        .select("op", "candidates", "rejected", "reject_rate", "top_reason")
    )


def composition(data: RunData) -> pl.DataFrame:
    """The accepted set's data_source mix against CUDA Agent's Table 3 (the released Ops-6K)."""
    counts = dict(data.accepted.group_by("data_source").len().iter_rows())
    offered = dict(data.candidates.group_by("data_source").len().iter_rows())
    total = sum(counts.values()) or 1
    sources = list(OPS6K_MIX) + sorted(set(counts) - set(OPS6K_MIX))
    return pl.DataFrame(
        {
            "data_source": sources,
            "candidates": [offered.get(s, 0) for s in sources],
            "accepted": [counts.get(s, 0) for s in sources],
            "share": [round(counts.get(s, 0) / total, 4) for s in sources],
            "table3_share": [OPS6K_MIX.get(s) for s in sources],
        },
        schema_overrides={"table3_share": pl.Float64},
    ).with_columns((pl.col("share") - pl.col("table3_share")).round(4).alias("difference"))


def stage_measures(data: RunData, stage: str) -> pl.DataFrame:
    """The verdict rows of one stage with their measures spread into columns."""
    rows = data.verdicts.filter(pl.col("stage") == stage).select(
        "task_id", "passed", "reason", "measures", "device", "torch_version"
    )
    return decode_measures(rows)


def timed_rows(data: RunData) -> pl.DataFrame:
    """The rows of the stage that timed each candidate, measures spread: runtime's, and
    verify's where it timed the candidates itself (``filters.timing_in_verify``; its rows then
    carry ``TIMING_MEASURE``)."""
    runtime, verify = stage_measures(data, "runtime"), stage_measures(data, TIMING_STAGE)
    if TIMING_MEASURE not in verify.columns:
        return runtime
    verify = verify.filter(pl.col(TIMING_MEASURE).is_not_null())
    return pl.concat([runtime, verify], how="diagonal_relaxed") if runtime.height else verify


def runtime_values(data: RunData) -> dict[str, pl.Series]:
    """The measured numbers the runtime tables and plots use, one Series each (no nulls):
    eager ms of every candidate timed (pass or not), and compile speedup / time."""
    timed, compile_ = timed_rows(data), stage_measures(data, "compile")

    def column(frame: pl.DataFrame, name: str) -> pl.Series:
        if name not in frame.columns:
            return pl.Series(name, [], pl.Float64)
        return frame[name].cast(pl.Float64, strict=False).drop_nulls().rename(name)

    def compiled(name: str) -> pl.Series:
        return pl.concat([column(compile_, name), column(timed, name)])

    return {
        "eager_ms": column(timed, "eager_ms_median"),
        "eager_ms_scaled": column(timed, "scaled_ms"),
        "compiled_ms": compiled("compiled_ms_median"),
        "compile_speedup": compiled("speedup"),
        "compile_s": column(compile_, "compile_s"),
    }


def runtime_window(data: RunData) -> tuple[float, float] | None:
    """The eager window the runtime filter applied (from its verdicts, else the config)."""
    runtime = timed_rows(data)
    if "window_ms" in runtime.columns:
        found = runtime["window_ms"].drop_nulls()
        if len(found):
            lo, hi = found[0]
            return float(lo), float(hi)
    key = "window_ms_cuda" if data.manifest.get("device") == "cuda" else "window_ms_cpu"
    window = data.setting("filters", key)
    return (float(window[0]), float(window[1])) if window else None


def summary(values: dict[str, pl.Series]) -> pl.DataFrame:
    """n, min, p10, median, p90, max (and mean) of each named Series."""
    rows = []
    for name, series in values.items():
        row: dict[str, object] = {"measure": name, "n": len(series)}
        row["min"] = series.min() if len(series) else None
        for label, q in QUANTILES.items():
            row[label] = series.quantile(q) if len(series) else None
        row["max"] = series.max() if len(series) else None
        row["mean"] = series.mean() if len(series) else None
        rows.append(row)
    stats = ["min", *QUANTILES, "max", "mean"]
    schema = {"measure": pl.String, "n": pl.Int64, **dict.fromkeys(stats, pl.Float64)}
    return pl.DataFrame(rows, schema=schema).with_columns(pl.col(stats).round(4))


def runtime(data: RunData) -> pl.DataFrame:
    """Eager and compiled runtime, compile speedup and compile time statistics."""
    return summary(runtime_values(data))


def log_edges(values: pl.Series, per_decade: int = RUNTIME_BINS_PER_DECADE) -> list[float]:
    """Log-spaced bin edges covering ``values`` on whole decades."""
    positive = values.filter(values > 0)
    if not len(positive):
        return []
    lo, hi = math.floor(math.log10(positive.min())), math.ceil(math.log10(positive.max()))
    hi = max(hi, lo + 1)
    return [10 ** (lo + i / per_decade) for i in range((hi - lo) * per_decade + 1)]


def runtime_histogram(data: RunData) -> pl.DataFrame:
    """Accepted tasks per log-spaced eager runtime bin (the time the window was checked on)."""
    accepted = set(data.accepted["id"].to_list())
    runtime = timed_rows(data)
    if "scaled_ms" not in runtime.columns:
        return pl.DataFrame(schema={"lo_ms": pl.Float64, "hi_ms": pl.Float64, "tasks": pl.Int64})
    ms = runtime.filter(pl.col("task_id").is_in(list(accepted)))["scaled_ms"].cast(pl.Float64)
    edges = log_edges(ms.drop_nulls())
    bins = zip(edges[:-1], edges[1:], strict=True)
    counts = [ms.filter((ms >= lo) & (ms < hi)).len() for lo, hi in bins]
    if counts:
        counts[-1] += ms.filter(ms == edges[-1]).len()
    return pl.DataFrame(
        {"lo_ms": edges[:-1], "hi_ms": edges[1:], "tasks": counts},
        schema={"lo_ms": pl.Float64, "hi_ms": pl.Float64, "tasks": pl.Int64},
    ).with_columns(pl.col("lo_ms", "hi_ms").round(4))


def similarity_values(data: RunData) -> pl.Series:
    decontam = stage_measures(data, "decontam")
    if "kb_similarity" not in decontam.columns:
        return pl.Series("kb_similarity", [], pl.Float64)
    return decontam["kb_similarity"].cast(pl.Float64, strict=False).drop_nulls()


def similarity_threshold(data: RunData) -> float | None:
    found = data.setting("decontam", "threshold")
    return float(found) if found is not None else None


def similarity(data: RunData) -> pl.DataFrame:
    """Nearest-KernelBench AST similarity over every candidate decontam saw, with the drop
    threshold and how many it dropped."""
    values = similarity_values(data)
    threshold = similarity_threshold(data)
    dropped = data.verdicts.filter(
        (pl.col("stage") == "decontam") & (pl.col("reason") == "kernelbench_similar")
    ).height
    stats = summary({"kb_similarity": values}).drop("measure")
    return stats.with_columns(
        pl.lit(threshold, pl.Float64).alias("threshold"), pl.lit(dropped).alias("dropped")
    )


def nearest_kernelbench(data: RunData) -> pl.DataFrame:
    """The KernelBench problems most often nearest to a candidate, with the highest
    similarity any candidate reached against each."""
    decontam = stage_measures(data, "decontam")
    keys = ["kb_nearest_level", "kb_nearest_problem_id", "kb_nearest_name"]
    if not set(keys + ["kb_similarity"]) <= set(decontam.columns):
        return pl.DataFrame(schema={"level": pl.Int64, "problem_id": pl.Int64, "name": pl.String})
    return (
        decontam.drop_nulls(keys)
        .group_by(keys)
        .agg(
            pl.len().alias("tasks"), pl.col("kb_similarity").max().round(4).alias("max_similarity")
        )
        .sort(["tasks", "max_similarity"], descending=True)
        .head(TOP_NEAREST)
        .rename({"kb_nearest_level": "level", "kb_nearest_problem_id": "problem_id"})
        .rename({"kb_nearest_name": "name"})
    )


def build_tables(data: RunData) -> dict[str, pl.DataFrame]:
    """Every report table by name, in the order the report shows them."""
    return {
        "funnel": funnel(data),
        "reasons": reasons(data),
        "op_rejects": op_rejects(data),
        "composition": composition(data),
        "runtime": runtime(data),
        "runtime_histogram": runtime_histogram(data),
        "similarity": similarity(data),
        "nearest_kernelbench": nearest_kernelbench(data),
    }
