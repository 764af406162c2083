"""Our CuTe DSL paged decode, host side (pure Python / PyTorch, CPU-testable): the launch constants,
`DecodeConfig` (the schedule knobs, frozen, passed through `prepare`), the split-KV plan (which keys
each CTA takes) and the per-CTA schedule. The kernels and their launch are in decode.py.
"""

import math
from dataclasses import dataclass

import torch

THREADS = 128
WARPS = THREADS // 32
MAX_HB = 8  # query heads per CTA (register budget: HB * VEC accumulators and HB * VEC q values a thread)
VEC = 8  # elements of a 128-bit load of bf16/fp16
HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class DecodeConfig:
    """Schedule knobs (plan and compile key), passed through `prepare`; variants are plugin backends."""

    vecs_per_lane: int = 2  # 128-bit loads a lane per K/V row (1 or 2; 8 heads a CTA always take 1)
    unroll: int | None = None  # keys a lane group loads per iteration (None: schedule decides)
    min_ctas: int = 0  # > 0: ask ptxas to fit that many CTAs an SM (caps registers)
    async_stages: int = 4  # cp.async stages a warp in shared memory (0: K/V loads straight into registers)
    pipeline: bool = True  # (without async_stages) next iteration's K/V rows into a second register buffer
    waves: int = 4  # the plan balances the keys over waves x SMs x ctas_per_sm CTAs
    ctas_per_sm: int = 4
    min_split: int = 512  # keys
    few_min_split: int = 256  # keys: the shortest split where the unsplit CTAs fill under half the SMs


DEFAULT = DecodeConfig()
LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)
NEG = -1.0e30  # a finite "minus infinity" for running maxima (no inf - inf anywhere)
LAZY = 8.0  # log2 units a score may exceed the running max before the accumulators are rescaled


# ---- pure-PyTorch / Python helpers (CPU-testable) ---------------------------------------------------
def heads_per_cta(group: int) -> int:
    """The largest divisor of the GQA group size that is at most MAX_HB."""
    return max(d for d in range(1, min(group, MAX_HB) + 1) if group % d == 0)


def visible_range(seq_len: int, window: int) -> tuple[int, int]:
    """Keys a decode query at position seq_len - 1 sees: [L - 1 - W, L) under window W, else [0, L)."""
    return (max(0, seq_len - 1 - window) if window >= 0 else 0, seq_len)


