"""Extend's launch configuration and schedule (host side, no kernel): `ExtendConfig` (the tuning
knobs, frozen, passed through `prepare`), the candidates the tuner times, GQA head packing, query
tiles, key splits, and `plan_extend`, which builds the `ExtendPlan` (work list, grid, scratch) once per
case. The kernels and their launch are in extend.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import triton

from attnbench.kernels.triton.common import (
    arch,
    block_dv,
    dot_precision,
    head_split,
    kv_fp8_code,
    sm_count,
    v_is_k_prefix,
)
from attnbench.kernels.triton.decode import SPLITS, balanced_chunk
from attnbench.kernels.triton.limits import EXTEND_KNOBS

# ---- launch configuration and schedule ---------------------------------------------------------


@dataclass(frozen=True)
class ExtendConfig:
    """`block_m` query rows (tokens of one head, or tokens x packed heads) by `block_n` keys per step.

    Opt-in variants (off by default until a GPU sweep times them; NOTES.md, Extend):
    `use_tma`: key/value blocks of the contiguous new tokens, and whole-page blocks of the paged cache,
    by tensor descriptor (TMA on Hopper) instead of per-row pointers (`tma_sources`);
    `persistent`: one program per SM, each walking the work list (heaviest first) with a stride of
    the grid, instead of one program per (tile, head).
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False
    persistent: bool = False


def _head_dim_config(dk: int, dv: int, sm: int) -> ExtendConfig:
    s = head_split(dk)
    width = max(s.da + s.db, block_dv(dv))
    stages = 3 if sm >= 80 else 1
    if width <= 64:
        cfg = ExtendConfig(128, 64, 4, stages)
    elif width <= 128:
        cfg = ExtendConfig(128, 64, 8, stages)
    elif width <= 256:
        cfg = ExtendConfig(64, 64, 8, 2 if sm >= 80 else 1)
    else:  # MLA 576/512: a 64 x 512 fp32 accumulator
        cfg = ExtendConfig(64, 32, 8, 2 if sm >= 80 else 1)
    return cfg


def extend_config(dk: int, dv: int, max_q_len: int, sm: int, heads: int = 1) -> ExtendConfig:
    """Tiling by head dims (Hopper-first: 128 x 64 tiles, 8 warps, 3 stages for head dim 128); the
    tile shrinks to the longest request's rows (`heads` rows per token when GQA-packed), at least 16."""
    cfg = _head_dim_config(dk, dv, sm)
    block_m = max(16, min(cfg.block_m, triton.next_power_of_2(max_q_len * heads)))
    return ExtendConfig(block_m, cfg.block_n, cfg.num_warps if block_m >= 64 else 4, cfg.num_stages)


def extend_candidates(
    dk: int, dv: int, max_q_len: int, sm: int, *, use_tma: bool = False, persistent: bool = False
) -> list[ExtendConfig]:
    """Configs worth timing on the device for a long prefill (the heuristic's choice first); `use_tma`,
    `persistent`: every candidate with that variant (the `extend_tma`/`extend_persistent` knobs; the
    default tuning never times them)."""
    cands = _tilings(dk, dv, max_q_len, sm)
    return [replace(c, use_tma=use_tma, persistent=persistent) for c in cands]


def _tilings(dk: int, dv: int, max_q_len: int, sm: int) -> list[ExtendConfig]:
    first = extend_config(dk, dv, max_q_len, sm)
    s = head_split(dk)
    width = max(s.da + s.db, block_dv(dv))
    if width <= 128:  # on an H200 at S = 8192, D = 128: 256 x 64 with 16 warps 445 TFLOP/s, 128 x 64 424
        more = [ExtendConfig(256, 64, 16, 3), ExtendConfig(128, 128, 8, 3), ExtendConfig(64, 64, 4, 3)]
    elif width <= 256:
        more = [ExtendConfig(64, 32, 4, 3), ExtendConfig(128, 64, 8, 2)]
    else:
        more = [ExtendConfig(64, 16, 8, 3), ExtendConfig(32, 32, 4, 2)]
    tallest = triton.next_power_of_2(max_q_len)  # no query tile taller than the longest request
    return [first] + [c for c in more if c != first and c.block_m <= tallest]


