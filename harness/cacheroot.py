"""Where attnbench keeps what outlives a run on this machine: `$ATTNBENCH_CACHE`, else
`$XDG_CACHE_HOME/attnbench`, else `~/.cache/attnbench`. Under it: `refs/` (the reference cache,
store/refcache.py), `peaks.json` (measured GPU peaks, run/peaks.py) and the compile caches backends
point their libraries at (`compile_cache_dir`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if root := os.environ.get("ATTNBENCH_CACHE", "").strip():
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnbench"


def compile_cache_dir(library: str) -> Path:
    """A library's persistent compile cache under the cache root (`compile/<library>`), not created
    here (the library creates it when it first writes)."""
    return cache_root() / "compile" / library
