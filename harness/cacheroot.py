"""Where attnbench keeps what outlives a run on this machine: `$ATTNBENCH_CACHE`, else
`$XDG_CACHE_HOME/attnbench`, else `~/.cache/attnbench`. Under it: `refs/` (the reference cache,
store/refcache.py), `peaks.json` (measured GPU peaks, run/peaks.py) and the compile caches
(`compile_cache_dir`): `compile/cute/` (our CuTe DSL kernels, kernels/cute/compile_cache.py) and the
ones backends point their libraries at (`compile/fa4/`). `$ATTNBENCH_COMPILE_CACHE=off` turns every
compile cache attnbench sets up off (`compile_caches_on`); workers inherit it with the environment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

COMPILE_CACHE_ENV = "ATTNBENCH_COMPILE_CACHE"  # "off": no compile cache read or written by attnbench


def cache_root() -> Path:
    if root := os.environ.get("ATTNBENCH_CACHE", "").strip():
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnbench"


def compile_caches_on() -> bool:
    """False when `$ATTNBENCH_COMPILE_CACHE` is `off` (or `0`, `no`, `false`): compiled kernels are
    neither loaded from nor stored under the cache root, and no library is pointed there."""
    return os.environ.get(COMPILE_CACHE_ENV, "").strip().lower() not in ("off", "0", "no", "false")


def compile_cache_dir(library: str) -> Path:
    """A library's persistent compile cache under the cache root (`compile/<library>`), not created
    here (the library creates it when it first writes)."""
    return cache_root() / "compile" / library


def compile_caches() -> list[tuple[Path, int, int]]:
    """(directory, files, bytes) of each compile cache under `compile/` of the cache root."""
    root = cache_root() / "compile"
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        sizes = [f.stat().st_size for f in d.rglob("*") if f.is_file()]
        out.append((d, len(sizes), sum(sizes)))
    return out


def clear_compile_caches() -> int:
    """Delete every compile cache under `compile/` of the cache root (attnbench owns that folder: the
    libraries write there only because attnbench points them there); the number of files deleted."""
    n = sum(files for _, files, _ in compile_caches())
    for d, _, _ in compile_caches():
        shutil.rmtree(d, ignore_errors=True)
    return n