def check_extend_knobs(knobs: dict) -> None:
    """ValueError naming the first knob that is not an extend knob or has a value it does not allow."""
    for name, value in knobs.items():
        if name not in EXTEND_KNOBS:
            raise ValueError(f"unknown extend knob {name!r}; extend knobs: {', '.join(EXTEND_KNOBS)}")
        if value not in EXTEND_KNOBS[name]:
            allowed = ", ".join(map(str, EXTEND_KNOBS[name]))
            raise ValueError(f"extend knob {name}={value!r} is not allowed; choose one of {allowed}")


def tiling_knobs(knobs: dict) -> bool:
    """Whether the knobs fix the tiling (then the tuner does not run: the knob's tiling is what is timed)."""
    return "extend_block_n" in knobs or "extend_stages" in knobs


def with_extend_knobs(c: ExtendConfig, knobs: dict) -> ExtendConfig:
    """`c` with the extend knobs applied (`check_extend_knobs` first): `extend_block_n`/`extend_stages`
    replace the key-block width / pipeline stages, `extend_tma`/`extend_persistent` switch the variants."""
    check_extend_knobs(knobs)
    if "extend_block_n" in knobs:
        c = replace(c, block_n=knobs["extend_block_n"])
    if "extend_stages" in knobs:
        c = replace(c, num_stages=knobs["extend_stages"])
    if "extend_tma" in knobs:
        c = replace(c, use_tma=bool(knobs["extend_tma"]))
    if "extend_persistent" in knobs:
        c = replace(c, persistent=bool(knobs["extend_persistent"]))
    return c


