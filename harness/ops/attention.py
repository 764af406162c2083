"""Attention-family op contracts: `decode`, `extend`, `merge_state`.

Canonical semantics (docs/architecture.md): paged KV `[P, page_size, Hkv, D]` with CSR page tables, natural
log LSE `[T, Hq]` fp32, GQA head h -> kv head h // (Hq / Hkv), bottom-right causal, window_left W
(W + 1 keys including the query's own), soft cap before masking, sinks as per-head logits in the
denominator only, absorbed MLA (Dk = 576 = 512 latent + 64 rope, Dv = 512, Hkv = 1, V = the latent).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field, model_validator

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops import rng
from attnbench.ops.base import (
    WEIGHTS,
    IdField,
    Op,
    OutputSpec,
    Params,
    Perturbation,
    SmokeSpace,
    magnitude_key,
    negate,
    negated,
    tensor_bytes,
)
from attnbench.ops.distributions import Distribution, Sampler, lse_like
from attnbench.ops.paged import (
    draft_layout,
    draft_pages,
    fill,
    make_layout,
    poisoned_cache,
    pool_pages,
    swa_pool,
    window_start_page,
)
from attnbench.ops.replay_batches import decode_batch
from attnbench.references import attention as ref

MLA_DK, MLA_DV = 576, 512
MLA_SCALE = 192**-0.5  # DeepSeek-V3: 1/sqrt(qk_nope 128 + qk_rope 64), without the YaRN mscale


class AttentionParams(Params):
    """Parameters shared by decode and extend."""

    batch: int = Field(1, ge=1)
    heads_q: int = Field(8, ge=1)
    heads_kv: int = Field(8, ge=1)
    head_dim: int = Field(128, ge=1)
    head_dim_v: int | None = Field(None, ge=1, description="value head dim; default: head_dim")
    mla: bool = Field(False, description="absorbed MLA: heads_kv 1, head_dim 576, head_dim_v 512")
    page_size: int = Field(16, ge=1)
    lens: Literal["equal", "mixed", "skewed"] = Field(
        "equal", description="equal: every request at the max; mixed: uniform below it; skewed: one long, rest 1/16"
    )
    window: int = Field(-1, ge=-1, description="window_left W: keys [p - W, p]; -1 = none")
    soft_cap: float = Field(0.0, ge=0.0, description="cap * tanh(s / cap) after scaling; 0 = none")
    sinks: bool = Field(False, description="one learnable sink logit per q head")
    sm_scale: float | None = Field(None, gt=0.0, description="default: head_dim**-0.5 (MLA: 192**-0.5)")
    distribution: Distribution = Field("normal", description="input values: see harness/ops/distributions.py")
    kv_dtype: Literal["auto", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV cache dtype; auto = the case dtype"
    )
    kv_scale: Literal["tensor", "head"] = Field("tensor", description="fp8 KV: one scale per tensor or per kv head")
    pool_pages: int | None = Field(
        None,
        ge=1,
        description="pages in the KV pool (default: the pages the batch needs + ~12% spare): a production-size "
        "pool with every page a request uses at its end, past 2^31 elements where it is that large (int32 "
        "offsets); the pages before are spare and NaN",
    )

    @model_validator(mode="after")
    def _shapes(self):
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.mla and (self.heads_kv, self.head_dim, self.dv) != (1, MLA_DK, MLA_DV):
            raise ValueError(
                f"mla needs heads_kv 1, head_dim {MLA_DK}, head_dim_v {MLA_DV} "
                f"(got {self.heads_kv}, {self.head_dim}, {self.dv}); the deepseek-v3 preset sets them"
            )
        if self.kv_scale == "head" and self.kv_dtype == "auto":
            raise ValueError("kv_scale head needs an fp8 kv_dtype (an unquantised cache has no scales)")
        if self.pool_pages is not None and getattr(self, "draft_topk", 1) > 1:
            raise ValueError("pool_pages with draft_topk > 1 is not supported: the draft layout sizes its own pool")
        return self

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def scale(self) -> float:
        if self.sm_scale is not None:
            return self.sm_scale
        return MLA_SCALE if self.mla else self.head_dim**-0.5


Lengths = tuple[Annotated[int, Field(ge=0)], ...]

_KV_POOL = Field(
    "full",
    description="full: the cache is the layer's whole pool; swa: a sliding-window layer's own pool (gpt-oss, "
    "Gemma 3): pages before each request's window are freed and hold other requests' keys, and "
    "full_to_swa maps the full pool's pages to the SWA pool's (needs a window)",
)


def _pool_needs_window(p) -> None:
    if p.kv_pool == "swa" and p.window < 0:
        raise ValueError("kv_pool swa needs a window (window >= 0): the SWA pool frees the pages before it")


class DecodeParams(AttentionParams):
    kv_len: int = Field(1024, ge=1, description="keys per request (the longest, for mixed/skewed)")
    kv_lens: Lengths | None = Field(
        None, description="explicit keys per request (replayed batches, docs/trace.md): sets batch and kv_len"
    )
    kv_pool: Literal["full", "swa"] = _KV_POOL
    draft_topk: int = Field(
        1,
        ge=1,
        description="EAGLE draft decode: candidates per request; batch x draft_topk query rows (row b * topk + c), "
        "the candidates of a request sharing its prefix pages (1 = a plain decode)",
    )
    draft_step: int = Field(
        1,
        ge=1,
        description="draft decode: own draft tokens each candidate has in the cache, its current one included; "
        "every row sees kv_len - draft_step prefix keys, then its own draft_step",
    )

    @model_validator(mode="after")
    def _pool(self):
        _check_draft(self)
        _pool_needs_window(self)
        return self

    @property
    def keys(self) -> int:
        """Keys of the longest request (the length of its P.V sums)."""
        return self.kv_len

    @model_validator(mode="before")
    @classmethod
    def _explicit(cls, data):
        return _derive(data, {"kv_lens": ("kv_len", 1)})


def _check_draft(p: DecodeParams) -> None:
    if p.draft_topk == 1:
        if p.draft_step != 1:
            raise ValueError(
                f"draft_step {p.draft_step} needs draft_topk > 1: with one candidate per request a draft decode "
                "is a plain decode of kv_len keys (leave draft_step at 1)"
            )
        return
    if p.kv_pool == "swa":
        raise ValueError(
            "draft_topk > 1 with kv_pool swa is not part of the decode contract: the draft layout (shared prefix "
            "pages, per-candidate copies of the last partial page) is defined over the full pool only"
        )
    lens = p.kv_lens if p.kv_lens is not None else (p.kv_len,)
    short = [(i, n) for i, n in enumerate(lens) if n <= p.draft_step]
    if short:
        i, n = short[0]
        where = f"kv_lens[{i}] = {n}" if p.kv_lens is not None else f"kv_len {n}"
        raise ValueError(
            f"{where} leaves no prefix for draft_step {p.draft_step}: every candidate row sees its request's "
            f"prefix (keys - draft_step, at least 1) and then its own draft_step tokens"
        )


class ExtendParams(AttentionParams):
    lens: Literal["equal", "mixed", "skewed", "serving"] = Field(
        "equal",
        description="equal: every request at the max; mixed: uniform below it; serving: a chunked-prefill "
        "scheduler's batch: request 0 a long prefill chunk (q_len), then decodes (q 1) and short chunks "
        "(q_len / 8) in turn over mixed prefixes",
    )
    q_len: int = Field(128, ge=1, description="new tokens per request (the most, for mixed)")
    kv_pool: Literal["full", "swa"] = _KV_POOL
    prefix_len: int = Field(0, ge=0, description="cached tokens before them (the most, for mixed)")
    mask: Literal["causal", "bidirectional", "custom"] = "causal"
    empty_rows: bool = Field(False, description="custom mask: each request's first query sees no key (o 0, lse -inf)")
    new_kv: Literal["save", "attend", "shared"] = Field(
        "save",
        description="save: write k_new/v_new into their slots, then attend (save_kv_cache); attend: use "
        "k_new/v_new, leave the slots alone; shared: cross-layer KV, the cache holds every token (k = v = None)",
    )

    q_lens: Lengths | None = Field(
        None, description="explicit new tokens per request (replayed batches, docs/trace.md): sets batch and q_len"
    )
    prefix_lens: Lengths | None = Field(
        None, description="explicit cached tokens per request (with q_lens): sets prefix_len"
    )

    @property
    def keys(self) -> int:
        """Keys of the longest request (the length of its P.V sums)."""
        if self.q_lens is not None:
            return max(q + pre for q, pre in zip(self.q_lens, self.prefix_lens))
        return self.prefix_len + self.q_len

    @model_validator(mode="before")
    @classmethod
    def _explicit(cls, data):
        if isinstance(data, dict) and data.get("prefix_lens") is not None and data.get("q_lens") is None:
            raise ValueError("prefix_lens needs q_lens (the new tokens of each request)")
        if isinstance(data, dict) and data.get("q_lens") is not None and data.get("prefix_lens") is None:
            data = {**data, "prefix_lens": (0,) * len(data["q_lens"]) if hasattr(data["q_lens"], "__len__") else None}
        return _derive(data, {"q_lens": ("q_len", 1), "prefix_lens": ("prefix_len", 0)})

    @model_validator(mode="after")
    def _lens(self):
        if self.lens == "skewed":
            raise ValueError("extend supports lens equal, mixed or serving")
        if self.empty_rows and self.mask != "custom":
            raise ValueError("empty_rows needs mask: custom")
        _pool_needs_window(self)
        return self


class MergeStateParams(Params):
    tokens: int = Field(256, ge=1)
    heads: int = Field(8, ge=1)
    head_dim: int = Field(128, ge=1)
    empty: bool = Field(False, description="some states empty (lse -inf) on one or both sides")
    distribution: Distribution = Field("normal", description="values and LSEs: see harness/ops/distributions.py")


@dataclass
class AttentionInputs:
    """Inputs of decode and extend (decode: one query per request, T = B, no new K/V).

    Tensors are on the case device; `*_host` are the same lengths as Python lists (no device sync).
    """

    q: torch.Tensor  # [T, Hq, Dk] case dtype
    k_cache: torch.Tensor  # [P, page_size, Hkv, Dk]
    v_cache: torch.Tensor  # [P, page_size, Hkv, Dv]  (MLA: k_cache[..., :512], a view)
    kv_indptr: torch.Tensor  # [B+1] int32, pages of request b: kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_page_indices: torch.Tensor  # [nnz] int32
    seq_lens: torch.Tensor  # [B] int32, keys per request (prefix + new)
    qo_indptr: torch.Tensor  # [B+1] int32, queries of request b: q[qo_indptr[b]:qo_indptr[b+1]]
    o: torch.Tensor  # [T, Hq, Dv] case dtype, output (NaN-filled, canary-padded)
    lse: torch.Tensor  # [T, Hq] fp32, output, natural log
    sm_scale: float
    causal: bool = True
    window: int = -1
    soft_cap: float = 0.0
    sinks: torch.Tensor | None = None  # [Hq] fp32 logits
    k_scale: torch.Tensor | None = None  # fp8 caches: [1] or [Hkv] fp32, real value = stored * scale
    v_scale: torch.Tensor | None = None  # (powers of two, so quantising k_new is exact to define)
    k_new: torch.Tensor | None = None  # [T, Hkv, Dk] extend: keys of the new tokens (case dtype)
    v_new: torch.Tensor | None = None  # [T, Hkv, Dv]            (MLA: k_new[..., :512])
    save_kv: bool = False  # write k_new/v_new into slot_mapping before attending
    slot_mapping: torch.Tensor | None = None  # [T] int64 cache slot (page * page_size + offset) per new token
    custom_mask: torch.Tensor | None = None  # bool, [q_len_b, seq_len_b] per request, flattened; True = visible
    mask_indptr: torch.Tensor | None = None  # [B+1] int64 offsets into custom_mask
    seq_lens_host: tuple[int, ...] = ()
    q_lens_host: tuple[int, ...] = ()
    # kv_pool swa: k_cache/v_cache are the sliding-window layer's own pool and kv_page_indices its page
    # table (= full_to_swa[full_page_indices]); pages before each request's window belong to other
    # requests (their data). A backend may take kv_page_indices, or translate the full table itself.
    full_page_indices: torch.Tensor | None = None  # [nnz] int32, the full pool's pages (same kv_indptr)
    full_to_swa: torch.Tensor | None = None  # [P] int32, full pool page -> SWA pool page
    # decode draft_topk > 1: rows b * draft_topk + c are the candidates of request b; their tables name
    # the same prefix pages (kernels may exploit that; the reference reads each row's table as is)
    draft_topk: int = 1
    # pool_pages: the first page of the region requests' pages are drawn from (0 for a default pool); the
    # pages before it are spare. The reference reads only the region, so a pool past 2^31 elements costs
    # no float64 copy (`written_rows`)
    pool_base: int = 0

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]


@dataclass
class MergeStateInputs:
    v_a: torch.Tensor  # [T, H, D] case dtype
    s_a: torch.Tensor  # [T, H] fp32, natural-log LSE (-inf = empty)
    v_b: torch.Tensor
    s_b: torch.Tensor
    o: torch.Tensor  # [T, H, D] output
    lse: torch.Tensor  # [T, H] fp32 output


def _generators(seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    """(generator for tables and lengths, generator for data), both on the CPU, from the case seed."""
    host = torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(seed + 7919)  # CPU: the same data on any device (ops/rng.py)
    return host, data


def _derive(data, lists: dict[str, tuple[str, int]]):
    """Explicit per-request lengths (`{list field: (its max field, least length)}`) set `batch` and the max
    fields; given as well, those must agree. `lens` stays at its default: the lists replace it."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    given = [
        n for n in lists if data.get(n) is not None and hasattr(data[n], "__len__") and not isinstance(data[n], str)
    ]
    if len({len(data[n]) for n in given}) > 1:
        raise ValueError(f"{' and '.join(given)} differ in length ({', '.join(str(len(data[n])) for n in given)})")
    sizes = set()
    for name, (most, least) in lists.items():
        values = data.get(name)
        if values is None:
            continue
        if isinstance(values, str) or not hasattr(values, "__len__"):
            raise ValueError(f"{name} is a list of per-request lengths, got {values!r}")
        values = data[name] = tuple(values)
        if not values:
            raise ValueError(f"{name} is empty: a batch has at least one request")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values):
            raise ValueError(f"{name} holds integers >= {least}, got {list(values)}")
        sizes.add(len(values))
        for field, want in ((most, max(values)), ("batch", len(values))):
            if data.get(field) not in (None, want):
                raise ValueError(f"{field} {data[field]} contradicts {name} (which sets it to {want})")
            data[field] = want
    if sizes and data.get("lens", "equal") != "equal":
        raise ValueError(f"lens {data['lens']} and explicit lengths contradict: the lists replace lens")
    return data


