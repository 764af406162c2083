"""Shared helpers of the Triton attention kernels: head-dim tiling, device facts, dot precision.

Nothing here launches a kernel. Launch configurations (block sizes, warps, stages) live next to the
kernel they configure (decode.py, extend.py); this module only answers questions every launcher asks.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(x) = log2(x) * LN2
ASSUMED_SMS = 132  # H100/H200 SXM; used in the interpreter, where there is no device to ask


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (ASSUMED_SMS on the CPU)."""
    if device.type != "cuda":
        return ASSUMED_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def arch(device: torch.device) -> int:
    """Compute capability as one number (90 for Hopper); 90 on the CPU so CPU runs use Hopper configs."""
    if device.type != "cuda":
        return 90
    major, minor = _capability(device.index if device.index is not None else torch.cuda.current_device())
    return 10 * major + minor


@dataclass(frozen=True)
class HeadSplit:
    """How a key head dim `Dk` is tiled: a main part `DA` plus an optional second part `DB` (0: none).

    Both parts are powers of two of at least 16 (the smallest K of a tensor-core dot); loads are masked
    to `Dk`. Splitting avoids padding non-power-of-two dims to the next power of two:
    576 = 512 + 64 (MLA latent + rope), 192 = 128 + 64, 96 = 64 + 32, 80 = 64 + 16; 13 -> 16.
    """

    dk: int
    da: int
    db: int

    @property
    def mask_a(self) -> bool:
        return self.da > self.dk

    @property
    def mask_b(self) -> bool:
        return self.db > 0 and self.da + self.db > self.dk


def head_split(dk: int) -> HeadSplit:
    """The tiling of a key head dim (see HeadSplit)."""
    da = max(16, 1 << (dk.bit_length() - 1))  # largest power of two <= dk, at least 16
    rest = dk - da
    db = 0 if rest <= 0 else max(16, triton.next_power_of_2(rest))
    return HeadSplit(dk, da, db)


def block_dv(dv: int) -> int:
    """Value head dim tile: the next power of two, at least 16 (loads and stores masked to `dv`)."""
    return max(16, triton.next_power_of_2(dv))


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: exact fp32 products for fp32 inputs (never TF32), native otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


def v_is_k_prefix(k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when `v` is `k[..., :Dv]` (absorbed MLA: the value is the latent part of the key)."""
    return (
        v.data_ptr() == k.data_ptr()
        and v.stride() == k.stride()
        and v.shape[:-1] == k.shape[:-1]
        and v.shape[-1] <= k.shape[-1]
    )


@triton.jit
def soft_cap_scores(s, scale_over_cap, cap_log2e):
    """`cap * tanh(s * scale / cap)`, times log2(e) (the kernels' softmax is base 2).

    tanh to about one ulp from exp2 alone (no libdevice, so the interpreter runs it too): an odd
    polynomial below |x| = 0.625 (Cephes' single-precision tanhf coefficients), `1 - 2 / (e^{2|x|} + 1)`
    above. The shortcut `2 sigmoid(2x) - 1` loses up to 1e-7 absolutely near 0, which a soft cap of 50
    turns into score errors larger than an fp32 LSE check allows.
    """
    x = s * scale_over_cap
    z = x * x
    small = (((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
              - 3.33332819422e-1) * z * x + x)  # fmt: skip
    big = 1.0 - 2.0 / (tl.exp2(tl.abs(x) * 2.8853900817779268) + 1.0)  # 2 log2(e)
    t = tl.where(tl.abs(x) < 0.625, small, tl.where(x < 0, -big, big))
    return cap_log2e * t


# Triton 3.6's interpreter multiplies bfloat16 dot operands as their raw uint16 bits; under the
# interpreter (only) operands are upcast to fp32 first, which is exact and keeps fp32 accumulation.
_UPCAST_DOT = tl.constexpr(interpreting())


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr):
    """`acc + a @ b` with fp32 accumulation (`tl.dot`), correct under the interpreter as well."""
    if _UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def load_tile(ptrs, m_row, m_col, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Load a 2-D tile `ptrs [R, C]`, masking rows (`m_row [R]`) and/or columns (`m_col [C]`) only
    where the constexpr flags say so (masked elements read 0), so full tiles load without masks."""
    if ROWS and COLS:
        b = tl.load(ptrs, mask=m_row[:, None] & m_col[None, :], other=0.0)
    elif ROWS:
        b = tl.load(ptrs, mask=m_row[:, None], other=0.0)
    elif COLS:
        b = tl.load(ptrs, mask=m_col[None, :], other=0.0)
    else:
        b = tl.load(ptrs)
    return b


def bind_launch(fn, grid: tuple[int, ...], args: tuple, kwargs: dict):
    """A zero-argument launch of `fn[grid](*args, **kwargs)` with the arguments bound once.

    `fn[grid](...)` re-binds and re-specialises every argument on every call (about 10 us of host
    time for a kernel with 40 arguments), which is most of a short decode's time. On CUDA this
    compiles the kernel now and returns a callable that calls the compiled launcher directly with
    the bound arguments (the tensors are the same objects on every call, so their current contents
    are read). Anything unexpected in Triton's internals (or the interpreter, or launch hooks being
    set) falls back to the ordinary launch. The bound launch runs once here (kernels are idempotent:
    they write the same outputs and cache slots on every call).
    """

    def plain():
        fn[grid](*args, **kwargs)

    if interpreting():
        return plain
    try:
        from triton import knobs
        from triton.runtime.driver import driver

        device = driver.active.get_current_device()
        kernel = fn.run(*args, grid=grid, warmup=True, **kwargs)  # compile (or fetch) without launching
        binder = fn.device_caches[device][4]
        values = tuple(binder(*args, **kwargs)[0].values())
        g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
        run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
        get_stream = driver.active.get_current_stream
    except Exception:  # internals moved: the ordinary launch is always right
        return plain

    def fast():
        if knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None:
            return plain()
        run(g0, g1, g2, get_stream(device), function, packed, None, None, None, *values)

    try:  # one trial launch now: a launcher whose calling convention moved fails here, not in the timing
        fast()
    except Exception:
        return plain
    fast.plain = plain
    return fast
