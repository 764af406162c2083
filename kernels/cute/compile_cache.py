"""Our CuTe DSL kernels' compiled functions kept on disk, so that another process (a worker, the next
run) loads them instead of tracing and compiling each static configuration again (about 2 s a
configuration on an H100 machine, h100-session16).

The DSL's own file cache does not serve us: `cute.compile` (compile-only) turns it off in
nvidia-cutlass-dsl 4.8.1 (`BaseDSL._prepare_compilation`: "Cache is disabled as user wants to compile
only"), and it is keyed by the traced IR, so even an implicit JIT call traces again before it looks.
This cache is keyed before tracing and stores the ahead-of-time export of each TVM-FFI function a
build returned (`export_to_c`, loaded back by `cute.runtime.load_module`).

Where: `compile_cache_dir("cute")` under the attnbench cache root (harness/cacheroot.py); off with
`$ATTNBENCH_COMPILE_CACHE=off`; `attnbench cache clear --compile` deletes it. An entry is
`<digest>-<i>.o` (one per function of the build, in order) and `<digest>.json`, written last: an
entry without its JSON is not one. Every file is written to a temporary name and renamed into place,
so workers sharing the directory never load a torn object.

The digest covers the caller's in-process key (which must name everything the build specializes on,
as for the in-process cache), the target architecture (`$CUTE_DSL_ARCH`, else the current GPU's), the
versions of nvidia-cutlass-dsl and apache-tvm-ffi, and the source of every module of this package and
of the module that defines the build: an edit to a kernel compiles again. A loaded function is a
`tvm_ffi.Function`: call it with positional arguments, as our kernels' closures do. A load or store
that fails is reported in the returned state and falls back to compiling; it never fails a row.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

from attnbench.cacheroot import compile_cache_dir, compile_caches_on

FORMAT = 1


def directory() -> Path | None:
    """The cache directory, or None when `$ATTNBENCH_COMPILE_CACHE=off`."""
    return compile_cache_dir("cute") if compile_caches_on() else None


@cache
def _source_digest(extra: str) -> str:
    """SHA-256 over this package's modules (names and bytes) and `extra` (the build's own file)."""
    files = sorted(Path(__file__).resolve().parent.glob("*.py"))
    if extra and Path(extra).resolve() not in files and Path(extra).is_file():
        files.append(Path(extra).resolve())
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def target_arch() -> str:
    """What the DSL compiles for: `$CUTE_DSL_ARCH`, else the current CUDA device's `sm_XY`."""
    if arch := os.environ.get("CUTE_DSL_ARCH", "").strip():
        return arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "none"


def digest(key: tuple, build_file: str = "") -> str:
    """The entry name of `key` for a build defined in `build_file` (see the module docstring)."""
    parts = {
        "format": FORMAT,
        "key": repr(key),
        "arch": target_arch(),
        "cutlass_dsl": _version("nvidia-cutlass-dsl"),
        "tvm_ffi": _version("apache-tvm-ffi"),
        "sources": _source_digest(build_file),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def _symbol(name: str, i: int) -> str:
    return f"attnbench_cute_{name[:16]}_{i}"


def load(root: Path, name: str):
    """The functions stored as `name` (one, or a tuple as the build returned them), or None."""
    meta_path = root / f"{name}.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    import cutlass.cute as cute

    fns = []
    for i in range(int(meta["functions"])):
        module = cute.runtime.load_module(str(root / f"{name}-{i}.o"), enable_tvm_ffi=True)
        fns.append(getattr(module, _symbol(name, i)))
    return tuple(fns) if meta["tuple"] else fns[0]


def store(root: Path, name: str, compiled, key: tuple) -> None:
    """Export `compiled` (a TVM-FFI compiled function or a tuple of them) as entry `name`."""
    fns = compiled if isinstance(compiled, tuple) else (compiled,)
    root.mkdir(parents=True, exist_ok=True)
    tag = f".tmp.{os.getpid()}"
    for i, fn in enumerate(fns):
        path = root / f"{name}-{i}.o"
        fn.export_to_c(str(path) + tag, function_name=_symbol(name, i))
        os.replace(str(path) + tag, path)
    meta = {"format": FORMAT, "functions": len(fns), "tuple": isinstance(compiled, tuple), "key": repr(key)}
    (root / f"{name}.json{tag}").write_text(json.dumps(meta))
    os.replace(root / f"{name}.json{tag}", root / f"{name}.json")


def compile_or_load(key: tuple, build: Callable[[], object]) -> tuple[object, float, str]:
    """(the compiled function(s), seconds spent, how): `how` is `loaded` (from disk), `compiled`
    (and stored), `compiled (cache off)`, or `compiled (cache problem: ...)` when a load or store
    failed (the compiled function is used all the same)."""
    root = directory()
    t0 = time.perf_counter()
    if root is None:
        return build(), time.perf_counter() - t0, "compiled (cache off)"
    problem, name = "", None
    try:
        name = digest(key, getattr(getattr(build, "__code__", None), "co_filename", ""))
        fn = load(root, name)
        if fn is not None:
            return fn, time.perf_counter() - t0, "loaded"
    except Exception as e:  # a torn or foreign entry: compile again and replace it
        problem = f"load: {type(e).__name__}: {e}"
    fn = build()
    spent = time.perf_counter() - t0
    try:
        if name is not None:
            store(root, name, fn, key)
    except Exception as e:
        problem = problem or f"store: {type(e).__name__}: {e}"
    return fn, spent, f"compiled (cache problem: {problem})" if problem else "compiled"
