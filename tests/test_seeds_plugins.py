"""The seed-library plugin API against hostile plugins: real subprocesses, real plugins.

Plugins are config-named classes in a module written to a temporary directory, or declared
through a real entry point (a ``.dist-info`` on the path). A plugin that raises, hangs,
crashes or yields invalid specs loses its seeds with a reason; einops still extracts.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from opsynth.config import SeedsConfig
from opsynth.synth.catalog.extract import extract
from opsynth.synth.catalog.plugins import known_libraries, resolve_names

HOSTILE = textwrap.dedent(
    """
    import os, time
    from opsynth.synth.catalog.spec import CatalogSpec, InputSpec

    GOOD = CatalogSpec("x", "torch.relu", "function", "torch.relu", args=(InputSpec("x", (4, 8)),))

    class Raising:
        name = "raising"
        def specs(self):
            yield GOOD
            raise RuntimeError("plugin bug")

    class Hanging:
        name = "hanging"
        def specs(self):
            yield GOOD
            time.sleep(1000)

    class Crashing:
        name = "crashing"
        def specs(self):
            os._exit(3)
            yield GOOD

    class Invalid:
        name = "invalid"
        def specs(self):
            yield "not a spec"
            yield CatalogSpec("x", "torch.nothing", "function")
            yield GOOD
            yield GOOD
            yield CatalogSpec("x", "torch.cumsum", "function", "torch.cumsum",
                              args=(InputSpec("x", (4, 8)), InputSpec("d", tensor=False, value=1)))
            yield CatalogSpec("x", "torch.cumprod", "function", "torch.cumprod",
                              args=(InputSpec("x", (4, 8)),))

    def broken_factory():
        raise ValueError("cannot start")
    """
)
PLUGINS = {
    "raising": "hostile_seeds:Raising",
    "hanging": "hostile_seeds:Hanging",
    "crashing": "hostile_seeds:Crashing",
    "invalid": "hostile_seeds:Invalid",
    "broken": "hostile_seeds:broken_factory",
}


@pytest.fixture(scope="module")
def extraction(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins")
    (path / "hostile_seeds.py").write_text(HOSTILE)
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(path))
    cfg = SeedsConfig(plugins=PLUGINS, library_timeout_s=25.0, workers=3)
    try:
        yield extract(["einops", *PLUGINS], cfg)
    finally:
        mp.undo()


def by_library(extraction, name):
    return next(lib for lib in extraction.libraries if lib.name == name)


def reasons(lib) -> list[str]:
    return [v.reason for v in lib.verdicts]


def test_good_library_extracts_beside_hostile_ones(extraction):
    einops = by_library(extraction, "einops")
    assert einops.status == "ok"
    names = {t.ops[0] for t in einops.tasks}
    assert {"einops.rearrange", "einops.Rearrange", "einops.Reduce"} <= names
    assert all(t.data_source == "einops" for t in einops.tasks)


def test_raising_plugin_keeps_its_finished_seeds(extraction):
    lib = by_library(extraction, "raising")
    assert [t.ops for t in lib.tasks] == [["torch.relu"]]
    assert reasons(lib) == ["ok", "library_error"]
    assert "plugin bug" in lib.verdicts[-1].detail


def test_hanging_plugin_is_killed_at_its_deadline(extraction):
    lib = by_library(extraction, "hanging")
    assert lib.status == "timeout" and len(lib.tasks) == 1
    assert reasons(lib)[-1] == "library_timeout"
    assert 25.0 <= lib.elapsed_s < 60


def test_crashing_plugin_is_reported(extraction):
    lib = by_library(extraction, "crashing")
    assert lib.status == "crashed" and reasons(lib) == ["library_crashed"]


def test_invalid_specs_are_rejected_one_by_one(extraction):
    lib = by_library(extraction, "invalid")
    assert reasons(lib) == [
        "invalid_spec",
        "invalid_spec",
        "ok",
        "duplicate_name",
        "ok",
        "forward_error",
    ]
    assert {t.ops[0] for t in lib.tasks} == {"torch.relu", "torch.cumsum"}
    assert all(t.meta["seed"]["library"] == "invalid" for t in lib.tasks)


def test_factory_that_raises(extraction):
    lib = by_library(extraction, "broken")
    assert reasons(lib) == ["library_error"] and "cannot start" in lib.verdicts[0].detail


def test_unknown_library_is_one_line_listing_known():
    with pytest.raises(ValueError) as err:
        resolve_names(["jax"], SeedsConfig())
    message = str(err.value)
    assert "'jax'" in message and "torch, transformers" in message and "\n" not in message


def test_entry_point_plugin_is_discovered(tmp_path, monkeypatch):
    dist = tmp_path / "tiny_seeds-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-seeds\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[opsynth.seed_libraries]\ntiny = hostile_seeds:Invalid\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    known = known_libraries(SeedsConfig())
    assert known["tiny"] == ("hostile_seeds:Invalid", "entry point")
    assert known["torch"][0] == "opsynth.synth.catalog.torch_library:TorchCatalog"


def test_cli_unknown_library_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opsynth.flows.cli",
            "seeds",
            "extract",
            "--library",
            "jax",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown seed library 'jax'" in lines[0] and "einops" in lines[0]
