"""FlashInfer's CuTe DSL GDN prefill kernels kept on disk, so another process loads them instead of
tracing and compiling them again.

FlashInfer 0.7.2.post1 compiles its SM90 GDN prefill kernels (`gdn_kernels/delta_rule_dsl`: the fully
fused kernel and the five of the context-parallel path a T = 32768 request takes) with `cute.compile`
behind an in-process dict only (`custom_compile_cache.cached_compile` / `get_cached_compile`), so every
process that runs `gdn_extend` compiles them again: 12.1 s of a warm `targets` sweep's checked calls on an
H100 (reports/examples/h100-session21/targets2), in every worker of every run. They are compiled as
TVM-FFI functions (`cute.EnableTVMFFI(True)`), which kernels/cute/compile_cache.py exports and loads for
our own CuTe DSL kernels; `install()` routes the two lookups of each FlashInfer module that imported them
through that store:

- `get_cached_compile(func, options)`: FlashInfer's in-process dict first, else our entry for the same
  key, loaded and put into FlashInfer's dict (so its later lookups are its own);
- `cached_compile(func, *args, compile_options=...)`: FlashInfer's compile, then the export to disk.

An entry's key is FlashInfer's own in-process key (the kernel class's MRO and the attributes it
specializes on, `func._get_compile_key()`, and the compile options) with FlashInfer's version, the GPU's
name and SM count (what a process never changes, so FlashInfer's key may leave out) and the bytes of the
module that defines the kernel class; `compile_cache.digest` adds the target architecture, the DSL and
TVM-FFI versions. A key whose text names an object by its address (FlashInfer's automatic
key, which warns) would differ in every process: it is never stored. A load or store that fails
leaves FlashInfer's behaviour as it was (a compile in the process) and is kept in `PROBLEMS`.

Where: `compile_cache_dir("flashinfer-gdn")` under the attnbench cache root; nothing is installed with
`$ATTNBENCH_COMPILE_CACHE=off`; `attnbench cache clear --compile` deletes it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from attnbench.cacheroot import compile_cache_dir, compile_caches_on

LIBRARY = "flashinfer-gdn"
PACKAGE = "flashinfer.gdn_kernels.delta_rule_dsl"
MODULES = ("delta_rule_sm90", "delta_rule_cp_sm90")  # the SM90 prefill paths; others are left as they are
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
PROBLEMS: list[str] = []  # loads and stores that failed, in this process
COUNTS = {"loaded": 0, "stored": 0}
ROUTED: list[str] = []  # the modules routed in this process


def _entry(func, options_key) -> tuple[tuple, str] | None:
    """(key, digest) of FlashInfer's kernel `func` under compile options `options_key`, or None when
    its key cannot name it across processes."""
    from attnbench.kernels.cute import compile_cache

    key = (func._get_compile_key(), options_key)
    if _ADDRESS.search(repr(key)):
        return None
    try:
        version = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        version = "-"
    build_file = inspect.getfile(type(func))
    return key, compile_cache.digest(("flashinfer", version, _device(), key), build_file)


def _device() -> tuple:
    """The GPU's name and SM count: FlashInfer's in-process key can leave out what a process never
    changes (its CUDA path reads the SM count), an entry on disk cannot."""
    import torch

    if not torch.cuda.is_available():
        return ()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return (props.name, props.multi_processor_count)


def route(module: Any, root: Path) -> bool:
    """Point `module`'s `get_cached_compile` and `cached_compile` at the disk store under `root`
    (module docstring); False when it has neither or was routed already."""
    get0, compile0 = getattr(module, "get_cached_compile", None), getattr(module, "cached_compile", None)
    if get0 is None or compile0 is None or getattr(module, "_attnbench_routed", False):
        return False
    from attnbench.kernels.cute import compile_cache

    cc = sys.modules[get0.__module__]  # FlashInfer's custom_compile_cache: its dict and options key

    def get_cached_compile(func, compile_options=None):
        fn = get0(func, compile_options)
        if fn is not None:
            return fn
        try:
            entry = _entry(func, cc._compile_options_key(compile_options))
            fn = compile_cache.load(root, entry[1]) if entry else None
        except Exception as e:  # a torn or foreign entry: FlashInfer compiles (and the store replaces it)
            PROBLEMS.append(f"load: {type(e).__name__}: {e}")
            return None
        if fn is not None:
            cc._in_mem_compile_cache[entry[0]] = fn
            COUNTS["loaded"] += 1
        return fn

    def cached_compile(func, *args, compile_options=None, **kwargs):
        fn = compile0(func, *args, compile_options=compile_options, **kwargs)
        try:
            entry = _entry(func, cc._compile_options_key(compile_options))
            if entry and not (root / f"{entry[1]}.json").is_file():
                compile_cache.store(root, entry[1], fn, entry[0])
                COUNTS["stored"] += 1
        except Exception as e:
            PROBLEMS.append(f"store: {type(e).__name__}: {e}")
        return fn

    module.get_cached_compile, module.cached_compile = get_cached_compile, cached_compile
    module._attnbench_routed = True
    ROUTED.append(module.__name__)
    return True


def install() -> list[str]:
    """Route FlashInfer's SM90 GDN prefill modules through the disk store (once a process; nothing with
    `$ATTNBENCH_COMPILE_CACHE=off` or without those modules): the modules routed now."""
    if not compile_caches_on():
        return []
    routed = []
    for name in MODULES:
        try:
            module = importlib.import_module(f"{PACKAGE}.{name}")
        except Exception as e:  # another FlashInfer, no CuTe DSL: nothing to route
            PROBLEMS.append(f"import {name}: {type(e).__name__}: {e}")
            continue
        if route(module, compile_cache_dir(LIBRARY)):
            routed.append(name)
    return routed


def state() -> str:
    """What the store did in this process so far, for a row's `prepare_info` (the backend says it again
    after each checked call: the first call of a process compiles or loads)."""
    if not compile_caches_on():
        return "off"
    said = f"{COUNTS['loaded']} loaded, {COUNTS['stored']} stored" if ROUTED else "nothing routed"
    return said + (f"; problems: {PROBLEMS[-1]}" if PROBLEMS else "")
