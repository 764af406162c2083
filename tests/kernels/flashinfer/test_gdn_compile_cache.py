"""FlashInfer's GDN prefill kernels kept on disk (kernels/flashinfer/gdn_compile_cache.py), on a stand-in for
FlashInfer's module: its two lookups go through our store, a second process (a fresh dict) loads instead of
compiling, keys that name objects by address are never stored, a failing load falls back to FlashInfer's
compile, and nothing is routed with the compile caches off. The real kernels need an sm_90 GPU."""

from __future__ import annotations

import sys
import types

import pytest

from attnbench.kernels.cute import compile_cache
from attnbench.kernels.flashinfer import gdn_compile_cache as gcc


class Kernel:
    """A FlashInfer kernel class: its in-process key is its MRO and the attributes it specializes on."""

    def __init__(self, d=128, extra=None):
        self.key = (type(self).__mro__, ("D", d)) + ((("extra", extra),) if extra is not None else ())

    def _get_compile_key(self):
        return self.key


def _flashinfer(compiles: list) -> tuple[types.ModuleType, types.ModuleType]:
    """(custom_compile_cache, a kernel module that imported its two functions by name), as FlashInfer has them."""
    cc = types.ModuleType("fake_custom_compile_cache")
    cc._in_mem_compile_cache = {}
    cc._compile_options_key = lambda options: None if options is None else tuple(options)

    def get_cached_compile(func, compile_options=None):
        return cc._in_mem_compile_cache.get((func._get_compile_key(), cc._compile_options_key(compile_options)))

    def cached_compile(func, *args, compile_options=None, **kwargs):
        fn = ("compiled", func._get_compile_key()[1:], args)
        compiles.append(fn)
        cc._in_mem_compile_cache[(func._get_compile_key(), cc._compile_options_key(compile_options))] = fn
        return fn

    get_cached_compile.__module__ = cached_compile.__module__ = cc.__name__
    cc.get_cached_compile, cc.cached_compile = get_cached_compile, cached_compile
    mod = types.ModuleType("fake_delta_rule_sm90")
    mod.get_cached_compile, mod.cached_compile = get_cached_compile, cached_compile
    return cc, mod


@pytest.fixture
def disk(monkeypatch, tmp_path):
    """compile_cache's store and load, on plain files (the real ones export and load TVM-FFI objects)."""
    stored: dict = {}
    monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", "on")  # the test suite runs with them off

    def store(root, name, fn, key):
        (root / f"{name}.json").parent.mkdir(parents=True, exist_ok=True)
        (root / f"{name}.json").write_text("{}")
        stored[name] = fn

    def load(root, name):
        return stored.get(name) if (root / f"{name}.json").is_file() else None

    monkeypatch.setattr(compile_cache, "store", store)
    monkeypatch.setattr(compile_cache, "load", load)
    monkeypatch.setattr(gcc, "COUNTS", {"loaded": 0, "stored": 0})
    monkeypatch.setattr(gcc, "PROBLEMS", [])
    monkeypatch.setattr(gcc, "ROUTED", [])
    return stored


def _process(monkeypatch, compiles):
    cc, mod = _flashinfer(compiles)
    monkeypatch.setitem(sys.modules, cc.__name__, cc)
    return cc, mod


def test_a_later_process_loads_what_an_earlier_one_compiled(monkeypatch, tmp_path, disk):
    compiles: list = []
    cc, mod = _process(monkeypatch, compiles)
    assert gcc.route(mod, tmp_path) and not gcc.route(mod, tmp_path)  # once
    k = Kernel()
    assert mod.get_cached_compile(k, ("sm_90a",)) is None  # nothing anywhere yet: FlashInfer compiles
    first = mod.cached_compile(k, "args", compile_options=("sm_90a",))
    assert len(compiles) == 1 and len(disk) == 1 and gcc.COUNTS == {"loaded": 0, "stored": 1}
    assert mod.get_cached_compile(k, ("sm_90a",)) is first  # its own dict, in the same process

    cc2, mod2 = _process(monkeypatch, compiles)  # another worker: FlashInfer's dict is empty
    gcc.route(mod2, tmp_path)
    got = mod2.get_cached_compile(Kernel(), ("sm_90a",))
    assert got == first and len(compiles) == 1 and gcc.COUNTS["loaded"] == 1
    assert list(cc2._in_mem_compile_cache.values()) == [first]  # FlashInfer's later lookups are its own
    # another specialization or other options: a miss, compiled and stored beside it
    assert mod2.get_cached_compile(Kernel(d=64), ("sm_90a",)) is None
    assert mod2.get_cached_compile(Kernel(), ("sm_100a",)) is None
    mod2.cached_compile(Kernel(d=64), "args", compile_options=("sm_90a",))
    assert len(disk) == 2 and "1 loaded, 2 stored" in gcc.state()


def test_a_key_that_names_an_object_by_address_is_never_stored(monkeypatch, tmp_path, disk):
    compiles: list = []
    _, mod = _process(monkeypatch, compiles)
    gcc.route(mod, tmp_path)
    k = Kernel(extra=object())  # repr "<object object at 0x...>": another key in every process
    mod.cached_compile(k, "args", compile_options=None)
    assert len(compiles) == 1 and disk == {} and mod.get_cached_compile(Kernel(extra=object())) is None


def test_a_failing_load_is_a_compile_and_a_problem_said(monkeypatch, tmp_path, disk):
    compiles: list = []
    _, mod = _process(monkeypatch, compiles)
    gcc.route(mod, tmp_path)
    mod.cached_compile(Kernel(), "args", compile_options=None)

    def broken(root, name):
        raise OSError("truncated object")

    monkeypatch.setattr(compile_cache, "load", broken)
    _, mod2 = _process(monkeypatch, compiles)
    gcc.route(mod2, tmp_path)
    assert mod2.get_cached_compile(Kernel(), None) is None  # FlashInfer compiles, as without the store
    assert gcc.PROBLEMS == ["load: OSError: truncated object"] and "problems: load" in gcc.state()


def test_nothing_is_routed_with_the_compile_caches_off(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", "off")
    imported = []
    monkeypatch.setattr(gcc.importlib, "import_module", lambda name: imported.append(name))
    assert gcc.install() == [] and imported == [] and gcc.state() == "off"
