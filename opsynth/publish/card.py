"""The dataset card (the repo's README.md), generated from the run alone.

Metadata (licence, task categories, size category, configs) goes in the YAML front matter the
Hub and ``datasets`` read; the body explains the set with the report's own tables: the funnel
with its reasons, the composition against CUDA Agent's Table 3 (and, when the run's report was
made with ``--reference``, its fidelity table), runtimes and their window, the device and
software, decontamination, how to regenerate it, and what to cite. Nothing in it
depends on the clock, so the same run renders the same card and re-publishing is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from opsynth.config import PublishConfig
from opsynth.publish.layout import (
    CONFIG_PATH,
    MANIFEST_PATH,
    RECHECK_CONFIG_PATH,
    RECHECK_MANIFEST_PATH,
    SPLIT,
    data_path,
)
from opsynth.publish.recheck import Recheck
from opsynth.rechecked import RECHECK_STAGE
from opsynth.report import tables as t
from opsynth.report.markdown import markdown_table
from opsynth.rundata import RunData

TASK_CATEGORIES = ["text-generation"]
TAGS = ["code", "cuda", "pytorch", "kernelbench", "gpu-kernels", "synthetic"]
# the Hub's size buckets: (upper bound exclusive, label)
SIZE_CATEGORIES = [
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
]
BAR_WIDTH = 30  # characters of the text histogram's longest bar
TOP_REASONS_IN_CARD = 10
# where ``opsynth report RUN --reference ...`` leaves its fidelity table by default
FIDELITY_CSV = Path("report") / "tables" / "fidelity.csv"
FIDELITY_ROWS = 200  # the whole table
CONFIG_NOTES = {
    "default": "Ops-6K columns: `ops` (JSON list of operator names), `data_source`, `code`",
    "full": "every task column, the filters' measurements (eager / compiled ms, speedup, "
    "nearest KernelBench problem and similarity, dedup clusters), device and versions",
    "rejected": "every rejected candidate with the stage, reason and detail that stopped it",
    "verdicts": "every stage's verdict on every candidate, with its measures (JSON)",
}
CITATIONS = """```bibtex
@article{dai2026cudaagent,
  title   = {CUDA Agent: Large-Scale Agentic RL for High-Performance CUDA Kernel Generation},
  author  = {Dai, Weinan and Wu, Hanlin and Yu, Qiying and Gao, Huan-ang and Li, Jiahao and
             Jiang, Chengquan and Lou, Weiqiang and Song, Yufan and Yu, Hongli and Chen, Jiaze
             and Ma, Wei-Ying and Zhang, Ya-Qin and Liu, Jingjing and Wang, Mingxuan and
             Liu, Xin and Zhou, Hao},
  journal = {arXiv preprint arXiv:2602.24286},
  year    = {2026}
}

@article{ouyang2025kernelbench,
  title   = {KernelBench: Can LLMs Write Efficient GPU Kernels?},
  author  = {Ouyang, Anne and Guo, Simon and Arora, Simran and Zhang, Alex L. and
             Hu, William and R{\\'e}, Christopher and Mirhoseini, Azalia},
  journal = {arXiv preprint arXiv:2502.10517},
  year    = {2025}
}
```
"""


@dataclass(frozen=True)
class CardInput:
    """What the card states besides the run itself."""

    repo_id: str
    version: str
    settings: PublishConfig
    rows: dict[str, int]  # config name -> rows
    config_toml: bool  # whether config.toml is shipped
    recheck: Recheck | None = None  # the release's second, independent pass
    recheck_config_toml: bool = False  # whether the re-check's config is shipped


def size_category(n: int) -> str:
    for bound, label in SIZE_CATEGORIES:
        if n < bound:
            return label
    return "n>1M"


def front_matter(data: RunData, card: CardInput) -> str:
    name = card.settings.pretty_name or card.repo_id.split("/")[-1]
    configs = []
    for config in card.rows:
        entry: dict[str, object] = {"config_name": config}
        if config == "default":
            entry["default"] = True
        entry["data_files"] = [{"split": SPLIT, "path": data_path(config)}]
        configs.append(entry)
    meta = {
        "license": card.settings.license,
        "pretty_name": name,
        "language": ["en"],
        "task_categories": TASK_CATEGORIES,
        "tags": TAGS,
        "size_categories": [size_category(data.accepted.height)],
        "configs": configs,
    }
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def text_histogram(histogram: pl.DataFrame) -> str:
    """The runtime histogram as a Markdown table with a bar of block characters per bin."""
    if histogram.is_empty():
        return "_(no runtime measurements)_\n"
    peak = max(histogram["tasks"].max() or 0, 1)
    bars = ["█" * round(BAR_WIDTH * n / peak) if n else "" for n in histogram["tasks"].to_list()]
    return markdown_table(histogram.with_columns(pl.Series("", bars)))


def report_fidelity(data: RunData) -> pl.DataFrame | None:
    """The fidelity table of the run's report, when the run is a local directory and its
    default report was made with ``--reference``."""
    path = Path(data.source) / FIDELITY_CSV
    if not path.is_file():
        return None
    try:
        return pl.read_csv(path)
    except (OSError, pl.exceptions.PolarsError):
        return None


def _fidelity(data: RunData) -> list[str]:
    table = report_fidelity(data)
    if table is None or table.is_empty():
        return []
    return [
        "## Fidelity to a reference set",
        "",
        "The accepted tasks against the reference set of the run's report (`opsynth report "
        "--reference`): operator coverage, category and structure shares (% of tasks), "
        "keyword arguments per call, and the data_source mix; difference is this set minus "
        "the reference.",
        "",
        markdown_table(table, FIDELITY_ROWS),
    ]


def _recheck(data: RunData, card: CardInput) -> list[str]:
    """The re-check's section: what it found, where and how it ran, its funnel."""
    r = card.recheck
    if r is None:
        return []
    m = r.data.manifest
    outcome = (
        f"all {r.rows} pass every stage"
        if r.passed == r.rows
        else f"{r.passed} of {r.rows} pass every stage"
    )
    window = t.runtime_window(r.data)
    similarity = "not measured" if r.max_similarity is None else f"{r.max_similarity:.4f}"
    carried = int(m.get("reused_rows") or 0)
    facts = [
        ("rows re-checked", str(r.rows)),
        *([("of them carried from an earlier re-check", str(carried))] if carried else []),
        ("passed", str(r.passed)),
        ("exact or near duplicates", str(r.duplicates)),
        ("largest KernelBench AST similarity", similarity),
        ("runtime window", f"{window[0]:g}-{window[1]:g} ms" if window else "not recorded"),
        ("config hash", str(m.get("config_hash", ""))),
        ("device", str(m.get("device", ""))),
        ("device name", str(m.get("filters_runtime", {}).get("device_name", ""))),
        ("torch", str(m.get("versions", {}).get("torch", ""))),
        ("CUDA", str(m.get("versions", {}).get("cuda", ""))),
    ]
    table = pl.DataFrame({"": [f[0] for f in facts], "value": [f[1] for f in facts]})
    lines = [
        "## Re-check",
        "",
        f"Every released row was checked again in a second, independent pass: `opsynth audit` "
        "of the accepted rows on a fresh process pool, each task at its released size, "
        f"through every filter, decontamination and dedup: {outcome}. Its run.json is "
        f"`{RECHECK_MANIFEST_PATH}`.{_carried_note(data, carried)}",
        "",
        markdown_table(table),
        markdown_table(t.funnel(r.data)),
    ]
    if not r.failures.is_empty():
        lines += [
            "Rows the re-check did not pass, by the stage and reason that stopped them:",
            "",
            markdown_table(r.failures),
        ]
    return [*lines, "To repeat it on the published rows:", "", *_recheck_command(r, card), ""]


