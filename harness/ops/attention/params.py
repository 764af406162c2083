"""Parameters of `decode` and `extend` (the paged attention ops) and how they read in a case id."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from attnbench.ops.base import (
    IdField,
    Params,
)
from attnbench.ops.distributions import Distribution

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
    trees: tuple[str | None, ...] | None = Field(
        None,
        description="mask custom with explicit q_lens: per request a draft tree as vLLM choices ('0_1_0.0', "
        "its q_len = the tree's tokens, root included) whose tokens see the whole prefix, the root, their "
        "ancestors and themselves, or null: a causal request (a prefill beside tree-verify requests)",
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

    @field_validator("trees", mode="before")
    @classmethod
    def _canonical_trees(cls, trees):
        """Every tree in the compact choices form (`"[(0,), (1,)]"` -> `"0_1"`), nulls kept."""
        if trees is None:
            return None
        if isinstance(trees, str) or not hasattr(trees, "__len__"):
            raise ValueError(f"trees is a list of one tree (or null) per request, got {trees!r}")
        from attnbench.ops.trees import NAMED, compact, expand

        out = []
        for i, tree in enumerate(trees):
            if tree is None:
                out.append(None)
                continue
            if not isinstance(tree, str) or tree in NAMED:
                raise ValueError(
                    f"trees[{i}] {tree!r}: a tree is given as vLLM choices ('[(0,), (1,), (0, 0)]' or '0_1_0.0') "
                    "or null (a causal request)"
                )
            try:
                out.append(compact(expand(tree)))
            except ValueError as e:
                raise ValueError(f"trees[{i}]: {e}") from None
        return tuple(out)

    @model_validator(mode="after")
    def _lens(self):
        if self.lens == "skewed":
            raise ValueError("extend supports lens equal, mixed or serving")
        if self.empty_rows and self.mask != "custom":
            raise ValueError("empty_rows needs mask: custom")
        _pool_needs_window(self)
        if self.trees is not None:
            _check_trees(self)
        return self

    def tree_parents(self) -> list[list[int] | None]:
        """Per request the parent list `[q_len]` of its tree (root -1), None for a causal request."""
        from attnbench.ops.trees import expand
        from attnbench.references.spec import parents_from_choices

        return [None if t is None else parents_from_choices(expand(t)) for t in self.trees or ()]


def _check_trees(p: ExtendParams) -> None:
    """Per-request trees: a custom mask over explicit lengths, one entry a request, each tree as long as
    its request's new tokens, no window (tree tokens sit at prefix + depth, not at their packed order)."""
    if p.q_lens is None:
        raise ValueError("trees needs q_lens: one tree (or null) per request of a batch with explicit lengths")
    if p.mask != "custom":
        raise ValueError(
            f"trees needs mask: custom (the trees and the causal requests make the custom mask), got {p.mask}"
        )
    if p.empty_rows:
        raise ValueError("trees and empty_rows contradict: a tree token sees at least the root and itself")
    if p.window >= 0:
        raise ValueError(
            "trees do not take a window: tree tokens sit at prefix + depth, not at their packed order, so the "
            "extend window rule would be wrong"
        )
    if len(p.trees) != len(p.q_lens):
        raise ValueError(f"trees has {len(p.trees)} entries for {len(p.q_lens)} requests (q_lens): one per request")
    if all(t is None for t in p.trees):
        raise ValueError("trees holds no tree (every entry null): leave it out and use mask: causal")
    for i, (parents, n) in enumerate(zip(p.tree_parents(), p.q_lens)):
        if parents is not None and len(parents) != n:
            raise ValueError(
                f"trees[{i}] {p.trees[i]!r} has {len(parents)} tokens (root included) but q_lens[{i}] is {n}"
            )


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
