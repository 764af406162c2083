"""vLLM's Triton unified attention (vllm 0.33.0, `vllm.v1.attention.ops.triton_unified_attention
.unified_attention`) behind the canonical decode and extend contracts.

vLLM's paged cache is attnbench's: `[num_blocks, block_size, Hkv, D]` with a block table per request,
so the caches go in as they are; the CSR page table becomes a dense `block_table [B, max_pages]`
(int32, padded with page 0: never read past `seqused_k`), queries are packed by `cu_seqlens_q`.
Window: vLLM keeps keys with `q_pos - k_pos < 1 + window_size[0]`, i.e. `window_size = (W, 0)` for
the canonical W (keys `[p - W, p]`); none is `(-1, -1)`. Soft cap and sinks (logits, `[Hq]` fp32) as
canonical. The kernel reads every key, new tokens included, from the cache: `new_kv: save` stores them
first (timed, as vLLM's `reshape_and_cache_flash` runs before attention), `shared` reads the cache as
it is, `attend` (new K/V outside the cache) cannot be said. It returns no LSE (`absent`). tree_verify: the
tree mask as `qq_bias` (vLLM's tree attention: one tree per batch, `tree_bias`), causal.

Split-K: called as vLLM's Triton backend calls it (`TritonAttentionMetadataBuilder`), with a threshold
of `MIN_LAUNCH_GRID_SIZE_2D // Hkv` sequences, `NUM_PAR_SOFTMAX_SEGMENTS` segments and fp32 scratch
(`split_k_scratch`): the kernel itself then picks the 3D split-K path (one program per segment of the
keys, then a reduction) for small batches of at most `MAX_3D_QUERY_LEN` tokens per request, and the
single-pass 2D kernel otherwise. Batches that cannot take the 3D path get no scratch (a prefill's would
be gigabytes), which the kernel reads as 2D.
"""

from __future__ import annotations

import torch

from attnbench.errors import Unsupported
from attnbench.kernels.torch.attention import save_new_kv
from attnbench.kernels.vllm import _lib

# vLLM 0.33.0's constants (v1/attention/backends/triton_attn.py, ops/triton_unified_attention.py)
MIN_LAUNCH_GRID_SIZE_2D = 128  # the 2D grid is (q blocks, Hkv): fewer sequences than 128 // Hkv -> 3D
NUM_PAR_SOFTMAX_SEGMENTS = 16
MAX_3D_QUERY_LEN = 8  # longer queries always take the 2D kernel


def split_k_scratch(tokens: int, max_q: int, heads_q: int, heads_kv: int, head_dim: int, device) -> dict:
    """The split-K arguments vLLM's Triton backend passes: `seq_threshold_3D = 128 // Hkv`, 16 segments,
    and fp32 scratch `[tokens, Hq, 16, next_pow2(D)]` (output) and `[tokens, Hq, 16]` (max, exp-sum),
    one row per query token; `{}` (the 2D kernel) for queries longer than `MAX_3D_QUERY_LEN`, which the
    kernel never splits. The kernel decides: 3D when the batch's q blocks are at most the threshold."""
    if max_q > MAX_3D_QUERY_LEN:
        return {}
    seg, dpad = NUM_PAR_SOFTMAX_SEGMENTS, 1 << max(head_dim - 1, 0).bit_length()
    f32 = dict(dtype=torch.float32, device=device)
    return {
        "seq_threshold_3D": MIN_LAUNCH_GRID_SIZE_2D // heads_kv,
        "num_par_softmax_segments": seg,
        "softmax_segm_output": torch.empty(tokens, heads_q, seg, dpad, **f32),
        "softmax_segm_max": torch.empty(tokens, heads_q, seg, **f32),
        "softmax_segm_expsum": torch.empty(tokens, heads_q, seg, **f32),
    }


def window_size(window: int) -> tuple[int, int]:
    """Canonical window W -> vLLM's `window_size`: `(W, 0)`, none `(-1, -1)`."""
    return (window, 0) if window >= 0 else (-1, -1)