def _carried_note(data: RunData, carried: int) -> str:
    """What the re-check took from an earlier one, and the rows that earlier one cost."""
    replaced = data.verdicts.filter(pl.col("stage") == RECHECK_STAGE).height
    note = (
        f" {replaced} rows an earlier re-check rejected were replaced by rows past the target "
        f"(the funnel's `{RECHECK_STAGE}` stage)."
        if replaced
        else ""
    )
    if carried:
        note += (
            f" This re-check took an earlier one's verdicts on the {carried} rows that one had "
            "checked and checked the rest; its dedup covered every row."
        )
    return note


def _recheck_command(r: Recheck, card: CardInput) -> list[str]:
    """The published rows and the re-check's config fetched at this version's tag, then the
    audit that repeats the re-check on them (task ids are content hashes, so the published
    rows are the rows it checked)."""
    rows = data_path("default")
    files = [rows, *([RECHECK_CONFIG_PATH] if card.recheck_config_toml else [])]
    fetch = (
        f"hf download {card.repo_id} {' '.join(files)} --repo-type dataset "
        f"--revision v{card.version} --local-dir ."
    )
    command = f"opsynth audit --input {rows} --out recheck"
    if card.recheck_config_toml:
        command += f" --config {RECHECK_CONFIG_PATH}"
    command += f" --device {r.data.manifest.get('device', 'auto')}"
    return ["```bash", fetch, command, "```"]


def _environment(data: RunData) -> str:
    m = data.manifest
    versions, runtime = m.get("versions", {}), m.get("filters_runtime", {})
    rows = [
        ("device", m.get("device", "")),
        ("device name", runtime.get("device_name", "")),
        ("torch", versions.get("torch", "")),
        ("CUDA", versions.get("cuda", "")),
        ("python", versions.get("python", "")),
        ("opsynth", versions.get("opsynth", "")),
        ("sandbox", runtime.get("sandbox", "")),
        ("speed factor", data.setting("filters", "device_speed_factor", "")),
    ]
    frame = pl.DataFrame({"": [r[0] for r in rows], "value": [str(r[1]) for r in rows]})
    return markdown_table(frame)


