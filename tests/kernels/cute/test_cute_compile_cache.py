"""Our CuTe DSL kernels' on-disk compile cache (kernels/cute/compile_cache.py).

With the DSL installed (no GPU needed: the kernels are cross-compiled for sm_90a), a second process
loads the compiled decode (two functions) and GDN decode from the cache instead of building them; the
off switch writes nothing. Without the DSL, the wiring: where the cache lives, what its key covers,
the off switch (ours and FA4's), a failed store that still returns the compiled function, `clear`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.cacheroot import compile_cache_dir
from attnbench.kernels.cute import common, compile_cache

PROBE = Path(__file__).with_name("compile_cache_probe.py")


def _has(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _probe(cache: Path, **env) -> dict[str, dict]:
    run = subprocess.run(
        [sys.executable, str(PROBE)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "ATTNBENCH_CACHE": str(cache), "CUTE_DSL_ARCH": "sm_90a", "ATTNBENCH_COMPILE_CACHE": "on", **env},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return {r["kernel"]: r for r in map(json.loads, (line for line in run.stdout.splitlines() if line.startswith("{")))}


@pytest.mark.skipif(not (_has("cutlass.cute") and _has("tvm_ffi")), reason="needs nvidia-cutlass-dsl, apache-tvm-ffi")
def test_a_second_process_loads_the_compiled_kernels_instead_of_building_them(tmp_path):
    first = _probe(tmp_path)
    assert {k: r["how"] for k, r in first.items()} == {"decode": "compiled", "gdn": "compiled"}
    files = sorted(p.name for p in (tmp_path / "compile" / "cute").iterdir())
    assert len(files) == 5 and sum(f.endswith(".json") for f in files) == 2, files  # decode: 2 objects, gdn: 1

    second = _probe(tmp_path)
    assert {k: r["how"] for k, r in second.items()} == {"decode": "loaded", "gdn": "loaded"}
    assert second["gdn"]["builds"] == [], "a build ran although the cache held its functions"
    assert len(second["decode"]["types"]) == 2 and len(second["gdn"]["types"]) == 1
    assert second["decode"]["s"] < first["decode"]["s"]

    off = tmp_path / "off"
    third = _probe(off, ATTNBENCH_COMPILE_CACHE="off")
    assert {r["how"] for r in third.values()} == {"compiled (cache off)"}
    assert not off.exists()


def test_the_cache_lives_under_the_cache_root_and_the_switch_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("ATTNBENCH_COMPILE_CACHE", raising=False)
    assert compile_cache.directory() == tmp_path / "compile" / "cute" == compile_cache_dir("cute")
    for off in ("off", "OFF", "0", "false"):
        monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", off)
        assert compile_cache.directory() is None


def test_the_key_covers_the_static_key_the_arch_and_the_build_source(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    src = tmp_path / "kernel.py"
    src.write_text("A = 1\n")
    base = compile_cache.digest(("decode", 1, 2.0), str(src))
    assert compile_cache.digest(("decode", 1, 2.0), str(src)) == base
    assert compile_cache.digest(("decode", 1, 2.5), str(src)) != base
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert compile_cache.digest(("decode", 1, 2.0), str(src)) != base
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    compile_cache._source_digest.cache_clear()
    src.write_text("A = 2\n")
    assert compile_cache.digest(("decode", 1, 2.0), str(src)) != base
    compile_cache._source_digest.cache_clear()


def test_a_package_source_edit_changes_the_key(monkeypatch, tmp_path):
    """Every module of kernels/cute is in the key (a kernel's helpers live in other files)."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    pkg = tmp_path / "cute"
    pkg.mkdir()
    (pkg / "decode.py").write_text("x = 1\n")
    (pkg / "decode_plan.py").write_text("y = 1\n")
    monkeypatch.setattr(compile_cache, "__file__", str(pkg / "compile_cache.py"))
    compile_cache._source_digest.cache_clear()
    base = compile_cache.digest(("k",))
    (pkg / "decode_plan.py").write_text("y = 2\n")
    compile_cache._source_digest.cache_clear()
    assert compile_cache.digest(("k",)) != base
    compile_cache._source_digest.cache_clear()


def test_off_builds_every_time_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", "off")
    built = []
    fn, _, how = compile_cache.compile_or_load(("k",), lambda: built.append(1) or "fn")
    assert (fn, how, built) == ("fn", "compiled (cache off)", [1])
    assert not (tmp_path / "compile").exists()


def test_a_failed_store_still_returns_the_compiled_function(monkeypatch, tmp_path):
    """An object that cannot be exported (not a TVM-FFI function) is used all the same; the row's
    prepare_info says why nothing was stored, and no torn entry is left behind."""
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("ATTNBENCH_COMPILE_CACHE", raising=False)
    monkeypatch.setattr(common, "_COMPILED", {})
    fn, _, how = common.cached_compile(("k", 1), lambda: "not exportable")
    assert fn == "not exportable"
    assert how.startswith("compiled (cache problem: store: AttributeError")
    assert not list((tmp_path / "compile" / "cute").glob("*.json"))
    assert common.cached_compile(("k", 1), lambda: "other") == ("not exportable", 0.0, "memory")


def test_cache_info_lists_and_clear_compile_deletes_the_compile_caches(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("ATTNBENCH_COMPILE_CACHE", raising=False)
    for lib, name in (("cute", "ab-0.o"), ("cute", "ab.json"), ("fa4", "sub/k.bin")):
        (tmp_path / "compile" / lib / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "compile" / lib / name).write_bytes(b"x" * 1000)
    (tmp_path / "peaks.json").write_text("{}")
    res = CliRunner().invoke(app, ["cache", "info", "--ref-cache", "off"])
    assert res.exit_code == 0, res.output
    assert "cute: 2 compiled files" in res.output and "fa4: 1 compiled files" in res.output
    res = CliRunner().invoke(app, ["cache", "clear", "--ref-cache", "off"])  # without --compile: kept
    assert res.exit_code == 0 and (tmp_path / "compile" / "cute" / "ab.json").exists()
    res = CliRunner().invoke(app, ["cache", "clear", "--ref-cache", "off", "--compile"])
    assert res.exit_code == 0 and "3 compiled files deleted" in res.output, res.output
    assert not list((tmp_path / "compile").iterdir()) and (tmp_path / "peaks.json").exists()
    monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", "off")
    assert "compile caches are off" in CliRunner().invoke(app, ["cache", "info", "--ref-cache", "off"]).output


def test_fa4_is_not_pointed_at_the_cache_when_compile_caches_are_off(monkeypatch, tmp_path):
    from attnbench.kernels.cute import fa4

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", "off")
    monkeypatch.delenv(fa4.CACHE_ENV, raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    fa4.use_compile_cache()
    assert fa4.CACHE_ENV not in os.environ and "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" not in os.environ
