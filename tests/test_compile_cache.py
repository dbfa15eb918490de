"""The two compile-cache layers (filters.compile_cache): a trusted one built once and sealed,
private ones that read it and cannot change it. Pure parts, no sandbox; the sandboxed attack
is in test_sandbox_hostile."""

from __future__ import annotations

import os
import stat
import sys
import threading
import types
from pathlib import Path

import pytest

from opsynth.filters import compile_cache


def fake_warm(calls: list[str], fail: str = ""):
    def warm(staging: str) -> str:
        calls.append(staging)
        if fail:
            return fail
        os.makedirs(os.path.join(staging, compile_cache.TRITON, "key1"))
        Path(staging, compile_cache.TRITON, "key1", "kernel.cubin").write_bytes(b"\x7fELF")
        os.makedirs(os.path.join(staging, compile_cache.HEADERS))
        Path(staging, compile_cache.HEADERS, "h.h").write_text("#include <x>\n")
        return ""

    return warm


def test_a_layer_is_built_once_then_sealed(tmp_path: Path) -> None:
    calls: list[str] = []
    layer, problem = compile_cache.ensure_layer(str(tmp_path), "cpu", fake_warm(calls), print)
    assert problem == "" and compile_cache.is_complete(layer)
    assert layer == compile_cache.layer_dir(str(tmp_path), "cpu")
    again, _ = compile_cache.ensure_layer(str(tmp_path), "cpu", fake_warm(calls), print)
    assert again == layer and len(calls) == 1  # found complete, not warmed again
    kernel = Path(layer, compile_cache.TRITON, "key1", "kernel.cubin")
    assert not kernel.stat().st_mode & 0o222  # no write bit left on a file
    assert kernel.stat().st_uid == os.getuid()
    assert not [p for p in Path(tmp_path).rglob(".warming-*") if p.is_dir()]


def test_a_failed_warm_up_leaves_no_layer_and_says_why(tmp_path: Path) -> None:
    calls: list[str] = []
    layer, problem = compile_cache.ensure_layer(
        str(tmp_path), "cuda", fake_warm(calls, fail="no GPU"), print
    )
    assert problem == "no GPU"
    assert layer == compile_cache.empty_dir(str(tmp_path)) and os.listdir(layer) == []
    assert not os.path.exists(compile_cache.layer_dir(str(tmp_path), "cuda"))
    assert not os.path.exists(calls[0])  # the staging folder is gone


def test_pools_starting_together_share_one_warm_up(tmp_path: Path) -> None:
    calls: list[str] = []
    results: list[tuple[str, str]] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                compile_cache.ensure_layer(str(tmp_path), "cpu", fake_warm(calls), print)
            )
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len({layer for layer, _ in results}) == 1


def test_another_torch_gets_another_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    before = compile_cache.fingerprint("cpu")
    real = compile_cache.importlib.metadata.version
    monkeypatch.setattr(
        compile_cache.importlib.metadata,
        "version",
        lambda name: "0.0.1" if name == "torch" else real(name),
    )
    assert compile_cache.fingerprint("cpu") != before
    assert compile_cache.fingerprint("cuda") != compile_cache.fingerprint("cpu")


def test_private_triton_cache_links_every_trusted_entry(tmp_path: Path) -> None:
    layer, _ = compile_cache.ensure_layer(str(tmp_path), "cpu", fake_warm([]), print)
    private = tmp_path / "tmp" / compile_cache.PRIVATE / "triton"
    assert compile_cache.link_trusted(layer, str(private)) == 1
    link = private / "key1"
    assert link.is_symlink() and (link / "kernel.cubin").read_bytes() == b"\x7fELF"
    assert compile_cache.link_trusted(layer, str(private)) == 0  # already linked
    assert compile_cache.link_trusted(str(tmp_path / "missing"), str(private)) == 0


def test_private_env_points_inside_the_wiped_temp_dir() -> None:
    env = compile_cache.private_env("/tmp")
    assert set(env) == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    assert all(value.startswith(f"/tmp/{compile_cache.PRIVATE}/") for value in env.values())


