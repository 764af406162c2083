"""What attnbench's own CuTe DSL kernels share: the availability check, the compile cache, the stream.

Nothing here imports cutlass at import time. `unavailable()` says why the kernels cannot run (the
package is missing, no CUDA GPU, a GPU older than sm_90, cutlass does not import); the kernel modules
import cutlass only inside `compile_*`/`prepare_*`.

Compilation: `cute.compile(launch, *args, options="--enable-tvm-ffi")` on the real tensors wrapped by
`from_dlpack(t).mark_layout_dynamic()` (shapes and strides dynamic, the contiguous dim static), so
one compiled function serves every batch and layout of a static configuration; it is then called
with torch tensors and a `cuda.CUstream`. Compiled functions are kept per static key in-process and
on disk (compile_cache.py: cute.compile in 4.8.1 never uses the DSL's own disk cache), so another
process loads them instead of tracing and compiling again.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

MIN_ARCH = 9  # sm_90 (Hopper) and newer

_IMPORT_PROBLEM: list[str | None] = []
_COMPILED: dict[tuple, object] = {}


def _find(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def unavailable() -> str | None:
    """Why our CuTe DSL kernels cannot run here (None: they can)."""
    if not _find("cutlass"):
        return "CuTe DSL is not installed (nvidia-cutlass-dsl 4.8.1: pip install 'attnbench[gpu]')"
    if not torch.cuda.is_available():
        return "our CuTe DSL kernels need a CUDA GPU (sm_90+); none is visible"
    major, minor = torch.cuda.get_device_capability()
    if major < MIN_ARCH:
        return f"our CuTe DSL kernels are built for sm_90+; this GPU is sm_{major}{minor}"
    if not _IMPORT_PROBLEM:
        try:
            import cuda.bindings.driver  # noqa: F401
            import cutlass.cute  # noqa: F401
        except Exception as e:  # a broken install is a reason, not a crash
            _IMPORT_PROBLEM.append(f"cutlass.cute does not import: {type(e).__name__}: {e}")
        else:
            _IMPORT_PROBLEM.append(None)
    return _IMPORT_PROBLEM[0]


def cached_compile(key: tuple, build: Callable[[], object]) -> tuple[object, float, str]:
    """(compiled function(s), seconds spent now, how): in-process first (0.0 s, `memory`), then the
    on-disk cache of compile_cache.py (`loaded`), else `build()` runs (`compiled`, and is stored).
    `key` names everything `build` specializes on; the functions are called with positional
    arguments only (a loaded one has no keyword signature)."""
    if key in _COMPILED:
        return _COMPILED[key], 0.0, "memory"
    from attnbench.kernels.cute.compile_cache import compile_or_load

    fn, spent, how = compile_or_load(key, build)
    _COMPILED[key] = fn
    return fn, spent, how


def dynamic(t: torch.Tensor, align: int | None = None):
    """`t` as a CuTe tensor for compilation: dynamic shape and strides (the contiguous dim static).

    `align` (bytes) declares the data pointer's alignment (checked here); kernels that load 128-bit
    vectors need 16.
    """
    from cutlass.cute.runtime import from_dlpack

    if align is not None:
        check_rows_aligned(t, align)
    return from_dlpack(t, assumed_align=align).mark_layout_dynamic()


def compact(t: torch.Tensor, align: int = 16):
    """`t` (contiguous) as a CuTe tensor whose leading dim alone is dynamic: the other dims and every
    stride are compile-time constants (cheaper address arithmetic than `dynamic`)."""
    from cutlass.cute.runtime import from_dlpack

    if not t.is_contiguous():
        raise ValueError(f"expected a contiguous tensor, got strides {tuple(t.stride())}")
    check_rows_aligned(t, align)
    order = tuple(range(t.dim()))
    return from_dlpack(t, assumed_align=align).mark_compact_shape_dynamic(mode=0, stride_order=order)


def check_rows_aligned(t: torch.Tensor, align: int = 16) -> None:
    """Raise ValueError unless `t` starts on an `align`-byte boundary, its last dim is contiguous and
    every other stride is a multiple of `align` bytes (what vectorised row loads assume)."""
    per = align // t.element_size()
    if t.data_ptr() % align or t.stride(-1) != 1 or any(s % per for s in t.stride()[:-1]):
        raise ValueError(
            f"expected a {align}-byte aligned tensor with a contiguous last dim and strides in multiples of "
            f"{per} elements, got data_ptr % {align} = {t.data_ptr() % align}, strides {tuple(t.stride())}"
        )


def stream_of(device: torch.device):
    """The current torch stream of `device` as a `cuda.CUstream` (the capture stream under a graph)."""
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device=device).cuda_stream)
