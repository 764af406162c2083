"""Test setup: CPU machines run Triton kernels in the interpreter; GPU-only tests skip with a reason.

Markers (pyproject.toml): gpu, sm90, flashinfer, cute, fla, interpreter. `pytest` on a CPU machine
runs everything that can run there; `pytest -m gpu` (nox -s gpu) on a GPU machine runs the rest.
"""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

# The reference cache (harness/store/refcache.py) is off in tests unless a test turns it on: a test that plants a
# wrong reference must see its reference, and no test writes into the user's cache. Subprocesses inherit it.
os.environ.setdefault("ATTNBENCH_REF_CACHE", "off")
# So are attnbench's compile caches (harness/cacheroot.py): no test loads a kernel another run compiled.
os.environ.setdefault("ATTNBENCH_COMPILE_CACHE", "off")

import pytest  # noqa: E402

# Under pytest-xdist (`-n auto` in pyproject.toml) each worker gets its share of the cores: torch's
# OpenMP pool defaults to every core in every worker, and two spinning pools on two cores ran some
# tests ten times slower than one process. Subprocesses the tests start (sweep workers) inherit it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    torch.set_num_threads(_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core on a CPU machine; none (one process) where a GPU is present, so
    GPU tests never share the device with each other."""
    return 0 if HAS_CUDA else (os.cpu_count() or 1)


def _sm() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if HAS_CUDA else None


def _has(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


_NEEDS = {
    "gpu": (lambda: HAS_CUDA, "needs a CUDA GPU"),
    "sm90": (lambda: HAS_CUDA and _sm()[0] == 9, "needs a Hopper (sm_90) GPU"),
    "flashinfer": (lambda: _has("flashinfer"), "needs FlashInfer (pip install 'attnbench[gpu]')"),
    "cute": (lambda: _has("cutlass") and _has("flash_attn"), "needs CuTe DSL and FlashAttention-4"),
    "fla": (lambda: _has("fla"), "needs flash-linear-attention (fla-core)"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name, (ok, why) in _NEEDS.items():
            if item.get_closest_marker(name) is not None and not ok():
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(scope="session", autouse=True)
def _backends():
    from attnbench.backend import load_builtin

    load_builtin()


@pytest.fixture(autouse=True)
def _registry_restored():
    """Backends a test registers (plugins) do not leak into later tests."""
    from attnbench import backend

    before, problems = dict(backend._REGISTRY), list(backend.LOAD_PROBLEMS)
    yield
    backend._REGISTRY.clear()
    backend._REGISTRY.update(before)
    backend._INSTANCES.clear()
    backend.LOAD_PROBLEMS[:] = problems
