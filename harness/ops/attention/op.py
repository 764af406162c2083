"""The paged attention op contracts `decode` and `extend`: outputs, reference, perturbations, subsets and the
cost model over the inputs of inputs.py."""

from __future__ import annotations

import dataclasses
import functools

import torch

from attnbench.buffers import alloc_output
from attnbench.ops.attention.inputs import (
    AttentionInputs,
    _generators,
    _lengths,
    _pool_region,
    _shares_k,
    build_paged_inputs,
    dequantize,
    paged_input_bytes,
    quantize,
)
from attnbench.ops.attention.params import (
    _ATTN_ID,
    EXPLICIT,
    AttentionParams,
    DecodeParams,
    ExtendParams,
    lengths_digest,
)
from attnbench.ops.attention.smoke import _DECODE_SMOKE, _EXTEND_SMOKE
from attnbench.ops.base import (
    WEIGHTS,
    Op,
    OutputSpec,
    Perturbation,
    magnitude_key,
    negate,
    negated,
)
from attnbench.ops.replay_batches import decode_batch
from attnbench.references import attention as ref

_PLANNED = (
    "per-request lengths: a backend plans its launch from them in prepare (FlashInfer's plan()), and every "
    "buffer is sized by them"
)


_PAGES = (
    "the page table: the bundled torch backend turns it into gather indices in prepare, so it is held until "
    "backends read it on every call"
)


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

    def input_bytes(self, p, dtype, seed: int) -> int:
        kv_lens, q_lens = self.request_lengths(p, seed)
        new_kv = getattr(p, "new_kv", "shared")
        return paged_input_bytes(p, dtype, kv_lens, q_lens, new_kv, getattr(p, "mask", "causal") == "custom")

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
        return build_paged_inputs(p, dtype, seed, device, kv_lens, q_lens, "shared", draft)


class ExtendOp(_PagedAttentionOp):
    """Packed new tokens of each request over its paged prefix plus themselves."""

    name = "extend"
    smoke = _EXTEND_SMOKE
    Params = ExtendParams
    explicit = ("q_lens", "prefix_lens", "trees")  # per-request trees join the lengths' digest
    id_fields = tuple(f for f in _ATTN_ID if f.fields[0] in ExtendParams.model_fields)

    def id_tokens(self, p) -> list[str]:
        """Per-request trees make the custom mask: `trees` where `custom` would be (the trees themselves are
        in the lengths' digest, like the lengths; such an id resolves through its trace)."""
        tokens = super().id_tokens(p)
        if getattr(p, "trees", None) is not None:
            tokens[tokens.index("custom")] = "trees"
        return tokens

    def writes_for(self, p: ExtendParams):
        if p.new_kv != "save":
            return {}
        names = ("k_cache",) if p.mla else ("k_cache", "v_cache")
        return {n: OutputSpec(("page", "slot", "head", "dim"), exact=True) for n in names}

    def features(self, p: ExtendParams) -> tuple[str, ...]:
        extra = [] if p.mask == "causal" else [p.mask]
        extra += ["empty-rows"] if p.empty_rows else []
        # per-request draft trees (tree verification inside an extend batch), beside causal requests or not
        if (trees := getattr(p, "trees", None)) is not None:  # tree_verify's params have none
            extra += ["tree"] + (["tree+causal"] if None in trees else [])
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
        return build_paged_inputs(p, dtype, seed, device, kv_lens, q_lens, p.new_kv)
