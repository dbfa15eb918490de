"""The catalogue is extracted once per seeds config and library versions, into the user
cache, and every run copies it; a changed config extracts anew."""

from __future__ import annotations

import importlib.metadata

from opsynth import synth
from opsynth.config import SeedsConfig
from opsynth.store import read_tasks
from opsynth.synth.catalog import report
from opsynth.synth.catalog.report import cache_root, catalogue_key, ensure_catalogue


def test_a_second_run_reuses_the_cached_catalogue(tmp_path):
    cfg = SeedsConfig(libraries=["einops"], cache_dir=str(tmp_path / "cache"))
    assert ensure_catalogue(tmp_path / "run1", cfg) is False
    assert ensure_catalogue(tmp_path / "run2", cfg) is True
    cached = tmp_path / "cache" / f"catalogue-{catalogue_key(cfg)}"
    assert (cached / "summary.json").is_file()
    first = read_tasks(tmp_path / "run1" / "catalogue" / "seeds.parquet")
    second = read_tasks(tmp_path / "run2" / "catalogue" / "seeds.parquet")
    assert [t.id for t in first] == [t.id for t in second] and first


def test_the_key_follows_what_the_catalogue_depends_on(tmp_path, monkeypatch):
    base = SeedsConfig(libraries=["einops"])
    key = catalogue_key(base)
    assert key != catalogue_key(base.model_copy(update={"operators": ["x"]}))
    # a new composer chains the same seeds; a new extraction may find others
    monkeypatch.setattr(synth, "__version__", "99.0")
    assert catalogue_key(base) == key
    monkeypatch.setattr(report, "CATALOGUE_VERSION", report.CATALOGUE_VERSION + 1)
    assert catalogue_key(base) != key
    monkeypatch.undo()
    # where it is kept and how many processes extract it do not change what it is
    assert catalogue_key(base) == catalogue_key(base.model_copy(update={"workers": 3}))
    moved = base.model_copy(update={"cache_dir": str(tmp_path)})
    assert catalogue_key(base) == catalogue_key(moved) and cache_root(moved) == tmp_path
    # a setting added later changes the key at its new default, not at what catalogues had
    # before it (seeds.fill_uninitialized, seeds.added_overrides and
    # seeds.condition_overrides, which v1.0.0's config pins to false)
    added = ("fill_uninitialized", "added_overrides", "condition_overrides")
    before = base.model_copy(update=dict.fromkeys(added, False))
    settings = before.model_dump(mode="json", exclude={"cache_dir", "workers", *added})
    for name in added:
        assert catalogue_key(before.model_copy(update={name: True})) != catalogue_key(before)
    versions = {"einops": importlib.metadata.version("einops")}
    made_before = report.digest(settings, f"catalogue {report.CATALOGUE_VERSION}", versions)
    assert catalogue_key(before) == made_before != catalogue_key(base)


def test_without_a_cache_the_run_keeps_its_own_copy(tmp_path):
    cfg = SeedsConfig(libraries=["einops"], cache_dir="none")
    assert cache_root(cfg) is None
    assert ensure_catalogue(tmp_path / "run", cfg) is False
    assert list((tmp_path / "run" / "work").glob("catalogue-*/seeds.parquet"))
