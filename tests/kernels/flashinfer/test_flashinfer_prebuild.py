"""The FlashInfer prebuild builds exactly the JIT modules that `prepare` loads, where it loads them.

Two checks on a CPU, both through FlashInfer's own code (tests/support/fake_flashinfer.py):

- names: for every case of the GPU suites that a FlashInfer backend runs (at CPU size: same
  dtypes, head dims, masks, window, soft cap, sinks, MLA, KV dtype and layout; two short requests),
  the modules the real wrappers load during `prepare` are exactly `prebuild.specs` of the backend's
  `jit_keys(case)`, and the timed closure loads none.
- place: after `prebuild.build`, a wrapper's first use (`JitSpec.build`, real ninja, a fake
  compiler) compiles nothing. Ninja keeps its log per directory it runs in, so modules built from
  another directory (FlashInfer's `build_jit_specs`) were all compiled again at first use.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import pytest
import torch

from attnbench.backend import get_backend, load_builtin
from attnbench.plan.suite import load

SUITES = ("smoke", "decode", "extend", "mla", "swa", "spec")
BACKENDS = ("flashinfer", "flashinfer-fa3", "flashinfer-cudacore", "flashinfer-ragged", "flashinfer-ragged-fa3")
ATTENTION_OPS = ("decode", "extend", "tree_verify", "merge_state")  # the ops prebuild covers
CPU_SIZES = {"batch": 2, "kv_len": 40, "q_len": 6}


def cpu_sized(case):
    """The case with two short requests (a prefix of 17 where it has one), on the CPU; a replayed batch's
    explicit lengths (a trace's, with its trees) give way to those sizes."""
    p = case.params
    fields = type(p).model_fields
    update = {k: v for k, v in CPU_SIZES.items() if k in fields}
    # per-request trees go with the explicit lengths (their mask stays custom, a drawn one)
    update |= {k: None for k in ("q_lens", "prefix_lens", "kv_lens", "trees") if getattr(p, k, None) is not None}
    if getattr(p, "prefix_len", 0):
        update["prefix_len"] = 17
    return dataclasses.replace(case, params=type(p)(**(p.model_dump() | update)), device="cpu")


def pairs() -> list[tuple[str, object]]:
    """(backend, CPU-sized case) for every suite case a FlashInfer backend runs, each once."""
    load_builtin()
    out: dict[tuple[str, str], object] = {}
    for suite in SUITES:
        for case in load(suite, device="cuda").cases:
            if case.op_name not in ATTENTION_OPS:
                continue
            for name in BACKENDS:
                b = get_backend(name)
                if case.op_name in b.ops and b.limits(case) is None:
                    small = cpu_sized(case)
                    assert b.limits(dataclasses.replace(small, device="cuda")) is None, case.id
                    assert b.jit_keys(small) == b.jit_keys(case), case.id
                    out.setdefault((name, small.id), small)
    return [(name, case) for (name, _), case in out.items()]


PAIRS = pairs()


@pytest.fixture
def fake(monkeypatch, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("fake-kernel plumbing runs on CPU machines; GPU machines run the real kernels")
    pytest.importorskip("flashinfer")
    import fake_flashinfer
    from attnbench.kernels.flashinfer import sinks

    monkeypatch.setattr(sinks, "_MODULE_HEAD_DIMS", {})  # sink modules of any head dims, one per test
    rec = fake_flashinfer.fake_kernels(monkeypatch, tmp_path)
    fake_flashinfer.forget_modules()  # so that prepare loads (and records) every module it uses
    yield rec
    fake_flashinfer.CURRENT[0] = None


def test_the_suites_reach_every_path():
    kinds = {(name, k.kind) for name, case in PAIRS for k in get_backend(name).jit_keys(case)}
    fp8 = {name for name, case in PAIRS if case.params.model_dump().get("kv_dtype", "auto") != "auto"}
    assert {k for _, k in kinds} == {"prefill", "prefill-independent", "decode", "mla", "sink", "cascade", "packbits"}
    assert {"flashinfer", "flashinfer-cudacore"} <= fp8
    assert {name for name, _ in PAIRS} == set(BACKENDS)


@pytest.mark.parametrize("backend, case", PAIRS, ids=[f"{b}:{c.id}" for b, c in PAIRS])
def test_prebuild_builds_what_prepare_loads(fake, backend, case):
    from attnbench.kernels.flashinfer import prebuild

    b = get_backend(backend)
    fn = b.prepare(case, case.make_inputs())
    loaded = set(fake.loaded)
    built = {s.name for s in prebuild.specs(b.jit_keys(case))}
    assert loaded, "prepare loaded no JIT module (were FlashInfer's module caches emptied?)"
    assert not loaded - built, f"prepare loads modules that prebuild does not build: {sorted(loaded - built)}"
    assert not built - loaded, f"prebuild builds modules that prepare does not load: {sorted(built - loaded)}"
    fake.loaded.clear()
    fn()
    assert not fake.loaded, f"the timed call loads modules: {fake.loaded}"


FAKE_COMPILER = """#!{python}
import sys
args = sys.argv[1:]
def arg(flag):
    return args[args.index(flag) + 1] if flag in args else None
out, depfile, src = arg("-o"), arg("-MF"), arg("-c")
if out:
    open(out, "w").close()
    if depfile:
        open(depfile, "w").write(out + ": " + (src or "") + "\\n")
    with open({log!r}, "a") as f:
        f.write(out + "\\n")
"""


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs the ninja executable")
def test_first_use_finds_the_prebuilt_modules_up_to_date(monkeypatch, tmp_path):
    pytest.importorskip("flashinfer")
    from attnbench.kernels.flashinfer import prebuild
    from attnbench.kernels.flashinfer.jitkeys import JitKey
    from fake_flashinfer import use_scratch_jit_dirs

    use_scratch_jit_dirs(monkeypatch, tmp_path)
    log = tmp_path / "compiled.txt"
    cc = tmp_path / "fake-cc"
    cc.write_text(FAKE_COMPILER.format(python=sys.executable, log=str(log)))
    cc.chmod(0o755)
    monkeypatch.setenv("FLASHINFER_NVCC", str(cc))
    monkeypatch.setenv("CXX", str(cc))
    keys = [JitKey("decode", "", torch.bfloat16, 64, 64), JitKey("cascade"), JitKey("packbits")]
    specs = prebuild.specs(keys)
    prebuild.build(specs, jobs=4)
    compiled = log.read_text().splitlines()
    assert len(compiled) == sum(len(s.sources) + 1 for s in specs)  # every object, and each module's link
    assert all(s.is_compiled for s in specs)
    for s in specs:
        s.build()  # what a wrapper's first use runs (JitSpec.build_and_load -> build)
    assert log.read_text().splitlines() == compiled, "first use compiled prebuilt modules again"


def test_offline_keys_follow_declared_limits_without_a_gpu(monkeypatch):
    """`--arch` (a machine without a GPU): the modules are those of the cases the declared limits
    admit, the same set a GPU machine's `supports()` gives; `supports()` here says no GPU and gives none."""
    from attnbench.kernels.flashinfer import _lib, prebuild

    load_builtin()
    backends = [get_backend(n) for n in BACKENDS]
    cases = list(load("decode", device="cuda").cases)
    monkeypatch.setattr(_lib, "unavailable", lambda need_sm90=False: "FlashInfer needs a CUDA GPU; none is visible")
    assert prebuild.keys_for(backends, cases) == []
    offline = prebuild.keys_for(backends, cases, offline=True)
    monkeypatch.setattr(_lib, "unavailable", lambda need_sm90=False: None)  # a GPU machine's answer
    assert offline == prebuild.keys_for(backends, cases)
    assert {k.kind for k in offline} >= {"decode", "prefill"}


def test_export_aot_lays_out_flashinfer_aot_folder(tmp_path):
    """Built modules are copied as `<name>/<name>.so` (FlashInfer's data/aot layout); unbuilt ones are not."""
    from attnbench.kernels.flashinfer import prebuild

    built = tmp_path / "cached_ops" / "mod_a" / "mod_a.so"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"\x7fELF")
    specs = [
        type("Spec", (), {"name": "mod_a", "is_aot": False, "jit_library_path": built})(),
        type("Spec", (), {"name": "mod_b", "is_aot": False, "jit_library_path": tmp_path / "nope.so"})(),
    ]
    copied = prebuild.export_aot(specs, tmp_path / "aot")
    assert copied == [tmp_path / "aot" / "mod_a" / "mod_a.so"]
    assert copied[0].read_bytes() == b"\x7fELF" and not (tmp_path / "aot" / "mod_b").exists()


def test_a_machine_without_the_driver_links_against_a_stub(tmp_path, monkeypatch):
    """`--arch` builds link FlashInfer's modules with -lcuda: with no driver and no toolkit stub, a
    stub libcuda.so (soname libcuda.so.1) is made once and put on LIBRARY_PATH; with either, none."""
    import ctypes.util
    import shutil

    from attnbench.kernels.flashinfer import prebuild

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("LIBRARY_PATH", "/elsewhere")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    stub = prebuild.driver_stub(cache=tmp_path / "stub")
    assert stub is not None and stub.exists() and b"libcuda.so.1" in stub.read_bytes()
    assert os.environ["LIBRARY_PATH"].split(os.pathsep) == [str(tmp_path / "stub"), "/elsewhere"]
    (tmp_path / "cuda" / "lib64" / "stubs").mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so").write_bytes(b"")
    assert prebuild.driver_stub(cache=tmp_path / "other") is None
