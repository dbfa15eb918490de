"""``opsynth compose``: only the seeds and compose stages, to try a composer or an LLM server.

It runs the same stage functions as ``opsynth run`` (without a Prefect flow around them), so
its work files and the LLM reply cache are reused by a later ``opsynth run`` on the same
``--out``; it writes ``candidates.parquet``, the compose verdicts and ``run.json`` with the
compose stats (tokens, cache hits, rejections by reason).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from opsynth.config import ConfigError, RunConfig, load_config
from opsynth.funnel import funnel_rows
from opsynth.record import utc_now
from opsynth.store import RunDir, RunDirError, write_tasks, write_verdicts


def compose(
    out: Annotated[Path, typer.Option("--out", help="run directory (created if missing)")] = Path(
        "runs/compose"
    ),
    n: Annotated[int, typer.Option("--n", help="candidates to compose")] = 20,
    round_index: Annotated[int, typer.Option("--round", help="round (RNG stream) to draw")] = 0,
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file")] = None,
    composer: Annotated[
        str | None, typer.Option("--composer", help="offline | llm (default: from config)")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="compose.llm.model")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="compose.llm.base_url")] = None,
) -> None:
    """Compose N candidates into OUT and judge every reply; nothing is executed."""
    from opsynth.flows.cli_common import UserError, fail, print_funnel, start_prefect

    try:
        if n < 1:
            raise UserError(f"--n must be at least 1, got {n}")
        cfg = with_composer(load_config(config), composer, model, base_url)
        run_dir = RunDir.create(out)
        start_prefect(run_dir)
        result, stats = _compose(run_dir, cfg, n, round_index)
    except (ConfigError, RunDirError, UserError) as exc:
        fail(str(exc))
        return
    print_funnel(funnel_rows(result.verdicts), f"compose ({cfg.compose.composer})")
    Console().print(
        f"{stats['passed']} of {stats['candidates']} candidates passed -> "
        f"{out / 'candidates.parquet'}; tokens: {stats['prompt_tokens']} prompt, "
        f"{stats['completion_tokens']} completion; {stats['cache_hits']} replies from the cache"
    )
    if not result.complete:
        Console(stderr=True).print(
            "[yellow]warning:[/] some requests got no reply (see the reasons above); "
            "re-run the same command to ask again"
        )
        raise typer.Exit(1)


def with_composer(
    cfg: RunConfig, composer: str | None, model: str | None, base_url: str | None
) -> RunConfig:
    """The config with the command-line choices of composer and server applied."""
    from opsynth.flows.cli_common import UserError

    data = cfg.model_dump(mode="json")
    llm = {"model": model, "base_url": base_url}
    data["compose"]["llm"].update({k: v for k, v in llm.items() if v is not None})
    if composer is not None:
        data["compose"]["composer"] = composer
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{where}: {first['msg']}".removeprefix(": ")) from exc


def _compose(run_dir: RunDir, cfg: RunConfig, n: int, round_index: int):
    from opsynth.flows.stages import WorkLedger, compose_stage, seeds_stage
    from opsynth.synth.composers import summary

    ledger = WorkLedger()
    seeds = seeds_stage.fn(run_dir, cfg, ledger)
    result = compose_stage.fn(run_dir, cfg, seeds, round_index, n, ledger)
    write_tasks(result.tasks, run_dir.path("candidates.parquet"))
    write_verdicts(result.verdicts, run_dir.path("verdicts.parquet"))
    stats = summary(result.verdicts)
    manifest = run_dir.read_manifest()
    manifest.update(
        {
            "status": "composed",
            "config": cfg.model_dump(mode="json"),
            "config_hash": cfg.config_hash(),
            "finished_at": utc_now(),
            "compose": stats,
            "funnel": funnel_rows(result.verdicts),
            "work": {"reused": ledger.reused, "computed": ledger.computed},
        }
    )
    run_dir.write_manifest(manifest)
    return result, stats
