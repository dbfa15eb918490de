"""Config loading: defaults documented in configs/default.toml, every error one line."""

from pathlib import Path

import pytest

from opsynth.config import ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_default_toml_matches_code_defaults():
    assert load_config(ROOT / "configs" / "default.toml") == RunConfig()


def test_hash_changes_with_any_setting():
    base = RunConfig()
    assert base.config_hash() == RunConfig().config_hash()
    assert base.with_overrides(target=7).config_hash() != base.config_hash()
    assert base.with_section("filters", timed_runs=20).config_hash() != base.config_hash()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("target = [", "not valid TOML"),
        ("target = 0", "target"),
        ("tagret = 3", "tagret"),
        ("[filters]\nwindow_ms_cpu = [5.0, 1.0]", "window_ms_cpu"),
        ("[filters]\ndevice = 'tpu'", "filters.device"),
    ],
)
def test_bad_config_is_one_line_error(tmp_path, text, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert expected in message and "\n" not in message


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_neighbour_reasons_are_filter_codes_and_checked() -> None:
    """retry_alone names codes a shared device can cause; they are the filters' codes, and any
    other is refused with the list to choose from."""
    from opsynth.config import NEIGHBOUR_REASONS, FiltersConfig
    from opsynth.filters import reasons

    assert set(NEIGHBOUR_REASONS) <= set(reasons.INFRA) | set(reasons.ALL)
    with pytest.raises(ValueError, match="choose from"):
        FiltersConfig(retry_alone=["too_fast"])


def test_work_keys_hash_speed_only_settings_at_their_defaults() -> None:
    """A work file's key (``work_dump``) ignores settings that change only how fast or where
    work runs, so a resumed run tuned for another host reuses the work on disk; at the
    defaults it is the plain dump less the settings added with their earlier behaviour as
    default, so keys written before they existed stay valid."""
    from opsynth.config import ADDED_AT_DEFAULT, SPEED_ONLY, SPEED_ONLY_ADDED, render_toml

    cfg = RunConfig()
    for name in ("seeds", "compose", "sizing", "filters", "decontam", "dedup"):
        section = getattr(cfg, name)
        fields = type(section).model_fields
        added = {
            n
            for n, f in fields.items()
            if f.json_schema_extra in (ADDED_AT_DEFAULT, SPEED_ONLY_ADDED)
        }
        plain = {k: v for k, v in section.model_dump(mode="json").items() if k not in added}
        assert section.work_dump() == plain, name
    # an added setting counts once it is set otherwise (sizing.probe_exclusive)
    shared = cfg.with_section("sizing", probe_exclusive=False)
    assert shared.config_hash() != cfg.config_hash()
    # one added with a new default counts at it, and not at the value runs had before it
    # (filters.judge_every_degenerate_fact, which v1.0.0's config pins to false)
    earlier = cfg.with_section("filters", judge_every_degenerate_fact=False)
    assert "judge_every_degenerate_fact" in cfg.filters.work_dump()
    assert "judge_every_degenerate_fact" not in earlier.filters.work_dump()
    assert earlier.config_hash() != cfg.config_hash()
    speed = {
        section: [
            n
            for n, f in type(getattr(cfg, section)).model_fields.items()
            if f.json_schema_extra in (SPEED_ONLY, SPEED_ONLY_ADDED)
        ]
        for section in ("sizing", "filters")
    }
    assert {"workers", "shard_size", "candidates_per_process_cuda", "fused_sums"} <= set(
        speed["filters"]
    )
    assert {"pipelined", "inline"} <= set(speed["sizing"])
    tuned = cfg.with_section(
        "filters",
        workers=3,
        shard_size=5,
        candidates_per_process_cuda=4,
        batch_timers=False,
        fused_sums=False,
    ).with_section("sizing", pipelined=False, inline=False)
    assert tuned.filters.work_dump() == cfg.filters.work_dump()
    assert tuned.sizing.work_dump() == cfg.sizing.work_dump()
    assert tuned.config_hash() == cfg.config_hash()
    # what decides a verdict still does
    stricter = cfg.with_section("filters", timed_runs=20)
    assert stricter.filters.work_dump() != cfg.filters.work_dump()
    assert stricter.config_hash() != cfg.config_hash()
    assert "(speed only: work files are reused across its values)" in render_toml(cfg, [])