def block_table(kv_indptr: torch.Tensor, kv_page_indices: torch.Tensor) -> torch.Tensor:
    """CSR page table -> dense `[B, max_pages]` int32, rows padded with page 0 (never read)."""
    indptr = kv_indptr.tolist()
    counts = [e - s for s, e in zip(indptr, indptr[1:])]
    table = torch.zeros(len(counts), max(counts), dtype=torch.int32)
    pages = kv_page_indices.cpu()
    for b, (s, n) in enumerate(zip(indptr, counts)):
        table[b, :n] = pages[s : s + n]
    return table.to(kv_indptr.device)


def attention_unsupported(case) -> str | None:
    p = case.params
    if p.mla or p.dv != p.head_dim:
        return "vLLM's unified attention: one head size for K and V (no MLA, no Dk != Dv)"
    if p.kv_dtype != "auto":
        return "vllm adapter: fp8 KV caches are not wired"
    if case.op_name == "tree_verify":
        return None  # the tree mask becomes qq_bias (prepare refuses batches of different trees)
    if case.op_name == "extend":
        if p.mask == "custom":
            return "vLLM's unified attention has no custom mask (a tree takes qq_bias: tree_verify)" if p.trees is None else "vLLM's unified attention takes one tree (qq_bias) for every request of a call: per-request trees beside causal prefills need vLLM's split into a prefill and a decode call, which this adapter does not make"  # fmt: skip
        if p.new_kv == "attend":
            return "vLLM's unified attention reads every key from the cache (new_kv attend keeps them outside)"
    return None


def tree_bias(tree_mask: torch.Tensor) -> torch.Tensor:
    """Per-request tree masks `[B, n, n]` (True = visible) -> vLLM's `qq_bias [n, n]` fp32 (0 visible,
    -inf hidden), one tree for the whole batch as vLLM's tree attention has it; ValueError when the
    requests' trees differ. The kernel adds `qq_bias[i, k - context_len]` over the tree's keys, on top
    of causality (a node's ancestors precede it), and sees the whole prefix."""
    first = tree_mask[0]
    if not bool((tree_mask == first).all()):
        raise ValueError("vLLM's tree attention takes one tree (qq_bias) for the batch: these requests' trees differ")
    return torch.zeros(first.shape, dtype=torch.float32, device=first.device).masked_fill(~first, float("-inf"))


def prepare_attention(case, x):
    unified_attention = _lib.unified_attention()
    bias = None
    if case.op_name == "tree_verify":
        try:
            bias = tree_bias(x.tree_mask)
        except ValueError as e:
            raise Unsupported(str(e)) from e
    B, Hkv = len(x.seq_lens_host), x.k_cache.shape[2]
    table = block_table(x.kv_indptr, x.kv_page_indices)
    descale = torch.ones(B, Hkv, dtype=torch.float32, device=x.q.device)
    max_q, max_k = max(x.q_lens_host), max(x.seq_lens_host)
    win = window_size(x.window)
    split = split_k_scratch(x.q.shape[0], max_q, x.q.shape[1], Hkv, x.q.shape[2], x.q.device)

    def run():
        if x.save_kv:
            save_new_kv(x)
        unified_attention(
            x.q, x.k_cache, x.v_cache, x.o, x.qo_indptr, max_q, x.seq_lens, max_k, x.sm_scale, x.causal, win,
            table, x.soft_cap, None, descale, descale, sinks=x.sinks, qq_bias=bias, **split,
        )  # fmt: skip
        return {"o": x.o}

    run.absent = {"lse": "vLLM's unified_attention returns no LSE"}
    scratch = (
        f"vLLM's split-K scratch: 3D at most {split['seq_threshold_3D']} q blocks, {NUM_PAR_SOFTMAX_SEGMENTS} segments"
        if split
        else f"2D (queries over {MAX_3D_QUERY_LEN} tokens: no split-K)"
    )
    run.info = {"variant": f"unified_attention, {scratch}" + (", tree qq_bias" if bias is not None else "")}
    return run