def shrink_extend_config(c: ExtendConfig) -> ExtendConfig | None:
    """A config needing less shared memory, or None: down to 2 stages, then narrower key blocks (to 32),
    then 1 stage, then shorter query tiles, then the narrowest key blocks."""
    if c.num_stages > 2:
        return replace(c, num_stages=c.num_stages - 1)
    if c.block_n > 32:
        return replace(c, block_n=c.block_n // 2)
    if c.num_stages > 1:
        return replace(c, num_stages=1)
    if c.block_m > 16:
        return replace(c, block_m=c.block_m // 2)
    if c.block_n > 16:
        return replace(c, block_n=c.block_n // 2)
    return None


def group_heads(G: int, block_m: int) -> int:
    """Query heads a GQA-packed tile holds per token: the whole group, or where the group is taller
    than the tile (MLA with 128 heads in 64 rows) its largest divisor that fits."""
    return max(d for d in range(1, min(G, block_m) + 1) if G % d == 0)


@dataclass(frozen=True)
class ExtendPolicy:
    """When the automatic extend plan packs GQA heads and when it takes the split-KV path (its split
    rule is decode's `SplitPolicy`). Each value and the measurement behind it (kernels/triton/NOTES.md):

    - `pack_max_rows` = 32: packed tiles taller than this lost to one-head tiles on an H200 (spec
      suite, D = 128, G = 4, against the unpacked split-KV kernel): <= 32 rows (<= 8 tokens) took
      0.29-0.92x the time, 64 rows 0.97-1.37x and 128 rows 0.92-1.39x (fewer, taller programs starve
      the grid at B = 16).
    - `split_min_keys` = 2048: the split path needs a request at least this long (and a grid under
      one wave).
    """

    pack_max_rows: int = 32
    split_min_keys: int = 2048


EXTEND_POLICY = ExtendPolicy()  # the default


def gqa_packs(x, deterministic: bool = False) -> bool:
    """Whether extend packs the query heads of a kv group into a tile's rows (the automatic rule).

    Yes when G > 1 and the requests are so short that a packed tile (next power of two of the longest
    q_len x the heads it packs) has at most `pack_max_rows` rows, or one token where a kv group alone
    is taller (MLA with 128 heads: 64 heads per tile): one-head tiles would be mostly empty rows of
    the MMA and read K/V once per query head; packed, K/V are read once per group. Longer requests
    keep one-head tiles. Never for `triton-det`: whether a batch packs follows its longest request,
    and packing changes a row's tile (its MMA shape, its tile's key range), so a request's bits would
    follow its batch.
    """
    Hq, Hkv = x.q.shape[1], x.k_cache.shape[2]
    base = _head_dim_config(x.q.shape[2], x.v_cache.shape[-1], arch(x.q.device))
    heads = group_heads(Hq // Hkv, base.block_m)
    rows = triton.next_power_of_2(max(x.q_lens_host) * heads)
    return not deterministic and heads > 1 and rows <= max(EXTEND_POLICY.pack_max_rows, heads)


def default_extend_config(x, deterministic: bool = False, pack: bool | None = None) -> ExtendConfig:
    """`extend_config` for the shapes of `x` and its GQA packing (`pack`; None: `gqa_packs`)."""
    Dk, Dv = x.q.shape[2], x.v_cache.shape[-1]
    G = x.q.shape[1] // x.k_cache.shape[2]
    sm = arch(x.q.device)
    if pack is None:
        pack = gqa_packs(x, deterministic)
    heads = group_heads(G, _head_dim_config(Dk, Dv, sm).block_m) if pack else 1
    return extend_config(Dk, Dv, max(x.q_lens_host), sm, heads)


@dataclass
class ExtendPlan:
    """Everything the timed call needs, built once.

    A tile is `block_m // heads` tokens of one request by `heads` query heads of one kv group
    (`meta["HEADS"]`; 1: unpacked, tokens of one head); a launch runs `Hq // heads` programs per tile.
    Unsplit: `tiles` [N, 2] int32 (request, first query; heaviest tiles first), one launch.
    Split: `tiles` [W, 8] int32 work items (request, first query, first key, end key, first partial,
    splits of the tile, 1 = final, split index), then a merge launch over `merge` [M, 3] int32
    (token row, first partial, end partial) when some tile has several splits.
    """

    tiles: torch.Tensor
    grid: tuple[int]
    meta: dict
    config: ExtendConfig
    splits: int = 1  # the most key splits of any tile (1: the unsplit kernel)
    merge: torch.Tensor | None = None
    rows: torch.Tensor | None = None  # [T] int32 identity: the merge's "qo_indptr" (a merge row is a token)
    part_o: torch.Tensor | None = None  # [P, Hq, Dv] fp32 partial outputs (normalised)
    part_ml: torch.Tensor | None = None  # [P, 2, Hq] fp32 per partial: max (log2 units), sum of exp2
    merge_grid: tuple[int, int] = (0, 0)
    merge_meta: dict | None = None
    # kernel arguments only the opt-in variants pass (tensor descriptors, the persistent grid's item
    # count): empty by default, so the default launch is the one without the variants
    extra: dict = field(default_factory=dict)


def _tile_ranges(
    lens: list[int], q_lens: list[int], tokens: int, causal: bool, window: int
) -> list[tuple[int, int, int, int]]:
    """(request, first query, first key, end key) of every tile of `tokens` queries: the keys some
    row of the tile may see; ordered by keys visited, most first (the kernel computes the same range)."""
    tiles = []
    for b, (L, n) in enumerate(zip(lens, q_lens, strict=True)):
        for m0 in range(0, n, tokens):
            last = L - n + min(m0 + tokens, n) - 1
            hi = last + 1 if causal else L
            lo = max(0, L - n + m0 - window) if window >= 0 else 0
            tiles.append((hi - lo, b, m0, lo, hi))
    tiles.sort(key=lambda t: -t[0])
    return [(b, m0, lo, hi) for _, b, m0, lo, hi in tiles]


def query_tiles(lens: list[int], q_lens: list[int], tokens: int, causal: bool, window: int) -> list[tuple[int, int]]:
    """(request, first query) of every tile of `tokens` queries, ordered by keys visited, most first."""
    return [(b, m0) for b, m0, _, _ in _tile_ranges(lens, q_lens, tokens, causal, window)]


def split_chunk(x, cfg: ExtendConfig, heads: int, ranges: list[tuple[int, int, int, int]], splits: int | None,
                num_sms: int) -> int | None:  # fmt: skip
    """Keys per split for the split path, or None for the unsplit kernel.

    `splits=None` (automatic): split only when the unsplit grid (Hq / heads programs x tiles) would fill less
    than one wave of `num_sms` programs and the longest request has at least `split_min_keys` keys
    (`ExtendPolicy`); the chunk then balances the tiles' keys over `waves` x num_sms programs like
    decode's planner, with at least `min_split` keys (`SplitPolicy`) and at least as many keys as the
    partials a split writes weigh (fp32 rows of
    Hq x Dv per query row, against the split's K/V bytes). `splits=1`: never; `splits=n >= 2`: always
    (tests), the longest tile cut into n equal chunks (not aligned to blocks: edges anywhere work).
    """
    _, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    sizes = [hi - lo for _, _, lo, hi in ranges]
    if not sizes:
        return None
    if splits is not None:
        if splits <= 1:
            return None
        return max(1, -(-max(sizes) // splits))
    if Hq // heads * len(ranges) >= num_sms or max(x.seq_lens_host) < EXTEND_POLICY.split_min_keys:
        return None
    rows = min(cfg.block_m // heads, max(x.q_lens_host))  # tokens of a tile
    v_bytes = 0 if v_is_k_prefix(x.k_cache, x.v_cache) else Dv  # absorbed MLA reads V from K
    kv_bytes_per_key = Hkv * (Dk + v_bytes) * x.k_cache.element_size()
    partial_keys = -(-rows * Hq * Dv * 8 // kv_bytes_per_key)
    min_chunk = max(SPLITS.min_split, 2 * cfg.block_n, partial_keys)
    return balanced_chunk(sizes, Hq // heads, cfg.block_n, SPLITS.waves * num_sms, min_chunk)


def _rows_view(t: torch.Tensor, width: int) -> torch.Tensor | str:
    """`t` (`[T, H, D]` new tokens or a `[P, page, H, D]` cache) as `[rows, H * D]` rows for a tensor
    descriptor whose box is `width` columns of one head, or why it cannot be."""
    *lead, H, D = t.shape
    if D != width:
        return f"head dim {D} is not one power-of-two box (the kernel loads {width} columns)"
    if t.stride(-1) != 1 or t.stride(-2) != D:
        return "heads are not contiguous [H, D] rows"
    if len(lead) == 2 and t.stride(0) != lead[1] * t.stride(1):
        return "cache pages are not contiguous runs of slots"
    row_stride = t.stride(len(lead) - 1)
    if t.data_ptr() % 16 or (row_stride * t.element_size()) % 16 or D * t.element_size() < 16:
        return "rows not 16-byte aligned (or narrower than 16 bytes)"
    rows = 1
    for n in lead:
        rows *= n
    return t.as_strided((rows, H * D), (row_stride, 1))


def tma_sources(x, cfg: ExtendConfig, meta: dict) -> tuple[dict, list[str]]:
    """The tensor descriptors of `cfg.use_tma` (kernel keyword arguments: `k_new_desc`/`v_new_desc` for the
    packed new tokens, `k_cache_desc`/`v_cache_desc` for whole-page cache blocks; a source left out is
    read by pointers) and why each source left out could not be.

    Every block of a source it covers, the masked ones too: a box crossing the request's end reads the
    next request's rows (or zeros past the tensor's end); cache blocks are aligned to `block_n` inside
    one page (page size a multiple of `block_n`), so a box may hold keys before the range and slots
    past the sequence (NaN in a poisoned pool). The kernel masks those rows' scores and zeroes their
    values in registers.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not cfg.use_tma:
        return {}, []
    dk, da, db, dv, bdv = meta["DK"], meta["DA"], meta["DB"], meta["DV"], meta["BLOCK_DV"]
    v_from_k = meta["V_FROM_K"]
    bn = cfg.block_n

    def descs(k, v, names):
        if db or da != dk:
            return None, f"head dim {dk} is {da} + {db} columns (one power-of-two box only)"
        if not v_from_k and bdv != dv:
            return None, f"value head dim {dv} is not a power of two"
        k_rows = _rows_view(k, da)
        v_rows = None if v_from_k else _rows_view(v, bdv)
        for why in (k_rows, v_rows):
            if isinstance(why, str):
                return None, why
        out = {names[0]: TensorDescriptor(k_rows, list(k_rows.shape), [k_rows.stride(0), 1], [bn, da])}
        if not v_from_k:
            out[names[1]] = TensorDescriptor(v_rows, list(v_rows.shape), [v_rows.stride(0), 1], [bn, bdv])
        return out, None

    found, why_not = {}, []
    if x.k_new is not None:
        d, why = descs(x.k_new, x.v_new, ("k_new_desc", "v_new_desc"))
        found |= d or {}
        why_not += [f"new tokens: {why}"] if why else []
    if x.k_cache.shape[1] % bn:
        why_not.append(f"cache: page size {x.k_cache.shape[1]} is not a multiple of block_n {bn}")
    else:
        d, why = descs(x.k_cache, x.v_cache, ("k_cache_desc", "v_cache_desc"))
        found |= d or {}
        why_not += [f"cache: {why}"] if why else []
    return found, why_not


class TMAUnavailable(ValueError):
    """`use_tma` asked for, and no key source of the case can be read by tensor descriptor."""


def plan_extend(
    x, *, config: ExtendConfig | None = None, splits: int | None = None, pack: bool | None = None,
    deterministic: bool = False, num_sms: int | None = None, **knobs,
) -> ExtendPlan:  # fmt: skip
    """Tile schedule and launch parameters for `extend(x, plan)` (host work only, no device sync).

    Args:
        x: `AttentionInputs` of an extend (or tree_verify) case.
        config: tiling (default: `default_extend_config`).
        splits: None: split the key range only in the starved regime (see `split_chunk`); 1: never;
            n >= 2: always, about n splits for the longest tile (forces the split path, for tests).
        pack: None: GQA-pack the tiles by `gqa_packs`; True/False: always/never (tests). A packed
            tile holds `group_heads(G, block_m)` heads per token (split path too).
        deterministic: `triton-det` stays on the unsplit, unpacked path (whether a batch is split or
            packed depends on the whole batch, so its requests' bits would too).
        num_sms: SMs to plan for (default: the device's; also the persistent grid's size).
        knobs: extend knobs (`EXTEND_KNOBS`, ints as on the command line) applied over `config`.
    Raises:
        TMAUnavailable: the config asks for TMA and neither source can take it.
    """
    device = x.q.device
    T, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    G = Hq // Hkv
    if pack is None:
        pack = gqa_packs(x, deterministic)
    cfg = with_extend_knobs(config or default_extend_config(x, pack=pack), knobs)
    heads = group_heads(G, cfg.block_m) if pack else 1
    split = head_split(Dk)
    has_mask = x.custom_mask is not None
    causal = x.causal and not has_mask
    ranges = _tile_ranges(list(x.seq_lens_host), list(x.q_lens_host), cfg.block_m // heads, causal, x.window)
    chunk = None if deterministic else split_chunk(x, cfg, heads, ranges, splits, num_sms or sm_count(device))
    if x.k_new is None:
        v_from_k = v_is_k_prefix(x.k_cache, x.v_cache)
    else:
        v_from_k = v_is_k_prefix(x.k_cache, x.v_cache) and v_is_k_prefix(x.k_new, x.v_new)
    meta = dict(
        HQ=Hq, G=G, HEADS=heads, DK=Dk, DV=Dv, DA=split.da, DB=split.db, BLOCK_DV=block_dv(Dv),
        PAGE_SIZE=x.k_cache.shape[1], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=causal, HAS_WINDOW=x.window >= 0, HAS_MASK=has_mask,
        HAS_SOFTCAP=x.soft_cap > 0, HAS_SINKS=x.sinks is not None,
        NEW_FROM_CACHE=x.k_new is None, SAVE_KV=bool(x.save_kv), V_FROM_K=v_from_k and Dv == split.da,
        DOT_PRECISION=dot_precision(x.q.dtype), PRECISE_EXP=x.q.dtype == torch.float32,
        SPLIT=chunk is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if kv_fp8_code(x.k_cache.dtype):  # absent otherwise: the bf16/fp16/fp32 kernels compile as before
        meta["KV_FP8"] = kv_fp8_code(x.k_cache.dtype)
    descs, why_not = tma_sources(x, cfg, meta)
    if cfg.use_tma and not descs:
        raise TMAUnavailable("extend_tma: no key source can be read by tensor descriptor (" + "; ".join(why_not) + ")")
    if descs:  # absent otherwise (as KV_FP8): the default kernels compile as before
        meta["TMA_NEW"] = int("k_new_desc" in descs)
        meta["TMA_CACHE"] = int("k_cache_desc" in descs)
    if chunk is None:
        tiles_t = torch.tensor([(b, m0) for b, m0, _, _ in ranges], dtype=torch.int32).reshape(-1, 2).to(device)
        plan = ExtendPlan(tiles_t, (Hq // heads * len(ranges),), meta, cfg)
    else:
        plan = _split_plan(x, cfg, meta, ranges, chunk)
    plan.extra = dict(descs)
    if cfg.persistent:  # one program per SM (at most one per work item) walks the items heaviest first
        n_items = plan.grid[0]
        plan.grid = (max(1, min(n_items, num_sms or sm_count(device))),)
        plan.extra["n_items"] = n_items
        meta["PERSISTENT"] = 1
    return plan


def _split_plan(x, cfg: ExtendConfig, meta: dict, ranges: list, chunk: int) -> ExtendPlan:
    """The split path: every tile's key range cut into `chunk`-key splits (starts at multiples of
    `chunk` past the range's start); a tile with one split writes its output itself, the others
    write partials that one merge launch combines (and adds the sink to)."""
    device = x.q.device
    T, Hq, _ = x.q.shape
    Dv = x.v_cache.shape[-1]
    heads = meta["HEADS"]
    starts = [0]
    for n in x.q_lens_host:
        starts.append(starts[-1] + n)
    items, merge, n_part, most = [], [], 0, 1
    for b, m0, lo, hi in ranges:
        k = max(1, -(-(hi - lo) // chunk))
        most = max(most, k)
        rows = min(cfg.block_m // heads, x.q_lens_host[b] - m0)  # tokens of the tile
        for s in range(k):
            a, e = lo + s * chunk, min(hi, lo + (s + 1) * chunk)
            items.append((b, m0, a, e, n_part + s, k, int(k == 1), s))
        if k > 1:
            merge += [(starts[b] + m0 + m, n_part + m * k, n_part + (m + 1) * k) for m in range(rows)]
            n_part += rows * k
    tiles_t = torch.tensor(items, dtype=torch.int32).to(device)
    n_alloc = max(1, n_part)
    part_o = torch.empty(n_alloc, Hq, Dv, dtype=torch.float32, device=device)
    part_ml = torch.empty(n_alloc, 2, Hq, dtype=torch.float32, device=device)
    bdv = block_dv(Dv)
    merge_meta = dict(  # decode's merge, told that a split may have seen no key
        DV=Dv, BLOCK_DV=bdv, BLOCK_S=16, HAS_SINKS=x.sinks is not None, PRECISE_EXP=x.q.dtype == torch.float32,
        HAS_EMPTY=True, num_warps=4 if bdv >= 256 else 2,
    )  # fmt: skip
    return ExtendPlan(
        tiles_t, (Hq // heads * len(items),), meta, cfg, splits=most,
        merge=torch.tensor(merge, dtype=torch.int32).to(device) if merge else None,
        rows=torch.arange(T, dtype=torch.int32, device=device),
        part_o=part_o, part_ml=part_ml, merge_grid=(len(merge), Hq), merge_meta=merge_meta,
    )  # fmt: skip
