"""Shared helpers of the Triton attention kernels: head-dim tiling, device facts, dot precision.

Nothing here launches a kernel. Launch configurations (block sizes, warps, stages) live next to the
kernel they configure (decode.py, extend.py); this module only answers questions every launcher asks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.limits import interpreting  # noqa: F401 (re-exported to the launchers)

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(x) = log2(x) * LN2
ASSUMED_SMS = 132  # H100/H200 SXM; used in the interpreter, where there is no device to ask


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
def exp2_(x, PRECISE: tl.constexpr):
    """2^x: `tl.exp2` (ex2.approx, ~2^-22 relative), or with PRECISE (fp32 inputs, whose tolerance
    is set by fp32 math) Cephes' exp2f: x = n + f, |f| <= 1/2, a degree-6 polynomial, times 2^n
    built from the exponent bits (~1 ulp; 0 below 2^-126 like ex2.approx.ftz)."""
    if PRECISE:
        xc = tl.minimum(tl.maximum(x, -126.0), 127.0)
        n = tl.floor(xc + 0.5)
        f = xc - n
        p = 1.535336188319500e-4 * f + 1.339887440266574e-3
        p = p * f + 9.618437357674640e-3
        p = p * f + 5.550332471162809e-2
        p = p * f + 2.402264791363012e-1
        p = p * f + 6.931472028550421e-1
        two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
        y = (1.0 + p * f) * two_n
        y = tl.where(x < -126.0, 0.0, y)
        y = tl.where(x > 127.0, float("inf"), y)
    else:
        y = tl.exp2(x)
    return y


@triton.jit
def soft_cap_scores(s, scale_over_cap, cap_log2e, PRECISE: tl.constexpr):
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
    big = 1.0 - 2.0 / (exp2_(tl.abs(x) * 2.8853900817779268, PRECISE) + 1.0)  # 2 log2(e)
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


# fp8 KV caches (KV_FP8 constexpr: 0 none, 1 float8_e4m3fn, 2 float8_e5m2). Triton 3.6's interpreter
# converts fp32 -> fp8 rounding ties away from zero (and carries a rounded-up mantissa into the exponent
# bits wrongly) and e5m2 -> fp16 wrongly; under the interpreter (only) the conversions below go through
# exact fp32 steps. Compiled kernels use the native conversions (cvt.rn.satfinite: round to nearest even).
_INTERPRET_FP8 = tl.constexpr(interpreting())


def kv_fp8_code(dtype: torch.dtype) -> int:
    """The KV_FP8 constexpr of a cache dtype: 0 (not fp8), 1 (float8_e4m3fn), 2 (float8_e5m2)."""
    return {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(dtype, 0)


def kv_scale_args(x, fallback: torch.Tensor) -> tuple:
    """(k_scale, v_scale, k stride, v stride) kernel arguments: per-tensor `[1]` scales get stride 0,
    per-head `[Hkv]` stride 1; without an fp8 cache any tensor stands in (never read)."""
    if not kv_fp8_code(x.k_cache.dtype):
        return fallback, fallback, 0, 0
    if x.k_scale is None or x.v_scale is None:
        raise ValueError(f"an {x.k_cache.dtype} KV cache needs k_scale and v_scale")
    ks, vs = x.k_scale, x.v_scale
    return ks, vs, 0 if ks.numel() == 1 else ks.stride(0), 0 if vs.numel() == 1 else vs.stride(0)


@triton.jit
def fp8_to(x, like):
    """fp8 values `x` in the dtype of `like` (bf16/fp16/fp32): exact, every fp8 value is one of theirs."""
    if _INTERPRET_FP8:
        return x.to(tl.float32).to(like.dtype)
    else:
        return x.to(like.dtype)


@triton.jit
def fp8_to_f16_rows(x, KV_FP8: tl.constexpr, BITS: tl.constexpr, PINNED: tl.constexpr = True):
    """fp8 `x` as fp16 times `f16_rows_scale(KV_FP8, BITS)`, converted where `x` lives (the layout it was
    loaded in: contiguous bytes per thread), four bytes per step.

    e5m2 (KV_FP8 = 2): the byte is the top half of its fp16 (one byte permute per two values; exact, NaN
    and inf included). e4m3 (KV_FP8 = 1), BITS = 0: `cvt.rn.f16x2.e4m3x2` (exact); BITS = 1: the value
    times 2^-8 by byte permutes, a shift and masks (sign to fp16's sign, exponent and mantissa shifted in
    under fp16's exponent: bias 15 against 7, e4m3 subnormals land on fp16 subnormals; exact for every
    finite e4m3, but NaN (0x7f/0xff) reads as +-1.875, i.e. +-480 after the scale: fp8 caches written
    by rounding finite values (satfinite) hold no NaN). PINNED: the asm takes a second, unused operand
    so the compiler does not hoist the conversion to the dot's operand layout (Triton hoists through
    unary elementwise ops only), where a tile whose dot reduces across its rows (V in P.V) is read one
    byte per shared-memory load; unpinned, it may (fine for K, whose operand layout holds contiguous
    bytes). Interpreter: plain conversion of the same values."""
    if _INTERPRET_FP8:
        y = x.to(tl.float32)
        if KV_FP8 == 1 and BITS:
            y = y * 0.00390625
        return y.to(tl.float16)
    elif KV_FP8 == 2:
        return _f16_rows_asm(x, _E5M2_F16X4, PINNED)
    elif BITS:
        return _f16_rows_asm(x, _E4M3_F16X4_BITS, PINNED)
    else:
        return _f16_rows_asm(x, _E4M3_F16X4_CVT, PINNED)


# four fp8 bytes ($2) to four fp16 in two registers ($0: bytes 0-1, $1: bytes 2-3); see fp8_to_f16_rows
_E5M2_F16X4 = tl.constexpr("prmt.b32 $0, $2, 0, 0x1404; prmt.b32 $1, $2, 0, 0x3424;")
_E4M3_F16X4_CVT = tl.constexpr(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }"
)
_E4M3_F16X4_BITS = tl.constexpr(
    "{ .reg .b32 t, u;"
    " prmt.b32 t, $2, 0, 0x1404; shr.b32 u, t, 1; and.b32 u, u, 0x3f803f80; lop3.b32 $0, t, 0x80008000, u, 0xea;"
    " prmt.b32 t, $2, 0, 0x3424; shr.b32 u, t, 1; and.b32 u, u, 0x3f803f80; lop3.b32 $1, t, 0x80008000, u, 0xea; }"
)


@triton.jit
def _f16_rows_asm(x, ASM: tl.constexpr, PINNED: tl.constexpr):
    xu = x.to(tl.uint8, bitcast=True)
    if PINNED:  # a second operand (unused): not hoisted to the dot operand's layout
        return tl.inline_asm_elementwise(
            ASM, "=r,=r,r,r", [xu, tl.zeros_like(xu)], dtype=tl.float16, is_pure=False, pack=4
        )
    else:
        return tl.inline_asm_elementwise(ASM, "=r,=r,r", [xu], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def f16_rows_scale(KV_FP8: tl.constexpr, BITS: tl.constexpr):
    """The factor `fp8_to_f16_rows` puts on its values: 2^-8 for e4m3 by bits, else 1."""
    if KV_FP8 == 1 and BITS:
        return 0.00390625
    else:
        return 1.0


@triton.jit
def pow2_row_scale(amax):
    """Per row, `(2^s, 2^-s)` fp32 with `amax * 2^s` in [2^14, 2^15): rows scaled by 2^s convert exactly
    to fp16 (normal down to `amax * 2^-28`, representable down to `amax * 2^-38`) without overflow.
    s is 0 for a zero row and clamped to [-100, 100] (|amax| outside [2^-86, 2^114): still finite)."""
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 amax) for normal amax
    s = tl.minimum(tl.maximum(tl.where(amax > 0, 14 - e, 0), -100), 100)
    up = ((s + 127) << 23).to(tl.float32, bitcast=True)
    down = ((127 - s) << 23).to(tl.float32, bitcast=True)
    return up, down


@triton.jit
def to_fp8(y, KV_FP8: tl.constexpr):
    """fp32 `y` rounded to the nearest fp8 value (ties to even), as torch's `.to(float8)` does for
    values in range (the power-of-two scales keep them in range; compiled: saturating)."""
    if _INTERPRET_FP8:  # round in fp32 first (exact steps), so the conversion itself is exact
        if KV_FP8 == 1:
            M: tl.constexpr = 3
            EMIN: tl.constexpr = -6
            BIG: tl.constexpr = 448.0
        else:
            M: tl.constexpr = 2
            EMIN: tl.constexpr = -14
            BIG: tl.constexpr = 57344.0
        bits = y.to(tl.int32, bitcast=True)
        e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
        quantum = ((e - M + 127) << 23).to(tl.float32, bitcast=True)  # the fp8 spacing at |y|
        t = tl.abs(y) / quantum  # exact; t < 2^(M + 1)
        r = tl.minimum(((t + 8388608.0) - 8388608.0) * quantum, BIG)  # 2^23: fp32 addition rounds t to even
        y = (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)  # y's sign, -0 too
    if KV_FP8 == 1:
        r = y.to(tl.float8e4nv)
    else:
        r = y.to(tl.float8e5)
    return r


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


def bind_launches(launches: list[tuple], out: dict):
    """The `(kernel, grid, args, kwargs)` launches as one zero-argument call (each bound by
    `bind_launch`, no host sync between them) returning `out`."""
    calls = [bind_launch(*launch) for launch in launches]

    def run():
        for call in calls:
            call()
        return out

    return run


_LN2_F64 = tl.constexpr(0.6931471805599453)
_LOG2E_F64 = tl.constexpr(1.4426950408889634)


@triton.jit
def finish_o(b_acc, b_m, b_l, b_sink, HAS_SINKS: tl.constexpr, PRECISE: tl.constexpr):
    """The normalised output `[R, D]` fp32 of a softmax state (see `finish_lse`); 0 for empty rows."""
    if HAS_SINKS:
        b_top = tl.maximum(b_m, b_sink * 1.4426950408889634)  # log2 units; finite: the sink is
        b_kept = b_l * exp2_(b_m - b_top, PRECISE)
        b_total = b_kept + exp2_(b_sink * 1.4426950408889634 - b_top, PRECISE)
        b_scale = tl.where(b_l > 0, b_kept / (b_total * tl.where(b_l > 0, b_l, 1.0)), 0.0)
    else:
        b_scale = tl.where(b_l > 0, 1.0 / tl.where(b_l > 0, b_l, 1.0), 0.0)
    return b_acc * b_scale[:, None]


@triton.jit
def log_fp64(x):
    """Natural log of fp32 `x >= 1` (normal numbers), as fp64 accurate to ~1e-9.

    Exponent and mantissa from the bits, then Cephes' logf polynomial evaluated in fp64: native fp64
    arithmetic only. (`lg2.approx` is 2^-22 off; a libdevice fp64 log costs the prefill kernel
    registers it does not have.)
    """
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    f = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)  # [1, 2)
    big = f > 1.4142135
    f = tl.where(big, f * 0.5, f)
    e = tl.where(big, e + 1, e)
    z = f.to(tl.float64) - 1.0  # exact, in [sqrt(1/2) - 1, sqrt(2) - 1]
    p = 7.0376836292e-2 * z - 1.1514610310e-1
    p = p * z + 1.1676998740e-1
    p = p * z - 1.2420140846e-1
    p = p * z + 1.4249322787e-1
    p = p * z - 1.6668057665e-1
    p = p * z + 2.0000714765e-1
    p = p * z - 2.4999993993e-1
    p = p * z + 3.3333331174e-1
    w = z * z
    return z * w * p - 0.5 * w + z + e.to(tl.float64) * _LN2_F64


@triton.jit
def finish_lse(b_m, b_l, b_sink, HAS_SINKS: tl.constexpr, PRECISE: tl.constexpr):
    """The natural-log LSE `[R]` fp32 of a softmax state.

    `b_m [R]` is the running max in log2 units (scores times log2 e), `b_l [R]` the sum of
    `exp2(s - m)` (>= 1 for a row that saw a key: its max contributes 1), `b_sink [R]` natural-log
    sink logits. Sums, base change and log are done in fp64 and the LSE is rounded once: fp32
    `(m + log2 l) * ln 2` at |lse| ~ 8 adds half an ulp twice, and `lg2.approx` another 2^-22.
    No key and no sink: -inf; only a sink: the sink.
    """
    m = b_m.to(tl.float64) * _LN2_F64
    if HAS_SINKS:
        s = b_sink.to(tl.float64)
        top = tl.maximum(m, s)  # finite: the sink is
        w_keys = exp2_(((m - top) * _LOG2E_F64).to(tl.float32), PRECISE)
        total = b_l * w_keys + exp2_(((s - top) * _LOG2E_F64).to(tl.float32), PRECISE)  # >= 1: the top term
    else:
        top = m
        total = b_l
    seen = total > 0
    return tl.where(seen, top + log_fp64(tl.where(seen, total, 1.0)), float("-inf")).to(tl.float32)


def first_that_fits(config, shrink, build, device: torch.device):
    """`(run, config, shrunk)`: `build(config)` run once, the config shrunk while the device lacks the
    resources for it (shared memory: the configs are sized for Hopper's 227 KiB; an A100 has 163,
    an RTX 4090 99). `shrunk` lists the configs that did not fit. On the CPU nothing is run."""
    shrunk = []
    while True:
        run = build(config)
        if device.type != "cuda":
            return run, config, shrunk
        from triton.runtime.errors import OutOfResources

        try:
            run()
            return run, config, shrunk
        except OutOfResources:
            shrunk.append(repr(config))
            config = shrink(config)
            if config is None:
                raise
