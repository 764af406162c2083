"""FlashInfer as an optional library: availability, the lazy import, workspaces, prepare timings.

Nothing here imports FlashInfer at module import time: `import attnbench.kernels` works on any
machine, and `unavailable()` turns a missing package or GPU into a skip reason.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from collections.abc import Callable
from types import ModuleType

import torch

FLOAT_WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace (split-KV partials)
TESTED_VERSION = "0.7.2.post1"  # the version these adapters were written against

_WORKSPACES: dict[str, torch.Tensor] = {}


def _installed() -> bool:
    try:
        return importlib.util.find_spec("flashinfer") is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def _import_problem() -> str | None:
    """None when `import flashinfer` works (imported once, on a CUDA machine only)."""
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # a broken install is a reason, not a crash
        return f"flashinfer does not import: {type(e).__name__}: {e}"
    return None


def unavailable(need_sm90: bool = False) -> str | None:
    """Why FlashInfer cannot run here (None: it can). `need_sm90`: the fa3 (Hopper) kernels."""
    if not _installed():
        return "FlashInfer is not installed (pip install 'attnbench[gpu]')"
    if not torch.cuda.is_available():
        return "FlashInfer needs a CUDA GPU; none is visible"
    problem = _import_problem()
    if problem:
        return problem
    if need_sm90:
        major, minor = torch.cuda.get_device_capability()
        if major != 9:
            return f"FlashInfer's fa3 kernels need an SM90 (Hopper) GPU; this one is sm_{major}{minor}"
    return None


def flashinfer() -> ModuleType:
    """The imported flashinfer module (call after `unavailable()` said None)."""
    import flashinfer as fi

    return fi


def float_workspace(device: torch.device) -> torch.Tensor:
    """One 128 MiB zeroed uint8 float workspace per device, shared by every wrapper.

    Wrappers use it as split-KV scratch during `run()` only (their plan info lives in each
    wrapper's own int workspace), so sequential runs of different wrappers may share it.
    """
    key = str(torch.device(device))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = torch.zeros(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _WORKSPACES[key] = ws
    return ws


def timed_twice(step: Callable[[], object]) -> tuple[float, float]:
    """(first-use overhead s, steady cost s) of a host-side step such as `plan()`.

    The first call builds or loads the JIT module the step needs (cached in-process); the second
    costs what a plan costs in a serving loop. The overhead is the difference, clamped at 0.
    """
    t0 = time.perf_counter()
    step()
    t1 = time.perf_counter()
    step()
    t2 = time.perf_counter()
    return max(0.0, (t1 - t0) - (t2 - t1)), t2 - t1


def timed(step: Callable[[], object]) -> tuple[object, float]:
    """(result, seconds) of one host-side step."""
    t0 = time.perf_counter()
    out = step()
    return out, time.perf_counter() - t0