def test_headers_come_from_the_trusted_layer_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header the trusted layer has is used; one it lacks is not built (the read-only layer
    refuses the write): the compile goes on without a precompiled header."""
    headers = tmp_path / compile_cache.HEADERS
    headers.mkdir()
    (headers / "known.h").write_text("")

    def precompile(name: str) -> str:
        path = Path(codecache._HEADER_DIR) / name
        if not path.exists():
            path.write_text("")  # what inductor does on a miss
        return str(path)

    codecache = types.ModuleType("torch._inductor.codecache")
    codecache._precompile_header = precompile  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch._inductor.codecache", codecache)
    assert compile_cache.use_trusted_headers(str(tmp_path), str(tmp_path / "locks"))
    assert compile_cache.use_trusted_headers(str(tmp_path), str(tmp_path / "locks"))
    assert codecache._precompile_header("known.h") == str(headers / "known.h")
    headers.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(headers, os.W_OK):  # root writes anyway: refuse as a read-only mount does
            codecache._HEADER_DIR = str(tmp_path / "missing" / "dir")
        assert codecache._precompile_header("new.h") is None
    finally:
        headers.chmod(0o755)
    assert not (headers / "new.h").exists()


def test_no_header_step_no_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch._inductor.codecache", types.ModuleType("codecache"))
    assert compile_cache.use_trusted_headers("/nowhere", "/nowhere/locks") is False


def test_preimport_loads_the_named_modules_and_skips_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker imports what the warm-up named before it forks candidates: a real module
    loads, a missing one or a line that is not a module name is skipped, never raised."""
    package = tmp_path / "site" / "preimport_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "codegen.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in ("preimport_probe", "preimport_probe.codegen"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / compile_cache.IMPORTS).write_text(
        "preimport_probe.codegen\nno_such_module_anywhere\nos;system\n../evil\n"
    )
    assert compile_cache.preimport(str(layer)) == 4
    assert sys.modules["preimport_probe.codegen"].LOADED
    assert "no_such_module_anywhere" not in sys.modules
    assert compile_cache.preimport(str(tmp_path / "no-layer")) == 0
    assert compile_cache.preimport("") == 0  # no layer: nothing read, not even from the cwd


def test_the_warm_up_names_library_modules_not_generated_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Modules loaded from a cache (inductor's generated code) cannot be imported by name in
    another process: only those with a source file elsewhere are named."""
    cache, site = tmp_path / "cache", tmp_path / "site"
    for folder, name in ((cache, "c3kap5generated"), (site, "library_mod")):
        folder.mkdir()
        (folder / f"{name}.py").write_text("")
        monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    try:
        import c3kap5generated  # noqa: F401
        import library_mod  # noqa: F401

        assert compile_cache.imported_since(before, outside=(str(cache), "")) == ["library_mod"]
    finally:
        sys.modules.pop("c3kap5generated", None)
        sys.modules.pop("library_mod", None)


ADOPT = """
import json, os, sys
import torch
from torch._inductor import cpu_vec_isa
from opsynth.filters import compile_cache
adopted = compile_cache.adopt_vec_isa(sys.argv[1])
usable = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
flags = cpu_vec_isa.x86_isa_checker() if hasattr(cpu_vec_isa, "x86_isa_checker") else []
built = [n for _, _, files in os.walk(os.environ["TORCHINDUCTOR_CACHE_DIR"]) for n in files]
print(json.dumps({"adopted": adopted, "usable": usable, "avx2": "avx2" in flags, "built": built}))
"""


def _adopt(layer: Path, cache: Path) -> dict:
    """``adopt_vec_isa`` in a fresh interpreter: the list it settles is cached per process."""
    import json
    import subprocess

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", ADOPT, str(layer)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="inductor probes x86 sets on Linux")
def test_a_worker_takes_the_usable_vector_sets_from_the_record(tmp_path: Path) -> None:
    """The record stands for inductor's probe builds: a set it names is usable where the CPU
    has the flags, one it leaves out is not, and no probe library is built either way."""
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / compile_cache.VEC_ISA).write_text("avx2\nno_such_set\n")
    found = _adopt(layer, tmp_path / "inductor")
    assert found["usable"] == (["avx2"] if found["avx2"] else [])  # avx512 is left out
    assert found["adopted"] == len(found["usable"]) and found["built"] == []
    # no record: nothing settled here, inductor probes when a compile first asks
    assert compile_cache.adopt_vec_isa(str(tmp_path / "no-layer")) == -1
    assert compile_cache.adopt_vec_isa("") == -1
