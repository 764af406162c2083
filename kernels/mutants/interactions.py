"""Broken kernels whose bugs live where two features meet, or at a numerical edge.

Each is modelled on a class of bug fixed in a serving library (SGLang, vLLM, FlashInfer, FLA): a soft
cap applied after the mask, a window that forgets the cached prefix, sinks dropped on rows with no
visible key, fp8 scales swapped or collapsed, a last page of length 0, a page-table walk one page too
far, a split-KV merge with a stale LSE, accumulation in bf16, GQA mapped wrong for one group size,
softplus without its threshold, dt_bias of head 0 for every head, conv states not saved for short
requests, padding rows written into slot -1 (by the GDN decode and by the conv update). One comes
from the draft-decode contract rather than a known fix: EAGLE candidates that all read their
request's first candidate's pages. Six more were written independently of the suites, as a test of
them, and each escaped until the pairwise domains reached past a kernel's tile or split size: a non-power-of-two GQA group strided as its padded tile, a
full 64-row causal query tile, sinks and a split's tail on the split-KV path, GDN q/k norms per 64-wide
slice of K, conv bias per channel tile. None has a case written for it: `attnbench selftest` runs them over the default suites and reports the first case
that caught each.

Attention mutants run `attend`, a plain per-request float32 implementation with one switch per bug
(`Bugs`); the GDN ones wrap the torch backend's functions.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from attnbench.backend import Backend
from attnbench.kernels.torch import gdn as tgdn
from attnbench.kernels.torch.attention import save_new_kv

SPLIT = 256  # keys per split of the split-KV path of the mutants that have one


@dataclasses.dataclass(frozen=True)
class Bugs:
    cap_after_mask: bool = False  # soft cap applied to masked (-inf) scores: they become -cap, visible
    window_skips_prefix: bool = False  # extend: the window is applied to the new keys only
    sink_skipped_on_empty_rows: bool = False  # a row with no visible key returns lse -inf (sink ignored)
    unstabilised: bool = False  # exp(s) without subtracting the row max
    base2_lse_split: bool = False  # the split-KV path (> SPLIT keys) returns a base-2 LSE
    gqa_mod_for_group4: bool = False  # q head h reads kv head h % Hkv when the group size is 4
    last_page_empty: bool = False  # last page length = L % page_size (0 for a full last page)
    page_past_end: bool = False  # a full last page is read from the next page-table entry (another request's)
    stale_split_lse: bool = False  # split-KV: the merged LSE is the first split's
    bf16_accumulate: bool = False  # P.V accumulated in the case dtype, 16 keys at a time
    sink_per_kv_head: bool = False  # sinks indexed by kv head instead of q head
    swapped_scales: bool = False  # K dequantised with v_scale, V with k_scale
    scale_head0: bool = False  # per-head fp8 scales collapsed to head 0's
    scales_ignored: bool = False  # fp8 cache entries read as stored, without k_scale/v_scale (1.0 passed)
    causal_top_left: bool = False  # causal mask j <= i (top-left) instead of bottom-right
    window_dropped_unless_causal: bool = False  # bidirectional and custom masks ignore the window
    mla_rope_dropped: bool = False  # MLA scores from the 512 latent dims only
    sink_every_split: bool = False  # split-KV: every split's partial state carries the sink term
    sink_dropped_on_extend: bool = False  # requests with more than one query (the prefill path) ignore the sinks
    prefix_fp8_unscaled: bool = False  # extend: the cached prefix of an fp8 cache is read without its scales
    window_tile_granular: bool = False  # extend: the window only skips whole 16-key tiles before its start
    empty_lse_plus_inf: bool = False  # a row with no visible key (and no sink) reports LSE +inf
    uniform_q_offset: bool = False  # request b's query/output rows taken at b * (request 0's query count)
    swa_pool_untranslated: bool = False  # SWA pool indexed with the full pool's page ids (full_to_swa skipped)
    draft_rows_by_request: bool = False  # draft decode: every candidate row walks candidate 0's page table
    gqa_pow2_stride: bool = False  # a kv group's q heads read at kv * next_pow2(G) + r (padded-tile stride)
    causal_tile_diagonal: bool = False  # extend: the last row of each full 64-row query tile misses its own key
    sink_split_o_unscaled: bool = False  # split-KV: the sink enters the merged LSE but not the output's denominator
    split_tail_dropped: bool = False  # split-KV: the last split holds L % SPLIT keys (none when L is a multiple)
    offset_bits: int = 0  # a cache slot's element offset (slot x H x D) wraps in a signed int of this width (0: none)


def wrapped_rows(slots: torch.Tensor, row_elems: int, rows: int, bits: int) -> torch.Tensor:
    """The rows a kernel addresses when it computes `slot * row_elems` (element offsets into a pool of
    `rows` rows) in a signed integer of `bits` bits: the offset wraps past 2^(bits-1) (int32: past 2^31
    elements, SGLang #20389, vLLM #47671). Where the real kernel would then read or write before the
    buffer (garbage or an illegal address), this reads the pool at the wrapped offset modulo its size;
    offsets that fit are unchanged. `slots` int64; returns int64 rows."""
    off = slots * row_elems
    half = 1 << (bits - 1)
    wrapped = (off + half) % (2 * half) - half
    return torch.remainder(wrapped, rows * row_elems) // row_elems


def _keys(x, b: int, bugs: Bugs):
    """float32 K `[L, Hkv, Dk]`, V `[L, Hkv, Dv]` of request b, as the (buggy) page walk reads them."""
    L, n, ps = x.seq_lens_host[b], x.q_lens_host[b], x.page_size
    row = b - b % x.draft_topk if bugs.draft_rows_by_request else b  # the request's first candidate
    lo, hi = int(x.kv_indptr[row]), int(x.kv_indptr[row + 1])
    entries = x.kv_page_indices.long()
    if bugs.swa_pool_untranslated and x.full_page_indices is not None:
        entries = x.full_page_indices.long()
    pos = torch.arange(L, device=x.q.device)
    if bugs.last_page_empty and L % ps == 0:
        pos = pos[: L - ps]  # the last page counted as holding L % ps = 0 tokens
    page = lo + pos // ps
    if bugs.page_past_end and L % ps == 0 and hi < entries.numel():
        page = torch.where(page == hi - 1, page + 1, page)  # a full last page read from the entry after it
    slots = entries[page] * ps + pos % ps
    k_rows = v_rows = slots
    if bugs.offset_bits:
        k_rows = wrapped_rows(slots, x.k_cache[0, 0].numel(), x.k_cache.shape[0] * ps, bugs.offset_bits)
        v_rows = wrapped_rows(slots, x.v_cache[0, 0].numel(), x.v_cache.shape[0] * ps, bugs.offset_bits)
    k_scale, v_scale = x.k_scale, x.v_scale
    if bugs.swapped_scales:
        k_scale, v_scale = v_scale, k_scale
    if bugs.scale_head0 and k_scale is not None:
        k_scale, v_scale = k_scale[:1], v_scale[:1]
    if bugs.scales_ignored:
        k_scale = v_scale = None
    K = x.k_cache.view(-1, *x.k_cache.shape[2:])[k_rows].float()
    V = x.v_cache.reshape(-1, *x.v_cache.shape[2:])[v_rows].float()
    if k_scale is not None:
        raw_k, raw_v = K, V
        K, V = K * k_scale.view(-1, 1), V * v_scale.view(-1, 1)
        if bugs.prefix_fp8_unscaled and n > 1:
            K = torch.cat([raw_k[: L - n], K[L - n :]])  # the paged prefix pass got no scales
            V = torch.cat([raw_v[: L - n], V[L - n :]])
    if x.k_new is not None and not x.save_kv:
        start = int(x.qo_indptr[b])
        K[L - n : L] = x.k_new[start : start + n].float()
        V[L - n : L] = x.v_new[start : start + n].float()
    return K, V


def _wrapped_slots(x, bits: int):
    """`x` with its new tokens' slots where a `bits`-bit offset computation sends them (K and V alike:
    the mutant's caches have the same row size, MLA's V is K's latent)."""
    rows = x.k_cache.shape[0] * x.page_size
    return dataclasses.replace(x, slot_mapping=wrapped_rows(x.slot_mapping, x.k_cache[0, 0].numel(), rows, bits))


def attend(x, bugs: Bugs) -> dict[str, torch.Tensor]:
    """Decode/extend attention, one request at a time, float32, with the bugs switched on."""
    if x.save_kv:
        save_new_kv(_wrapped_slots(x, bugs.offset_bits) if bugs.offset_bits else x)
    Hq, Hkv = x.q.shape[1], x.k_cache.shape[2]
    G = Hq // Hkv
    h = torch.arange(Hq, device=x.q.device)
    kv_of = (h % Hkv) if (bugs.gqa_mod_for_group4 and G == 4) else h // G
    for b in range(len(x.seq_lens_host)):
        L, n = x.seq_lens_host[b], x.q_lens_host[b]
        K, V = _keys(x, b, bugs)
        Lr = K.shape[0]
        r0 = int(x.qo_indptr[b])
        if bugs.uniform_q_offset:
            r0 = min(b * x.q_lens_host[0], x.q.shape[0] - n)  # as if every request had request 0's count
        q = x.q[r0 : r0 + n].float()  # [n, Hq, Dk]
        if bugs.gqa_pow2_stride and G & (G - 1):
            Gp = 1 << (G - 1).bit_length()
            q = q[:, ((h // G) * Gp + h % G) % Hq]  # rows of a tile padded to Gp heads, strided by Gp
        k = K[:, kv_of]  # [Lr, Hq, Dk]
        if bugs.mla_rope_dropped and q.shape[-1] == 576:
            q, k = q[..., :512], k[..., :512]
        i = torch.arange(n, device=q.device)[:, None]
        j = torch.arange(Lr, device=q.device)[None, :]
        pos = L - n + i
        vis = j < L
        if x.custom_mask is not None:
            m0 = int(x.mask_indptr[b])
            cm = x.custom_mask[m0 : m0 + n * L].view(n, L)
            vis = torch.zeros(n, Lr, dtype=torch.bool, device=q.device)
            vis[:, : min(L, Lr)] = cm[:, : min(L, Lr)]
        elif x.causal:
            vis = vis & (j <= (i if bugs.causal_top_left else pos))
            if bugs.causal_tile_diagonal:
                last_rows = (i % 64 == 63) & (i < n - n % 64)  # the last row of each full 64-row tile
                vis = vis & ~(last_rows & (j == pos))  # its loop over keys stops one short
        if bugs.split_tail_dropped and Lr > SPLIT and L % SPLIT == 0:
            vis = vis & (j < L - SPLIT)
        if x.window >= 0 and not (bugs.window_dropped_unless_causal and (x.custom_mask is not None or not x.causal)):
            start = pos - x.window
            if bugs.window_tile_granular and n > 1:
                start = torch.div(start, 16, rounding_mode="floor") * 16  # a partial first tile stays visible
            inside = j >= start
            if bugs.window_skips_prefix and n > 1:
                inside = inside | (j < L - n)
            vis = vis & inside
        s = torch.einsum("nhd,lhd->hnl", q, k) * x.sm_scale
        if x.soft_cap > 0 and not bugs.cap_after_mask:
            s = torch.tanh(s / x.soft_cap) * x.soft_cap
        s = s.masked_fill(~vis[None], -math.inf)
        if x.soft_cap > 0 and bugs.cap_after_mask:
            s = torch.tanh(s / x.soft_cap) * x.soft_cap
        sinks = None
        if x.sinks is not None and not (bugs.sink_dropped_on_extend and n > 1):
            sinks = x.sinks.float()[(h // G) * G if bugs.sink_per_kv_head else h][:, None]  # [Hq, 1]
        o, lse = _softmax_v(s, V[:, kv_of], sinks, bugs, x.o.dtype)
        x.o[r0 : r0 + n] = o.to(x.o.dtype)
        x.lse[r0 : r0 + n] = lse
    return {"o": x.o, "lse": x.lse}


def _softmax_v(s, V, sinks, bugs: Bugs, dtype):
    """s `[Hq, n, L]`, V `[L, Hq, Dv]` -> o `[n, Hq, Dv]`, lse `[n, Hq]` (natural log)."""
    m = s.amax(-1)
    if sinks is not None:
        m = torch.maximum(m, sinks)
    m = torch.nan_to_num(m, neginf=0.0)
    if bugs.unstabilised:
        m = torch.zeros_like(m)
    p = torch.exp(s - m[..., None])
    l = l_keys = p.sum(-1)  # l_keys: the keys' share alone, without the sink
    empty = l == 0
    if sinks is not None:
        splits = -(-s.shape[-1] // SPLIT) if bugs.sink_every_split else 1
        l = l + splits * torch.exp(sinks - m)
    pv = p.to(dtype).float()
    Vh = V.permute(1, 0, 2)  # [Hq, L, Dv]
    if bugs.bf16_accumulate and dtype != torch.float32:
        acc = torch.zeros(*pv.shape[:2], Vh.shape[-1], dtype=dtype, device=s.device)
        for k0 in range(0, pv.shape[-1], 16):
            acc = (acc.float() + pv[..., k0 : k0 + 16] @ Vh[:, k0 : k0 + 16]).to(dtype)
        o = acc.float()
    else:
        o = pv @ Vh
    denom = l_keys if bugs.sink_split_o_unscaled and s.shape[-1] > SPLIT else l
    o = o / torch.where(denom > 0, denom, torch.ones_like(denom))[..., None]
    lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, -math.inf))
    if bugs.empty_lse_plus_inf:
        lse = torch.where(l > 0, lse, torch.full_like(lse, math.inf))
    if bugs.sink_skipped_on_empty_rows and sinks is not None:
        lse = torch.where(empty, torch.full_like(lse, -math.inf), lse)
    L = s.shape[-1]
    if L > SPLIT and bugs.base2_lse_split:
        lse = lse / math.log(2)
    if L > SPLIT and bugs.stale_split_lse:
        first = s[..., :SPLIT]
        m1 = torch.nan_to_num(first.amax(-1), neginf=0.0)
        l1 = torch.exp(first - m1[..., None]).sum(-1)
        lse = torch.where(l1 > 0, m1 + torch.log(l1), lse)
    return o.permute(1, 0, 2), lse.permute(1, 0)


def attention_mutant(name: str, bugs: Bugs) -> Backend:
    def prepare(self, case, x):
        return lambda: attend(x, bugs)

    return type(f"Mutant_{name}", (Backend,), {
        "name": name, "prepare_decode": prepare, "prepare_extend": prepare, "prepare_tree_verify": prepare,
    })()  # fmt: skip


# ---- GDN and merge mutants ------------------------------------------------------------------------
def _gates_head0_dt_bias(A_log, a, dt_bias, b):
    return right_gates(A_log, a, dt_bias[:1].expand_as(dt_bias), b)


def _gates_no_threshold(A_log, a, dt_bias, b):
    x = a.float() + dt_bias.float()
    return -torch.exp(A_log.float()) * torch.log(1 + torch.exp(x)), torch.sigmoid(b.float())


def _gates_threshold_2(A_log, a, dt_bias, b):
    sp = F.softplus(a.float() + dt_bias.float(), beta=1.0, threshold=2.0)
    return -torch.exp(A_log.float()) * sp, torch.sigmoid(b.float())


right_gates = tgdn._gates  # the original gates: replacements call it, not themselves


def patched_gdn(name: str, attr: str, replacement, ops: tuple[str, ...]) -> Backend:
    """The torch GDN backend with its function `attr` replaced while the closure of each op in `ops` runs."""

    def prepare_for(fn):
        def prepare(self, case, x):
            def run():
                old = getattr(tgdn, attr)
                setattr(tgdn, attr, replacement)
                try:
                    return fn(x)
                finally:
                    setattr(tgdn, attr, old)

            return run

        return prepare

    methods = {f"prepare_{op}": prepare_for(getattr(tgdn, op)) for op in ops}
    return type(f"Mutant_{name}", (Backend,), {"name": name, **methods})()


def state_offset_mutant(name: str, bits: int) -> Backend:
    """The torch GDN backend computing a state slot's element offset (`slot x HV x K x V`) in a signed
    integer of `bits` bits: gdn_decode, gdn_extend and gdn_verify read (and the first two write) the
    slot that `wrapped_rows` sends each real request to; padding rows (-1) stay padding."""

    def wrapped(x):
        idx = x.state_indices.long()
        rows = wrapped_rows(idx.clamp(min=0), x.state_pool[0].numel(), x.state_pool.shape[0], bits)
        return dataclasses.replace(x, state_indices=torch.where(idx >= 0, rows, idx).to(x.state_indices.dtype))

    def prepare_for(fn):
        def prepare(self, case, x):
            return lambda: fn(wrapped(x))

        return prepare

    ops = ("gdn_decode", "gdn_extend", "gdn_verify")
    methods = {f"prepare_{op}": prepare_for(getattr(tgdn, op)) for op in ops}
    return type(f"Mutant_{name}", (Backend,), {"name": name, **methods})()


class _ConvShortNotSaved(Backend):
    """causal_conv1d that does not write back the state of requests shorter than the width - 1."""

    name = "conv-state-short-not-saved"

    def prepare_causal_conv1d(self, case, x):
        def run():
            before = x.conv_states.clone()
            out = tgdn.causal_conv1d(x)
            qsl = x.query_start_loc.tolist()
            W = x.weight.shape[1]
            for b, slot in enumerate(x.cache_indices.tolist()):
                if qsl[b + 1] - qsl[b] < W - 1:
                    x.conv_states[slot] = before[slot]
            return out

        return run


class _PaddedSlotWritten(Backend):
    """gdn_decode that stores the state of padding rows too: index -1 lands in the pool's last slot."""

    name = "gdn-padded-slot-written"

    def prepare_gdn_decode(self, case, x):
        def run():
            HV = x.v.shape[1]
            g, beta = tgdn._gates(x.A_log, x.a, x.dt_bias, x.b)
            qh, kh = tgdn._norm_qk(x.q, x.k, HV, x.scale)
            S, _ = tgdn._load_states(x.state_pool, x.state_indices)
            S, o = tgdn._step(S, qh, kh, x.v.float(), g, beta)
            x.o.copy_(o)
            x.state_pool[x.state_indices.long()] = S  # -1 wraps to the last slot
            return {"o": x.o}

        return run


class _ConvPaddedSlotWritten(Backend):
    """causal_conv1d update that stores the window of padding rows too: index -1 lands in the pool's last
    slot (the other modes as the torch backend runs them)."""

    name = "conv-padded-slot-written"

    def prepare_causal_conv1d(self, case, x):
        def run():
            if not x.update:
                return tgdn.causal_conv1d(x)
            idx = x.cache_indices.long()
            win = torch.cat([x.conv_states[idx], x.x[:, :, None]], dim=2)  # [B, D, W]
            x.y.copy_(F.silu((win.float() * x.weight.float()[None]).sum(-1) + x.bias.float()))
            x.conv_states[idx] = win[:, :, 1:]  # -1 wraps to the last slot
            return {"y": x.y}

        return run


def _norm_qk_per_tile(q, k, HV, scale, tile: int = 64):
    """q/k L2 norms taken over each 64-wide slice of the head dim (a K-tiled kernel that normalises per tile)."""
    group = HV // q.shape[-2]

    def norm(t):
        parts = t.float().split(tile, dim=-1)
        return torch.cat([p * torch.rsqrt((p * p).sum(-1, keepdim=True) + tgdn.L2_EPS) for p in parts], -1)

    qf, kf = norm(q) * scale, norm(k)
    return qf.repeat_interleave(group, dim=-2), kf.repeat_interleave(group, dim=-2)


def _inputs_changed(name: str, ops: tuple[str, ...], change) -> Backend:
    """The torch backend's `ops`, each run on its inputs with the fields `change(x)` returns replaced
    (the bug); every other tensor is shared with x, so outputs and pools land in x as the checks expect."""

    def prepare_for(fn):
        def prepare(self, case, x):
            y = dataclasses.replace(x, **change(x))
            return lambda: fn(y)

        return prepare

    methods = {f"prepare_{op}": prepare_for(getattr(tgdn, op)) for op in ops}
    return type(f"Mutant_{name}", (Backend,), {"name": name, **methods})()


def _conv_bias_first_tile() -> Backend:
    """causal_conv1d whose bias pointer is not advanced per 64-channel tile: channel d gets bias[d % 64]."""
    return _inputs_changed("conv-bias-first-tile", ("causal_conv1d",),
                           lambda x: {"bias": x.bias[torch.arange(x.bias.shape[0], device=x.bias.device) % 64]})  # fmt: skip


def _scale_ignored() -> Backend:
    """GDN that scales q by K**-0.5 whatever the model's scale."""
    return _inputs_changed("gdn-scale-ignored", ("gdn_decode", "gdn_extend", "gdn_verify"),
                           lambda x: {"scale": x.q.shape[-1] ** -0.5})  # fmt: skip


def _initial_state_ignored(name: str, op: str) -> Backend:
    """`op` (causal_conv1d or gdn_extend) reads every request's pool slot as its initial state, whatever
    `has_initial_state` says: a slot freed and handed to a new request still holds its previous owner's
    state, which the new request then continues from.

    Real bugs of this class: SGLang PR #24717 (LFM2 called causal_conv1d_fn with has_initial_state None
    for prefill, so a reused Mamba slot leaked the previous request's conv state into a new one), and a
    review of vllm-ascend PR #10558 (its causal_conv1d ignored has_initial_state altogether).
    """
    return _inputs_changed(name, (op,), lambda x: {"has_initial_state": torch.ones_like(x.has_initial_state)})


class _MergeReadsBase2(Backend):
    """merge_state built for base-2 LSEs (FlashInfer's convention) fed natural-log ones: weights
    2^(s - m) instead of e^(s - m), and a base-2 LSE back. The mirror image of SGLang issue #40903 / PR
    #35045 (DeepSeek chunked-prefix prefill fed FlashInfer's base-2 LSEs into the natural-log
    merge_state_v2; max error 0.1 at a 4k prefix) and of vLLM PR #28840 (context-parallel merge)."""

    name = "merge-reads-base2-lse"

    def prepare_merge_state(self, case, x):
        def run():
            m = torch.maximum(x.s_a, x.s_b)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            wa, wb = torch.exp2(x.s_a - m), torch.exp2(x.s_b - m)
            total = wa + wb
            inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
            x.o.copy_(x.v_a.float() * (wa * inv)[..., None] + x.v_b.float() * (wb * inv)[..., None])
            x.lse.copy_(torch.where(total > 0, m + torch.log2(total), torch.full_like(total, -math.inf)))
            return {"o": x.o, "lse": x.lse}

        return run


class _MergeUnguarded(Backend):
    """merge_state without the guard for two empty sides: exp(-inf - -inf) = NaN."""

    name = "merge-unguarded-empty"

    def prepare_merge_state(self, case, x):
        def run():
            m = torch.maximum(x.s_a, x.s_b)
            wa, wb = torch.exp(x.s_a - m), torch.exp(x.s_b - m)
            total = wa + wb
            o = x.v_a.float() * (wa / total)[..., None] + x.v_b.float() * (wb / total)[..., None]
            x.o.copy_(o)
            x.lse.copy_(m + torch.log(total))
            return {"o": x.o, "lse": x.lse}

        return run


class _RandomOrderPromisedDeterministic(Backend):
    """Declares itself deterministic, but sums each row's softmax denominator in a key order that
    changes from call to call (as split-KV with atomics does): the LSE's float32 bits differ between
    consecutive calls. The two orders alternate (they round differently), so the mutant is
    nondeterministic on every pair of calls, not with a probability: a test of it cannot flake."""

    name = "random-order-but-deterministic"
    deterministic = True
    ORDERS = ((0, 1, 2, 3, 4, 5, 6, 7), (3, 1, 7, 4, 0, 6, 5, 2))  # 1 + 3*2^-22 and 1 + 2^-20 in float32

    def prepare_decode(self, case, x):
        def run():
            out = attend(x, Bugs())
            self.calls = getattr(self, "calls", 0) + 1  # per backend, so re-prepared closures alternate too
            total = torch.zeros((), dtype=torch.float32)  # the same sum for every row: reordered, 8 parts
            for k in self.ORDERS[self.calls % 2]:
                total = total + torch.tensor(0.125) * (1 + k * 2**-23)
            log_total = torch.log(total).to(
                x.lse.device
            )  # added before the constant: two roundings keep the orders apart
            x.lse.copy_(torch.where(torch.isfinite(x.lse), x.lse + log_total - math.log1p(3.5 * 2**-23), x.lse))
            return out

        return run

    prepare_extend = prepare_decode


def _a(name: str, **bugs) -> Backend:
    return attention_mutant(name, Bugs(**bugs))


# (name, the bug as a reviewer would describe it, backend factory)
INTERACTION_MUTANTS = (
    # FlashInfer PR #350 fixed exactly this in its decode kernel ("soft cap should be applied before masking")
    ("soft-cap-after-mask", "soft cap applied after masking: masked keys score -cap and become visible",
     lambda: _a("soft-cap-after-mask", cap_after_mask=True)),
    ("window-skips-prefix", "extend: the sliding window is applied to the new keys only, the cached prefix stays visible",
     lambda: _a("window-skips-prefix", window_skips_prefix=True)),
    ("sink-ignored-on-empty-rows", "a row with no visible key returns LSE -inf, forgetting the sink",
     lambda: _a("sink-ignored-on-empty-rows", sink_skipped_on_empty_rows=True)),
    ("unstabilised-softmax", "exp(s) without subtracting the row max: overflows for large logits",
     lambda: _a("unstabilised-softmax", unstabilised=True)),
    ("base2-lse-on-split-path", "the split-KV path (more than 256 keys) returns a base-2 LSE",
     lambda: _a("base2-lse-on-split-path", base2_lse_split=True)),
    ("gqa-mismap-group4", "q head h reads kv head h % Hkv, only when 4 q heads share a kv head",
     lambda: _a("gqa-mismap-group4", gqa_mod_for_group4=True)),
    ("last-page-length-zero", "last page length L % page_size: a full last page counts as empty",
     lambda: _a("last-page-length-zero", last_page_empty=True)),
    ("reads-one-page-past", "a full last page is read one page-table entry too far (the next request's page: real data, no NaN)",
     lambda: _a("reads-one-page-past", page_past_end=True)),
    ("stale-split-merge-lse", "split-KV merge keeps the first split's LSE",
     lambda: _a("stale-split-merge-lse", stale_split_lse=True)),
    ("accumulates-in-bf16", "P.V accumulated in the case dtype (bf16/fp16) 16 keys at a time",
     lambda: _a("accumulates-in-bf16", bf16_accumulate=True)),
    ("sink-per-kv-head", "sink logits indexed by kv head instead of q head",
     lambda: _a("sink-per-kv-head", sink_per_kv_head=True)),
    ("swapped-kv-scales", "fp8 K dequantised with v_scale and V with k_scale",
     lambda: _a("swapped-kv-scales", swapped_scales=True)),
    ("per-head-scale-collapsed", "per-head fp8 scales collapsed to head 0's",
     lambda: _a("per-head-scale-collapsed", scale_head0=True)),
    # what an adapter that passes k_scale = v_scale = 1.0 computes (the sglang adapter's extend calls did, issue #36)
    ("kv-scales-ignored", "fp8 KV cache entries read as stored, without the layer's k_scale/v_scale",
     lambda: _a("kv-scales-ignored", scales_ignored=True)),
    ("causal-top-left", "causal mask aligned top-left (j <= i) instead of bottom-right",
     lambda: _a("causal-top-left", causal_top_left=True)),
    ("window-dropped-unless-causal", "the window is ignored with bidirectional or custom masks",
     lambda: _a("window-dropped-unless-causal", window_dropped_unless_causal=True)),
    ("mla-rope-dropped", "MLA scores from the 512 latent dims only, rope part ignored",
     lambda: _a("mla-rope-dropped", mla_rope_dropped=True)),
    # the class of ROCm composable_kernel issue #12227 / PR #12229: split-KV attention let the sink logit
    # into the merged softmax denominator more than once (and not at all on an empty key range)
    ("sink-every-split", "split-KV: every split's partial state carries the sink, so it counts once per split",
     lambda: _a("sink-every-split", sink_every_split=True)),
    # hybrid SWA models keep the sliding-window layers' K/V in their own pool: the full pool's locations
    # must go through full_to_swa (SGLang's full_to_swa_index_mapping) before they index it
    ("swa-pool-untranslated", "a sliding-window layer indexes its own KV pool with the full pool's page ids",
     lambda: _a("swa-pool-untranslated", swa_pool_untranslated=True)),
    # EAGLE draft decode over batch x topk rows: a kernel that finds pages per request (row // topk) rather
    # than per row sees the shared prefix right, and candidate 0's copy of the partial page and draft
    # tokens in place of its own
    ("draft-candidate0-pages", "draft decode: every candidate reads its request's first candidate's pages "
     "(shared prefix right, draft tokens of candidate 0)",
     lambda: _a("draft-candidate0-pages", draft_rows_by_request=True)),
    ("dt-bias-head0", "GDN gating adds dt_bias of head 0 to every head",
     lambda: patched_gdn("dt-bias-head0", "_gates", _gates_head0_dt_bias,
                         ("gdn_gating", "gdn_decode", "gdn_verify"))),
    ("softplus-no-threshold", "softplus as log(1 + exp(x)) without the linear branch: inf beyond exp overflow",
     lambda: patched_gdn("softplus-no-threshold", "_gates", _gates_no_threshold,
                         ("gdn_gating", "gdn_decode", "gdn_verify"))),
    ("softplus-threshold-2", "softplus switches to its linear branch above 2 instead of 20",
     lambda: patched_gdn("softplus-threshold-2", "_gates", _gates_threshold_2,
                         ("gdn_gating", "gdn_decode", "gdn_verify"))),
    ("conv-state-short-not-saved", "causal_conv1d leaves the state of requests shorter than width - 1 unwritten",
     lambda: _ConvShortNotSaved()),
    ("gdn-padded-slot-written", "gdn_decode stores padding rows' states: index -1 writes the pool's last slot",
     lambda: _PaddedSlotWritten()),
    ("conv-padded-slot-written", "causal_conv1d update stores padding rows' windows: index -1 writes the pool's "
     "last slot", lambda: _ConvPaddedSlotWritten()),
    ("gdn-scale-ignored", "GDN scales q by K**-0.5 whatever the model's scale",
     _scale_ignored),
    ("merge-unguarded-empty", "merge_state without the guard for two empty sides (NaN)",
     lambda: _MergeUnguarded()),
    # from upstream bug trackers (each docstring names its source)
    ("conv-ignores-has-initial-state", "causal_conv1d continues from a reused slot's stale state (has_initial_state ignored)",
     lambda: _initial_state_ignored("conv-ignores-has-initial-state", "causal_conv1d")),
    ("gdn-extend-ignores-has-initial-state", "gdn_extend continues from a reused slot's stale state (has_initial_state ignored)",
     lambda: _initial_state_ignored("gdn-extend-ignores-has-initial-state", "gdn_extend")),
    ("merge-reads-base2-lse", "merge_state weights natural-log LSEs as base 2 (FlashInfer's convention)",
     lambda: _MergeReadsBase2()),
    ("random-order-but-deterministic", "declares itself deterministic, sums in a random order (atomics)",
     lambda: _RandomOrderPromisedDeterministic()),
    # shapes past a kernel's tile or split size (written independently of the suites, as a test of them)
    ("gqa-pow2-stride", "a kv group of 3 padded to a 4-row tile: q heads read at kv * 4 + r (needs G not a power of two, Hkv > 1)",
     lambda: _a("gqa-pow2-stride", gqa_pow2_stride=True)),
    ("causal-tile-diagonal", "extend: the last row of each full 64-row query tile misses its own key (needs q_len >= 64)",
     lambda: _a("causal-tile-diagonal", causal_tile_diagonal=True)),
    ("sink-split-o-unscaled", "split-KV: the sink is added to the merged LSE but the output is not rescaled by it",
     lambda: _a("sink-split-o-unscaled", sink_split_o_unscaled=True)),
    ("split-tail-dropped", "split-KV: the last split's length is L % split, so it vanishes when L is a multiple",
     lambda: _a("split-tail-dropped", split_tail_dropped=True)),
    ("gdn-norm-per-k-tile", "GDN q/k L2 norms taken per 64-wide slice of the head dim (needs K > 64)",
     lambda: patched_gdn("gdn-norm-per-k-tile", "_norm_qk", _norm_qk_per_tile,
                         ("gdn_decode", "gdn_extend", "gdn_verify"))),
    ("conv-bias-first-tile", "causal_conv1d: channel d gets bias[d % 64] (needs more than 64 channels)",
     _conv_bias_first_tile),
)  # fmt: skip