def _regenerate(data: RunData, card: CardInput) -> str:
    m = data.manifest
    tag = f"v{card.version}"
    fetch = (
        f"hf download {card.repo_id} {CONFIG_PATH} --repo-type dataset --revision {tag} "
        "--local-dir ."
    )
    device = m.get("device", "auto")
    if data.kind == "audit":
        command = f"opsynth audit --input {m.get('source', 'SOURCE')} --out runs/audit"
    else:
        command = "opsynth run --out runs/regenerated"
    if card.config_toml:
        command += f" --config {CONFIG_PATH}"
    command += f" --device {device}"
    lines = [
        "```bash",
        *([fetch] if card.config_toml else []),
        command,
        "```",
        "",
        f"- config hash `{m.get('config_hash', '')}` (the run's full config is `{CONFIG_PATH}` "
        f"and, with counts and versions, `{MANIFEST_PATH}`)",
        f"- opsynth {m.get('versions', {}).get('opsynth', '')}; "
        "the same config composes the same candidates; sizing and the runtime window measure "
        "time, so on another run (even on the same device class) a task whose eager time sits "
        "near a sizing step or a window edge may be sized or judged otherwise (each row's "
        "sizing steps are in its `meta.sizing`)",
    ]
    if m.get("input_rows") and m.get("input_rows") != m.get("counts", {}).get("candidates"):
        lines.append(
            f"- the audit read {m['input_rows']} rows, {m['counts']['candidates']} unique "
            "(a sample, or exact duplicates in the input)"
        )
    return "\n".join(lines) + "\n"


def render_card(data: RunData, card: CardInput) -> str:
    """The whole README.md."""
    tables = t.build_tables(data)
    m = data.manifest
    n = data.accepted.height
    name = card.settings.pretty_name or card.repo_id.split("/")[-1]
    what = (
        f"an audit of `{m.get('source', '')}`: the rows that pass every filter"
        if data.kind == "audit"
        else "tasks composed from seed operators and kept only if they pass every filter"
    )
    configs = pl.DataFrame(
        {
            "config": list(card.rows),
            "rows": list(card.rows.values()),
            "contents": [CONFIG_NOTES.get(c, "") for c in card.rows],
        }
    )
    window = t.runtime_window(data)
    window_text = f"{window[0]:g}-{window[1]:g} ms" if window else "not recorded"
    threshold = t.similarity_threshold(data)
    body = [
        f"# {name}",
        "",
        f"{n} PyTorch tasks in KernelBench format (`class Model`, `get_inputs()`, "
        f"`get_init_inputs()`), {what}. Version **{card.version}** (tag `v{card.version}`), "
        f"made by opsynth from the CUDA-Agent-Ops-6K recipe; the default config has the "
        "released Ops-6K's columns, so code written for it loads this unchanged.",
        "",
        "```python",
        "from datasets import load_dataset",
        f'tasks = load_dataset("{card.repo_id}", split="train")  # ops, data_source, code',
        f'full = load_dataset("{card.repo_id}", "full", split="train")  # + measurements',
        f'this_version = load_dataset("{card.repo_id}", revision="v{card.version}")',
        "```",
        "",
        "## Configs",
        "",
        markdown_table(configs),
        "## Filter funnel",
        "",
        "Every candidate meets the stages in this order and stops at the first it fails; "
        "`export` / `over_target` marks tasks that passed after the target was met.",
        "",
        markdown_table(tables["funnel"]),
        "### Top rejection reasons",
        "",
        markdown_table(tables["reasons"].drop("example").head(TOP_REASONS_IN_CARD)),
        "## Composition vs. CUDA Agent Table 3",
        "",
        markdown_table(tables["composition"]),
        *_fidelity(data),
        "## Runtime",
        "",
        f"Eager runtime window {window_text} (median of timed runs, times the device speed "
        "factor). Accepted tasks per bin:",
        "",
        text_histogram(tables["runtime_histogram"]),
        markdown_table(tables["runtime"]),
        "## Device and software",
        "",
        _environment(data),
        "## Decontamination",
        "",
        "Each task's `Model` class is compared with every KernelBench problem "
        "(levels " + ", ".join(str(v) for v in data.setting("decontam", "levels", [])) + ") by "
        f"AST similarity; tasks above {threshold if threshold is not None else '?'} are "
        "dropped.",
        "",
        markdown_table(tables["similarity"]),
        markdown_table(tables["nearest_kernelbench"].head(5)),
        *_recheck(data, card),
        "## How to regenerate",
        "",
        _regenerate(data, card),
        "## Citation",
        "",
        CITATIONS,
    ]
    return front_matter(data, card) + "\n" + "\n".join(body)