def lengths_digest(*lists: tuple[int, ...] | None) -> str:
    """8 hex digits naming explicit per-request lengths in a case id (`lens3fa2c1d0`); the lengths are in
    the row's params and the trace, never in the id (docs/trace.md)."""
    text = ";".join(",".join(map(str, v)) for v in lists if v is not None)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _randn(shape, dtype, gen: torch.Generator, device) -> torch.Tensor:
    return rng.randn(shape, gen).to(device=device, dtype=dtype)


def _lengths(n: int, most: int, kind: str, host: torch.Generator, least: int = 1) -> list[int]:
    """Per-request lengths whose maximum is `most`, so ids name the longest.

    `mixed` (random in least..most) and `skewed` (one long, the rest most/16) put the longest request
    at a seeded position, not always first: a kernel that derives every request's offsets from
    request 0 must not meet a batch where that happens to be right. `serving` keeps its order (one
    long chunk, then decodes and short chunks in turn, as a mixed prefill/decode batch is laid out).
    """
    if kind == "equal" or n == 1:
        return [most] * n
    if kind == "serving":
        return [most] + [max(least, most // 8) if i % 3 == 2 else max(least, 1) for i in range(1, n)]
    if kind == "skewed":
        rest = [max(least, most // 16)] * (n - 1)
    else:
        rest = torch.randint(least, most + 1, (n - 1,), generator=host).tolist()
    at = int(torch.randint(0, n, (1,), generator=host))
    return rest[:at] + [most] + rest[at:]


_ATTN_ID = (
    IdField("b", ("batch",), always=True),
    IdField("q", ("q_len",), always=True),
    IdField("l", ("kv_len",), always=True),
    IdField("pre", ("prefix_len",), always=True),
    IdField("", ("lens",)),
    IdField("h", ("heads_q", "heads_kv"), always=True),
    IdField("d", ("head_dim", "head_dim_v"), always=True),
    IdField("p", ("page_size",), always=True),
    IdField("topk", ("draft_topk",)),
    IdField("step", ("draft_step",)),
    IdField("", ("mask",)),
    IdField("emptyrows", ("empty_rows",)),
    IdField("kv", ("new_kv",)),
    IdField("mla", ("mla",)),
    IdField("swa", ("window",)),
    IdField("pool", ("kv_pool",)),
    IdField("cap", ("soft_cap",)),
    IdField("sink", ("sinks",)),
    IdField("scale", ("sm_scale",)),
    IdField("", ("distribution",)),
    IdField("", ("kv_dtype",)),
    IdField("kvscale", ("kv_scale",)),
    IdField("pages", ("pool_pages",)),
)


EXPLICIT = "lens"  # id token prefix of explicit lengths' digest: `lens3fa2c1d0`


_PLANNED = (
    "per-request lengths: a backend plans its launch from them in prepare (FlashInfer's plan()), and every "
    "buffer is sized by them"
)


_PAGES = (
    "the page table: the bundled torch backend turns it into gather indices in prepare, so it is held until "
    "backends read it on every call"
)


def _shares_k(x: AttentionInputs) -> bool:
    """MLA: the values are the keys' latent part (v_cache is a view of k_cache)."""
    return x.v_cache.untyped_storage().data_ptr() == x.k_cache.untyped_storage().data_ptr()


def _negate_keys(p, x: AttentionInputs, cache: bool) -> None:
    """Every key negated; MLA: the rope part only (the latent part is the values')."""
    dv = x.v_cache.shape[-1] if _shares_k(x) else 0
    for t in ((x.k_cache,) if cache else ()) + ((x.k_new,) if x.k_new is not None else ()):
        negate(t[..., dv:])


def _complement_mask(p, x: AttentionInputs) -> None:
    """Every visibility flipped but each query's own key (visible) and the rows that see nothing (empty)."""
    offsets = x.mask_indptr.tolist()
    for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host)):
        block = x.custom_mask[offsets[b] : offsets[b + 1]].view(n, L)
        empty = ~block.any(1, keepdim=True)
        block.copy_(~block & ~empty)
        block[torch.arange(n), torch.arange(L - n, L)] = ~empty[:, 0]


class _PagedAttentionOp(Op):
    family = "attention"
    explicit: tuple[str, ...] = ()  # the params holding explicit per-request lengths

    def id_tokens(self, p) -> list[str]:
        """Explicit lengths read as one digest token where `lens` would be (after b, q/l, pre)."""
        tokens = super().id_tokens(p)
        lists = [getattr(p, n, None) for n in self.explicit]
        if any(v is not None for v in lists):
            at = sum(
                1 for f in self.id_fields if f.always and f.fields[0] in ("batch", "q_len", "kv_len", "prefix_len")
            )
            tokens.insert(at, EXPLICIT + lengths_digest(*lists))
        return tokens

    def parse_id_tokens(self, tokens: list[str]) -> dict:
        for t in tokens:
            rest = t.removeprefix(EXPLICIT)
            if rest != t and len(rest) == 8 and all(c in "0123456789abcdef" for c in rest):
                raise ValueError(
                    f"{t} names explicit per-request lengths by digest and no trace given (nor a built-in one) holds "
                    "this case; add the trace it came from: --trace FILE (docs/trace.md)"
                )
        return super().parse_id_tokens(tokens)

    outputs = {
        # scores are head_dim-long float32 sums, then P.V and the denominator sum over the keys
        "o": OutputSpec(("token", "head", "dim"), floor_units=("head_dim", "keys"), magnitude=True),
        "lse": OutputSpec(("token", "head"), floor_units=("head_dim", "keys"), slice_scale=False),
    }

    def features(self, p: AttentionParams) -> tuple[str, ...]:
        f = ["mla"] if p.mla else ["mha" if p.heads_q == p.heads_kv else "mqa" if p.heads_kv == 1 else "gqa"]
        f.append(f"page{p.page_size}")
        if p.head_dim_v is not None and p.head_dim_v != p.head_dim and not p.mla:
            f.append("dk!=dv")
        if p.head_dim not in (64, 128, 256) and not p.mla:
            f.append("odd-dim")
        f += [name for name, on in (("swa", p.window >= 0), ("softcap", p.soft_cap > 0), ("sinks", p.sinks)) if on]
        if getattr(p, "kv_pool", "full") == "swa":
            f.append("swa-pool")
        if p.kv_dtype != "auto":
            f.append(f"kv-{p.kv_dtype}" + ("-per-head" if p.kv_scale == "head" else ""))
        if p.distribution != "normal":
            f.append(f"dist-{p.distribution}")
        return tuple(f)

    def _build(
        self,
        p: AttentionParams,
        dtype,
        seed,
        device,
        kv_lens,
        q_lens,
        new_kv: str,
        draft: tuple[int, int] | None = None,
    ) -> AttentionInputs:
        """`draft` (decode only): (topk, step): kv_lens/q_lens are per candidate row, `topk` rows per request."""
        host, gen = _generators(seed, device)
        draw = Sampler(p.distribution, gen, device, dtype)
        T = sum(q_lens)
        Hkv, Dk, Dv = p.heads_kv, p.head_dim, p.dv
        if draft:
            topk, step = draft
            prefix = [L - step for L in kv_lens[::topk]]
            layout = draft_layout(prefix, topk, step, p.page_size, host, device)
            sizes = [P + topk * step for P in prefix]  # per request: its prefix, then every candidate's own tokens
        else:
            layout = make_layout(kv_lens, p.page_size, host, device, p.pool_pages)
            sizes = kv_lens
        swa = getattr(p, "kv_pool", "full") == "swa"
        full_pages = full_to_swa = None
        if swa:
            full_pages = layout.kv_page_indices
            layout, full_to_swa = swa_pool(layout, host)
        # every request's keys/values in float32, new tokens included, shaped by the distribution
        keys = [draw.structure_keys(draw.draw("k", (L, Hkv, Dk))) for L in sizes]
        values = [k[..., :Dv] for k in keys] if p.mla else [draw.draw("v", (L, Hkv, Dv)) for L in sizes]
        cache_dtype = FP8.get(p.kv_dtype, dtype)
        k_scale = v_scale = None
        if p.kv_dtype != "auto":
            k_scale = _fp8_scale(keys, cache_dtype, p.kv_scale)
            v_scale = k_scale if p.mla else _fp8_scale(values, cache_dtype, p.kv_scale, spread=1)
        k_cache = poisoned_cache(layout, Hkv, Dk, cache_dtype, device)
        v_cache = k_cache[..., :Dv] if p.mla else poisoned_cache(layout, Hkv, Dv, cache_dtype, device)
        new_slots = []
        if swa:  # every request's keys and values in one sequence: freed pages take other requests' data
            starts = [0, *itertools.accumulate(kv_lens)]
            every_k, every_v = torch.cat(keys), (None if p.mla else torch.cat(values))
        if draft:
            for b, P in enumerate(prefix):
                for c in range(topk):
                    # candidate 0 writes the shared full pages (once); every candidate writes its own copy of
                    # the partial last prefix page, then its own draft tokens
                    r, start = b * topk + c, (0 if c == 0 else P // p.page_size * p.page_size)
                    own = slice(P + c * step, P + (c + 1) * step)
                    slots = layout.slots(r, start, P + step)
                    fill(k_cache, slots, quantize(torch.cat([keys[b][start:P], keys[b][own]]), k_scale, cache_dtype))
                    if not p.mla:
                        row_v = torch.cat([values[b][start:P], values[b][own]])
                        fill(v_cache, slots, quantize(row_v, v_scale, cache_dtype))
        else:
            for b, (L, n) in enumerate(zip(kv_lens, q_lens)):
                cached = L - n if new_kv != "shared" else L
                kept = min(cached, window_start_page(L - n, p.window, p.page_size)) if swa else 0
                slots = layout.slots(b, kept, cached)
                fill(k_cache, slots, quantize(keys[b][kept:cached], k_scale, cache_dtype))
                if not p.mla:
                    fill(v_cache, slots, quantize(values[b][kept:cached], v_scale, cache_dtype))
                if kept:  # freed pages now hold other requests' keys: finite, and wrong for this one
                    other = (torch.arange(kept) + starts[b + 1]) % starts[-1]
                    freed = layout.slots(b, 0, kept)
                    fill(k_cache, freed, quantize(every_k[other], k_scale, cache_dtype))
                    if not p.mla:
                        fill(v_cache, freed, quantize(every_v[other], v_scale, cache_dtype))
                new_slots.append(layout.slots(b, L - n, L))
        k_new = v_new = slot_mapping = None
        if new_kv in ("save", "attend"):
            k_new = torch.cat([k[L - n :] for k, L, n in zip(keys, kv_lens, q_lens)]).to(dtype)
            v_new = (
                k_new[..., :Dv]
                if p.mla
                else torch.cat([v[L - n :] for v, L, n in zip(values, kv_lens, q_lens)]).to(dtype)
            )
            if new_kv == "save":
                slot_mapping = torch.cat(new_slots)
        q = draw.draw("q", (T, p.heads_q, Dk)).to(dtype)
        sinks = _randn((p.heads_q,), torch.float32, gen, device) * 2 if p.sinks else None
        qo = torch.tensor([0] + list(q_lens), dtype=torch.int64).cumsum(0).to(torch.int32)
        mask = mask_indptr = None
        if getattr(p, "mask", "causal") == "custom":
            mask, mask_indptr = _custom_mask(kv_lens, q_lens, host, device, getattr(p, "empty_rows", False))
        return AttentionInputs(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            kv_indptr=layout.kv_indptr,
            kv_page_indices=layout.kv_page_indices,
            seq_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
            qo_indptr=qo.to(device),
            o=alloc_output((T, p.heads_q, Dv), dtype, device),
            lse=alloc_output((T, p.heads_q), torch.float32, device),
            sm_scale=p.scale,
            causal=getattr(p, "mask", "causal") != "bidirectional",
            window=p.window,
            soft_cap=p.soft_cap,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            k_new=k_new,
            v_new=v_new,
            save_kv=new_kv == "save",
            slot_mapping=slot_mapping,
            custom_mask=mask,
            mask_indptr=mask_indptr,
            seq_lens_host=tuple(kv_lens),
            q_lens_host=tuple(q_lens),
            full_page_indices=full_pages,
            full_to_swa=full_to_swa,
            draft_topk=draft[0] if draft else 1,
            pool_base=layout.base,
        )

    def _bytes_for(self, p: AttentionParams, dtype, kv_lens, q_lens, new_kv: str, mask: bool) -> int:
        """`input_bytes` of `_build` with these lengths (`mask`: a custom mask over every request)."""
        B, T, Hq, Hkv, Dk, Dv = len(kv_lens), sum(q_lens), p.heads_q, p.heads_kv, p.head_dim, p.dv
        need = sum(-(-n // p.page_size) for n in kv_lens)  # page-table entries
        distinct = need
        if (topk := getattr(p, "draft_topk", 1)) > 1:  # candidates share their request's full prefix pages
            distinct, _ = draft_pages([L - p.draft_step for L in kv_lens[::topk]], topk, p.draft_step, p.page_size)
        pages = pool_pages(distinct) if p.pool_pages is None else p.pool_pages
        slots = pages * p.page_size * Hkv
        cache = FP8.get(p.kv_dtype, dtype)
        total = tensor_bytes((slots, Dk), cache) + (0 if p.mla else tensor_bytes((slots, Dv), cache))
        total += (
            tensor_bytes((T, Hq, Dk), dtype) + output_bytes((T, Hq, Dv), dtype) + output_bytes((T, Hq), torch.float32)
        )
        total += 4 * (need + 3 * B + 2)  # page indices, kv_indptr, seq_lens, qo_indptr (int32)
        if new_kv in ("save", "attend"):
            total += tensor_bytes((T, Hkv, Dk), dtype) + (0 if p.mla else tensor_bytes((T, Hkv, Dv), dtype))
            total += 8 * T if new_kv == "save" else 0  # slot_mapping
        if p.kv_dtype != "auto":
            total += 4 * (Hkv if p.kv_scale == "head" else 1) * (1 if p.mla else 2)
        if p.sinks:
            total += 4 * Hq
        if mask:
            total += sum(n * L for n, L in zip(q_lens, kv_lens)) + 8 * (B + 1)
        if getattr(p, "kv_pool", "full") == "swa":
            total += 4 * (need + pages)  # full_page_indices, full_to_swa (int32)
        return total

    def input_bytes(self, p, dtype, seed: int) -> int:
        kv_lens, q_lens = self.request_lengths(p, seed)
        new_kv = getattr(p, "new_kv", "shared")
        return self._bytes_for(p, dtype, kv_lens, q_lens, new_kv, getattr(p, "mask", "causal") == "custom")

    def written_rows(self, p, x: AttentionInputs) -> dict[str, int]:
        """A production-size pool (`pool_pages`): the expectation of the saved caches covers the pages from
        `pool_base` on; the spare pages before must stay bitwise as they were."""
        return {name: x.pool_base for name in self.writes_for(p)} if x.pool_base else {}

    def expected(self, p, x: AttentionInputs, precision):
        x = _pool_region(x)
        k_cache, v_cache, k_new, v_new = x.k_cache, x.v_cache, x.k_new, x.v_new
        if x.k_scale is not None:  # the reference reads exactly what the kernel reads: dequantised fp8
            k_cache, v_cache = dequantize(k_cache, x.k_scale), dequantize(v_cache, x.v_scale)
            if x.save_kv:  # saved new tokens are attended as stored in the cache
                k_new = dequantize(quantize(k_new, x.k_scale, x.k_cache.dtype), x.k_scale)
                v_new = dequantize(quantize(v_new, x.v_scale, x.v_cache.dtype), x.v_scale)
        o, lse, *mag = ref.paged_attention(
            x.q, k_cache, v_cache, x.kv_indptr, x.kv_page_indices, x.seq_lens, x.qo_indptr,
            sm_scale=x.sm_scale, causal=x.causal, window=x.window, soft_cap=x.soft_cap, sinks=x.sinks,
            k_new=k_new, v_new=v_new, custom_mask=x.custom_mask, mask_indptr=x.mask_indptr,
            precision=precision, magnitude=precision == torch.float64,
        )  # fmt: skip
        out = {"o": o, "lse": lse} | {magnitude_key("o"): m for m in mag}
        if x.save_kv:
            stored_k = quantize(x.k_new, x.k_scale, x.k_cache.dtype)
            out["k_cache"] = ref.saved_cache(x.k_cache, stored_k, x.slot_mapping)
            if not p.mla:
                stored_v = quantize(x.v_new, x.v_scale, x.v_cache.dtype)
                out["v_cache"] = ref.saved_cache(x.v_cache, stored_v, x.slot_mapping)
        return out

    def subset(self, p, x: AttentionInputs, order: list[int]):
        qo, kvp = x.qo_indptr.tolist(), x.kv_indptr.tolist()
        dev = x.q.device
        rows = torch.cat([torch.arange(qo[b], qo[b + 1]) for b in order]).to(dev)
        pages = torch.cat([x.kv_page_indices[kvp[b] : kvp[b + 1]] for b in order])
        counts = [kvp[b + 1] - kvp[b] for b in order]
        qlens = [x.q_lens_host[b] for b in order]
        lens = [x.seq_lens_host[b] for b in order]
        changes = dict(
            q=x.q[rows],
            kv_indptr=torch.tensor([0] + counts, device=dev).cumsum(0).to(torch.int32),
            kv_page_indices=pages,
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            qo_indptr=torch.tensor([0] + qlens, device=dev).cumsum(0).to(torch.int32),
            o=alloc_output((len(rows), *x.o.shape[1:]), x.o.dtype, dev),
            lse=alloc_output((len(rows), *x.lse.shape[1:]), x.lse.dtype, dev),
            seq_lens_host=tuple(lens),
            q_lens_host=tuple(qlens),
            draft_topk=1,  # the rows picked need not be whole requests in order: their tables still share pages
        )
        if x.k_new is not None:
            changes["k_new"] = x.k_new[rows]
            shared = x.v_new.untyped_storage().data_ptr() == x.k_new.untyped_storage().data_ptr()
            changes["v_new"] = changes["k_new"][..., : x.v_new.shape[-1]] if shared else x.v_new[rows]
        if x.slot_mapping is not None:
            changes["slot_mapping"] = x.slot_mapping[rows]
        if x.full_page_indices is not None:
            changes["full_page_indices"] = torch.cat([x.full_page_indices[kvp[b] : kvp[b + 1]] for b in order])
        if x.custom_mask is not None:
            mi = x.mask_indptr.tolist()
            changes["custom_mask"] = torch.cat([x.custom_mask[mi[b] : mi[b + 1]] for b in order])
            sizes = [mi[b + 1] - mi[b] for b in order]
            changes["mask_indptr"] = torch.tensor([0] + sizes, device=dev).cumsum(0)
        return dataclasses.replace(x, **changes), rows

    held = {
        "sinks": WEIGHTS,
        "k_scale": WEIGHTS,
        "v_scale": WEIGHTS,
        "kv_indptr": _PLANNED,
        "seq_lens": _PLANNED,
        "qo_indptr": _PLANNED,
        "mask_indptr": _PLANNED,
        "slot_mapping": "where the new tokens are saved: it addresses the written cache, which a backend may hold in "
        "its own layout from prepare on",
        "kv_page_indices": _PAGES,
        "full_page_indices": _PAGES,
        "full_to_swa": _PAGES,
    }

    def perturbations(self, p: AttentionParams) -> tuple[Perturbation, ...]:
        """Queries, keys and values by value; a custom mask by its complement (own key kept). Lengths,
        page tables and weights (sinks, fp8 scales) are held (`held` says why).
        A case that saves its new K/V writes the caches: only the new tokens change then, and the pages stay."""
        save = getattr(p, "new_kv", "shared") == "save"
        cache = () if save else ("k_cache",)
        perts = [
            negated("queries", ("q",)),
            Perturbation("keys", (*cache, "k_new"), functools.partial(_negate_keys, cache=bool(cache))),
            negated("values", (*(() if save else ("v_cache",)), "v_new")),
        ]
        if getattr(p, "mask", "causal") == "custom":
            perts.append(Perturbation("custom mask", ("custom_mask",), _complement_mask))
        return tuple(perts)

    def row_requests(self, p, x: AttentionInputs):
        return torch.repeat_interleave(torch.arange(len(x.q_lens_host)), torch.tensor(x.q_lens_host))

    # ---- cost model ---------------------------------------------------------------------------
    def _pairs_and_tokens(self, p: AttentionParams, x: AttentionInputs) -> tuple[int, int]:
        """(visible (query, key) pairs, distinct keys attended) summed over requests.

        Draft decode: a key is counted once per cache slot: the full prefix pages the candidates share
        once, each candidate's copy of the partial last prefix page and its draft tokens once per candidate.
        """
        pairs = tokens = 0
        shared = [] if getattr(p, "draft_topk", 1) > 1 else None
        indptr, table = x.kv_indptr.tolist(), x.kv_page_indices.cpu().long()
        mask = x.custom_mask.cpu() if x.custom_mask is not None else None
        offsets = x.mask_indptr.tolist() if x.mask_indptr is not None else None
        for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host)):
            pos = torch.arange(L - n, L)[:, None]
            j = torch.arange(L)[None, :]
            if mask is not None:
                vis = mask[offsets[b] : offsets[b + 1]].view(n, L).clone()
            else:
                vis = (j <= pos) if x.causal else torch.ones(n, L, dtype=torch.bool)
            if x.window >= 0:
                vis &= j >= pos - x.window
            pairs += int(vis.sum())
            tokens += int(vis.any(0).sum())
            if shared is not None:
                at = torch.nonzero(vis.any(0)).flatten()
                shared.append(table[indptr[b] + at // x.page_size] * x.page_size + at % x.page_size)
        if shared is not None:
            tokens = int(torch.cat(shared).unique().numel())
        return pairs, tokens

    def flops(self, p: AttentionParams, x: AttentionInputs) -> float:
        pairs, _ = self._pairs_and_tokens(p, x)
        return 2.0 * p.heads_q * pairs * (p.head_dim + p.dv)

    def bytes(self, p: AttentionParams, x: AttentionInputs) -> float:
        _, tokens = self._pairs_and_tokens(p, x)
        el, kv_el = x.q.element_size(), x.k_cache.element_size()
        kv_per_token = p.heads_kv * (p.head_dim if p.mla else p.head_dim + p.dv) * kv_el
        total = x.q.numel() * el + x.o.numel() * el + x.lse.numel() * 4 + tokens * kv_per_token
        if x.k_new is not None:  # read once; written into the cache once more when saved
            new = x.k_new.numel() * el + (0 if p.mla else x.v_new.numel() * el)
            total += new * (2 if x.save_kv else 1)
        total += (x.kv_page_indices.numel() + x.kv_indptr.numel() + x.seq_lens.numel()) * 4
        return float(total)


def _pool_region(x: AttentionInputs) -> AttentionInputs:
    """`x` over the pool's pages from `pool_base` on (views; page ids and slots relative to them): what
    the reference reads, so a pool past 2^31 elements is never copied or converted whole."""
    base = x.pool_base
    if not base:
        return x
    k = x.k_cache[base:]
    v = k[..., : x.v_cache.shape[-1]] if _shares_k(x) else x.v_cache[base:]
    slots = None if x.slot_mapping is None else x.slot_mapping - base * x.page_size
    return dataclasses.replace(
        x, k_cache=k, v_cache=v, kv_page_indices=x.kv_page_indices - base, slot_mapping=slots, pool_base=0
    )


FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _fp8_scale(tensors: list[torch.Tensor], fp8: torch.dtype, per: str, spread: int = 0) -> torch.Tensor:
    """Power-of-two scales (so x / scale is exact) putting each tensor's (or kv head's) amax within fp8 range.

    Returns `[1]` (per tensor) or `[Hkv]` (per head) float32; real value = stored * scale. The scales
    are made to differ on purpose (a larger scale only costs precision): head h's is multiplied by
    2^((h + spread) % 3), and `spread` differs between K and V, so a kernel that swaps k_scale and
    v_scale, or collapses per-head scales to one, gets different numbers.
    """
    every = torch.cat(tensors).abs()  # [tokens, H, D]
    amax = (every.amax(dim=(0, 2)) if per == "head" else every.amax().reshape(1)).clamp_min(1e-30)
    bump = torch.exp2((torch.arange(amax.numel()) + spread) % 3)
    return (torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(fp8).max))) * bump).float()


def quantize(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`[..., H, D]` values -> stored cache entries: x / scale rounded to the fp8 dtype (or cast, without a scale)."""
    if scale is None:
        return x.to(dtype)
    return (x.float() / scale.view(-1, 1)).to(dtype)


def dequantize(stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Stored fp8 cache entries `[..., H, D]` -> their float32 values (exact: the scales are powers of two)."""
    return stored.float() * scale.view(-1, 1)


def _custom_mask(kv_lens, q_lens, host: torch.Generator, device, empty_rows: bool = False):
    """Random visibility (p = 1/2) with each query's own key visible, flattened per request.

    With `empty_rows`, each request's first query sees nothing (its output is 0, its LSE -inf).
    """
    blocks = []
    for L, n in zip(kv_lens, q_lens):
        block = torch.rand(n, L, generator=host) < 0.5
        block[torch.arange(n), torch.arange(L - n, L)] = True
        if empty_rows:
            block[0] = False
        blocks.append(block.flatten())
    sizes = [n * L for L, n in zip(kv_lens, q_lens)]
    indptr = torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0)
    return torch.cat(blocks).to(device), indptr.to(device)


# ---- smoke coverage (harness/ops/coverage.py) ------------------------------------------------------
ATTENTION_SMOKE = {
    # (12, 4): a group of 3 with several kv heads, so a kernel that pads the group to a power of two
    # and strides by the padded size reads the wrong heads (one kv head would hide it)
    "heads_q,heads_kv": [(4, 4), (8, 2), (8, 1), (16, 1), (12, 4)],
    "head_dim,head_dim_v": [(64, None), (13, None), (96, 64), (576, 512)],
    "page_size": [1, 16, 64],
    "window": [-1, 6, 90],
    "soft_cap": [0.0, 5.0],
    "sm_scale": [None, 0.09],
    "dtype": ["bf16", "fp16", "fp32"],
}
_REPLAYED = "explicit per-request lengths come from replayed traces (tests/harness/test_trace.py), not from pairs"
LARGE_POOLS = "production-size pools past 2^31 elements (int32 offsets) are suites/large.yaml's, on a GPU"
# Batches of variable-length requests reach 5: with 3 or fewer, every request is the first, the second
# (whose offset is request 0's length) or the last (whose offset is total minus its own length), so a
# kernel that derives offsets from request 0 or from the end lands on the right rows by accident.
_DECODE_SMOKE = SmokeSpace(
    # draft decode (draft_topk > 1): (topk, own draft tokens) tied, since a step without candidates is refused;
    # kv_len - step leaves a partial last prefix page at every page size > 1 (the per-candidate copies)
    # kv_len 1024: a multiple of every power-of-two split size (a last split computed as L % split vanishes)
    space=ATTENTION_SMOKE | {"batch": [2, 5], "kv_len": [1, 45, 300, 1024, 4000],
                             "draft_topk,draft_step": [(1, 1), (4, 1), (2, 3)]},
    held={"kv_lens": (None, _REPLAYED), "pool_pages": (None, LARGE_POOLS)},
    seeds=[
        *(
            {"batch": 2, "kv_len": 45, "heads_q,heads_kv": (4, 2), "head_dim,head_dim_v": (dim, None), "page_size": 16}
            for dim in (13, 64, 80, 96, 128, 256)
        ),
        # Long dense sums in 16-bit: thousands of visible keys (no window), diffuse scores (normal), a
        # 16-bit cache and output. Low-precision accumulation shows only where all of these meet, which
        # pairwise coverage does not promise (it may pair the long length with a window or fp8 only).
        *(
            {"batch": 5, "kv_len": 4000, "lens": "mixed", "heads_q,heads_kv": (8, 2), "page_size": 16, "dtype": dt}
            for dt in ("bf16", "fp16")
        ),
        # Sinks over a long dense row: a split-KV kernel must add the sink once, to the merged state, output
        # included; the sink's share of the mass is visible in fp32 over 1024 keys. Every request holds
        # exactly 1024 keys, a multiple of every power-of-two split size.
        {"batch": 2, "kv_len": 1024, "heads_q,heads_kv": (8, 2), "page_size": 16, "sinks": True, "dtype": "fp32"},
    ],
    # case ids that CI expectations (suites/expectations/findings.yaml) name
    seed_ids=[
        *(
            f"decode/b3-l{n}-mixed-h{h}-d128-p{p}-bf16"
            for n in (37, 80)
            for h in ("4x4", "8x1", "8x2")
            for p in (1, 16, 64)
        ),
        "decode/b3-l70-skewed-h8x2-d64-p16-cap5-bf16",
        "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16",
    ],
)  # fmt: skip
_EXTEND_SMOKE = SmokeSpace(
    # q_len 130: a causal query tile of 64 or 128 rows filled, and one more partial one
    space=ATTENTION_SMOKE | {"batch": [2, 5], "q_len": [1, 7, 24, 130], "prefix_len": [0, 21, 120]},
    held={"q_lens": (None, _REPLAYED), "prefix_lens": (None, _REPLAYED), "pool_pages": (None, LARGE_POOLS)},
    seed_ids=["extend/b2-q8-pre30-h8x2-d64-p1-cap5-bf16", "extend/b2-q8-pre30-h8x2-d64-p1-swa5-cap5-sink-bf16"],
)


class DecodeOp(_PagedAttentionOp):
    """One query per request over its paged KV (the current token's K/V already in the cache)."""

    name = "decode"
    smoke = _DECODE_SMOKE
    Params = DecodeParams
    explicit = ("kv_lens",)
    id_fields = tuple(f for f in _ATTN_ID if f.fields[0] in DecodeParams.model_fields)
    graph_captured = True  # the replay check (docs/replay.md): batch B from harness/ops/replay_batches.py
    replay_batch = decode_batch

    def request_lengths(self, p: DecodeParams, seed: int) -> tuple[list[int], list[int]]:
        """(keys, queries) per request, as `build_inputs` draws them; no tensors (backends' limits read them).

        Draft decode (draft_topk > 1): per candidate row, `draft_topk` rows of equal length per request.
        """
        host, _ = _generators(seed, None)
        if p.kv_lens is not None:
            lens = list(p.kv_lens)
        elif p.draft_topk == 1:
            lens = _lengths(p.batch, p.kv_len, p.lens, host)
        else:  # every request keeps a prefix of at least one key
            lens = _lengths(p.batch, p.kv_len, p.lens, host, least=p.draft_step + 1)
        rows = [n for n in lens for _ in range(p.draft_topk)]
        return rows, [1] * len(rows)

    def features(self, p: DecodeParams) -> tuple[str, ...]:
        return super().features(p) + (("draft-topk",) if p.draft_topk > 1 else ())

    def build_inputs(self, p: DecodeParams, dtype, seed, device) -> AttentionInputs:
        kv_lens, q_lens = self.request_lengths(p, seed)
        draft = (p.draft_topk, p.draft_step) if p.draft_topk > 1 else None
        return self._build(p, dtype, seed, device, kv_lens, q_lens, "shared", draft)


class ExtendOp(_PagedAttentionOp):
    """Packed new tokens of each request over its paged prefix plus themselves."""

    name = "extend"
    smoke = _EXTEND_SMOKE
    Params = ExtendParams
    explicit = ("q_lens", "prefix_lens")
    id_fields = tuple(f for f in _ATTN_ID if f.fields[0] in ExtendParams.model_fields)

    def writes_for(self, p: ExtendParams):
        if p.new_kv != "save":
            return {}
        names = ("k_cache",) if p.mla else ("k_cache", "v_cache")
        return {n: OutputSpec(("page", "slot", "head", "dim"), exact=True) for n in names}

    def features(self, p: ExtendParams) -> tuple[str, ...]:
        extra = [] if p.mask == "causal" else [p.mask]
        extra += ["empty-rows"] if p.empty_rows else []
        extra += ["serving-mix"] if p.lens == "serving" else []
        # cross-attention (RadixAttention is_cross_attention): every query sees the encoder's cached K/V
        # (prefix_len + q_len keys), no causal mask, nothing written
        extra += ["cross-attention"] if p.mask == "bidirectional" and p.new_kv == "shared" else []
        extra += {"save": ["save-kv"], "attend": [], "shared": ["cross-layer-kv"]}[p.new_kv]
        return super().features(p) + tuple(extra) + (("prefix",) if p.prefix_len else ())

    def request_lengths(self, p: ExtendParams, seed: int) -> tuple[list[int], list[int]]:
        """(keys, new tokens) per request, as `build_inputs` draws them; no tensors (backends' limits read them)."""
        if p.q_lens is not None:
            return [a + b for a, b in zip(p.prefix_lens, p.q_lens)], list(p.q_lens)
        host, _ = _generators(seed, None)
        q_lens = _lengths(p.batch, p.q_len, p.lens, host)
        pre = "mixed" if p.lens == "serving" else p.lens
        prefix = _lengths(p.batch, p.prefix_len, pre, host, least=0) if p.prefix_len else [0] * p.batch
        return [a + b for a, b in zip(prefix, q_lens)], q_lens

    def build_inputs(self, p: ExtendParams, dtype, seed, device) -> AttentionInputs:
        kv_lens, q_lens = self.request_lengths(p, seed)
        return self._build(p, dtype, seed, device, kv_lens, q_lens, p.new_kv)


def _shift_lses(p, x: MergeStateInputs) -> None:
    x.s_a.add_(1.0)
    x.s_b.sub_(1.0)


class MergeStateOp(Op):
    """Merge two partial (output, LSE) states over disjoint key sets (split-KV / cascade)."""

    name = "merge_state"
    smoke = SmokeSpace(
        space={"tokens": [17, 33], "heads": [2, 4], "head_dim": [32, 64], "dtype": ["bf16", "fp16", "fp32"]},
        seeds=[
            {"tokens": 33, "heads": 4, "head_dim": 64, "dtype": "fp32"},
            {"tokens": 33, "heads": 4, "head_dim": 64, "dtype": "bf16"},
            {"tokens": 17, "heads": 2, "head_dim": 32, "distribution": "peaked", "dtype": "bf16"},
        ],
    )
    family = "attention"
    Params = MergeStateParams
    id_fields = (
        IdField("t", ("tokens",), always=True),
        IdField("h", ("heads",), always=True),
        IdField("d", ("head_dim",), always=True),
        IdField("empty", ("empty",)),
        IdField("", ("distribution",)),
    )
    outputs = {"o": OutputSpec(("token", "head", "dim"), magnitude=True), "lse": OutputSpec(("token", "head"))}

    def features(self, p: MergeStateParams) -> tuple[str, ...]:
        return (("empty-states",) if p.empty else ()) + (
            (f"dist-{p.distribution}",) if p.distribution != "normal" else ()
        )

    def build_inputs(self, p: MergeStateParams, dtype, seed, device) -> MergeStateInputs:
        _, gen = _generators(seed, device)
        T, H, D = p.tokens, p.heads, p.head_dim
        draw = Sampler(p.distribution, gen, device, dtype)
        v_a, v_b = draw.draw("v", (T, H, D)).to(dtype), draw.draw("v", (T, H, D)).to(dtype)
        s_a, s_b = lse_like(p.distribution, (T, H), gen, device)
        if p.empty:  # a quarter of rows: a empty; an eighth: b empty; one in sixteen: both
            t = torch.arange(T, device=device)
            s_a[t % 4 == 1] = -math.inf
            s_b[t % 8 == 2] = -math.inf
            s_a[t % 16 == 3] = s_b[t % 16 == 3] = -math.inf
        return MergeStateInputs(
            v_a, s_a, v_b, s_b, alloc_output((T, H, D), dtype, device), alloc_output((T, H), torch.float32, device)
        )

    def input_bytes(self, p: MergeStateParams, dtype, seed: int) -> int:
        T, H, D = p.tokens, p.heads, p.head_dim
        values = 2 * tensor_bytes((T, H, D), dtype) + 2 * tensor_bytes((T, H), torch.float32)
        return values + output_bytes((T, H, D), dtype) + output_bytes((T, H), torch.float32)

    def expected(self, p, x: MergeStateInputs, precision):
        o, lse, *mag = ref.merge_state(x.v_a, x.s_a, x.v_b, x.s_b, precision, magnitude=precision == torch.float64)
        return {"o": o, "lse": lse} | {magnitude_key("o"): m for m in mag}

    def subset(self, p, x: MergeStateInputs, order: list[int]):
        rows = torch.tensor(order, device=x.v_a.device)
        fresh = dict(o=alloc_output((len(order), *x.o.shape[1:]), x.o.dtype, x.o.device),
                     lse=alloc_output((len(order), *x.lse.shape[1:]), x.lse.dtype, x.lse.device))  # fmt: skip
        return MergeStateInputs(x.v_a[rows], x.s_a[rows], x.v_b[rows], x.s_b[rows], **fresh), rows

    def perturbations(self, p: MergeStateParams) -> tuple[Perturbation, ...]:
        """Values negated; LSEs shifted apart (a by +1, b by -1: the weights move, -inf stays -inf)."""
        return (negated("values", ("v_a", "v_b")), Perturbation("lses", ("s_a", "s_b"), _shift_lses))

    def row_requests(self, p, x: MergeStateInputs):
        return torch.arange(x.v_a.shape[0])  # every token is its own pair of partial states

    def flops(self, p: MergeStateParams, x) -> float:
        return 4.0 * p.tokens * p.heads * p.head_dim

    def bytes(self, p: MergeStateParams, x: MergeStateInputs) -> float:
        el = x.v_a.element_size()
        return float(3 * x.v_a.numel() * el + 3 * x.s_a.numel() * 4)