def plan_splits(
    lens: list[int], window: int, units: int, num_sms: int, config: DecodeConfig = DEFAULT
) -> list[tuple[int, int, int, int]]:
    """Work items `(request, start, end, final)`: each request's visible keys cut into equal splits.

    `units` CTAs run per split (kv heads x head blocks). Where the unsplit CTAs fill half the SMs or
    more, the split length balances the key tokens over waves x num_sms x ctas_per_sm CTAs and is at
    least `min_split` keys; with fewer, it balances them over one CTA an SM, at least `few_min_split`
    keys. Either is evened out over the longest request. `final` is 1 where a request has a single
    split (it writes o and lse itself).

    On an H200, Llama-3 8B heads (reports/examples/h200-session24, `cuted` and `b1`; us, this rule
    against 8 CTAs an SM and 256 keys everywhere): B64 L4096 322.8 / 353.1, B16 L4096 92.9 / 109.4,
    B16 L1024 26.8 / 34.0; at B1 (8 CTAs unsplit) L8192 26.4 in 16 splits against 31.2 in 32 and
    18.3 in 8 splits of 512 against 13.9 in 4 of 256 at L1024.
    """
    ranges = [visible_range(L, window) for L in lens]
    longest = max(e - s for s, e in ranges)
    total = sum(e - s for s, e in ranges) * units
    if 2 * len(ranges) * units < num_sms:  # few CTAs: about one an SM
        chunk = max(config.few_min_split, -(-total // max(1, num_sms)))
    else:
        chunk = max(config.min_split, -(-total // max(1, config.waves * num_sms * config.ctas_per_sm)))
    splits = max(1, round(longest / chunk))
    chunk = -(-longest // splits)
    items = []
    for b, (s, e) in enumerate(ranges):
        cuts = list(range(s, e, chunk))
        for a in cuts:
            items.append((b, a, min(e, a + chunk), int(len(cuts) == 1)))
    return items


def merge_list(items: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int]]:
    """`(request, first item, end item)` for every request with more than one split (items grouped)."""
    out, w = [], 0
    while w < len(items):
        b, e = items[w][0], w
        while e < len(items) and items[e][0] == b:
            e += 1
        if e - w > 1:
            out.append((b, w, e))
        w = e
    return out


def score_multipliers(sm_scale: float, soft_cap: float) -> tuple[float, float]:
    """(q multiplier, post multiplier): scores in log2 units are `post * tanh(q_mul q.k)` (soft cap)
    or `q_mul q.k` (post unused)."""
    if soft_cap > 0:
        return sm_scale / soft_cap, soft_cap * LOG2E
    return sm_scale * LOG2E, 1.0


def case_reason(case) -> str | None:
    """Why our CuTe decode cannot run `case` (None: it can)."""
    p = case.params
    if p.mla:
        return "our CuTe decode has no absorbed-MLA path (head dims 576/512, one latent cache)"
    if case.dtype not in ("bf16", "fp16"):
        return f"our CuTe decode runs bf16/fp16 (fp32 accumulation); not {case.dtype}"
    if getattr(p, "kv_dtype", "auto") != "auto":
        return f"our CuTe decode reads the KV cache in the query dtype; fp8 KV ({p.kv_dtype}) is not implemented"
    if p.dv != p.head_dim:
        return f"our CuTe decode needs head_dim_v == head_dim, got {p.head_dim}/{p.dv}"
    if p.head_dim not in HEAD_DIMS:
        return f"our CuTe decode supports head dims {HEAD_DIMS} (lanes split D by 32), got {p.head_dim}"
    return None


@dataclass
class DecodePlan:
    work: torch.Tensor  # [W, 4] int32
    merge: torch.Tensor | None  # [M, 3] int32
    part_o: torch.Tensor  # [W, Hq, D] fp32
    part_lse: torch.Tensor  # [W, Hq] fp32 (log2 units)
    splits: int  # the most splits of a request


def make_plan(x, num_sms: int, config: DecodeConfig = DEFAULT) -> DecodePlan:
    device = x.q.device
    _, Hq, D = x.q.shape
    Hkv = x.k_cache.shape[2]
    hb = heads_per_cta(Hq // Hkv)
    items = plan_splits(list(x.seq_lens_host), x.window, Hkv * (Hq // Hkv // hb), num_sms, config)
    merges = merge_list(items)
    W = len(items)
    work = torch.tensor(items, dtype=torch.int32).to(device)
    merge = torch.tensor(merges, dtype=torch.int32).to(device) if merges else None
    n = W if merges else 1
    part_o = torch.empty(n, Hq, D, dtype=torch.float32, device=device)
    part_lse = torch.empty(n, Hq, dtype=torch.float32, device=device)
    most = max(e - w for _, w, e in merges) if merges else 1
    return DecodePlan(work, merge, part_o, part_lse, most)


# ---- the kernels -----------------------------------------------------------------------------------
def schedule(HB: int, config: DecodeConfig = DEFAULT) -> tuple[int, int, bool, int]:
    """(VPL, U, PIPE, S) for HB q heads a CTA: 128-bit loads a lane per key row (VPL), keys a lane
    group takes an iteration (U), whether the next iteration's K/V rows go to a second register
    buffer (PIPE), cp.async stages in shared memory (S; 0: loads straight into registers).

    q and the accumulators take 2 * HB * 8 * VPL registers a thread, so 8 heads get VPL = 1.
    The config's vecs_per_lane, unroll, pipeline and async_stages set them.
    """
    vpl = config.vecs_per_lane if HB <= 4 else 1
    u = config.unroll or (2 if vpl == 2 or HB > 4 else 4)
    return vpl, u, config.pipeline and HB <= 4 and not config.async_stages, config.async_stages
