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

fp8 KV caches (per tensor, e4m3): as vLLM's Triton backend (`TritonAttentionImpl.forward`) passes them,
`k_descale`/`v_descale` are the layer's one k and v scale (`layer._k_scale`, a 0-d fp32 tensor) expanded
to `[B, Hkv]` (stride 0: every entry is the layer's scale), `q_descale` None (the query is not fp8) and
`kv_quant_mode = KVQuantMode.FP8_PER_TENSOR` (what `get_kv_quant_mode("fp8_e4m3")` gives). In that mode
the kernel loads one scale per tensor (`tl.load(k_scale)`, the first entry) and dequantises each K/V tile
to the query dtype; without the mode (the default NONE) it casts the fp8 entries unscaled. Not expressible
(`kv_limits`): per-head scales (the kernel reads one scale; vLLM's layer holds one) and e5m2 caches
(vLLM's Triton backend views every fp8 cache as `current_platform.fp8_dtype()`, e4m3fn on CUDA, when it
writes and when it reads: an e5m2 cache's bytes would be read as e4m3).

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


FP8_CACHE = "fp8_e4m3"  # of attnbench's kv dtypes, the one vLLM's Triton backend stores and reads (fp8_dtype())


def kv_limits(p) -> str | None:
    """Why vLLM's Triton attention cannot read this case's KV cache (None: it can): per-tensor e4m3 only."""
    if p.kv_dtype == "auto":
        return None
    if p.kv_dtype != FP8_CACHE:
        return (
            f"vLLM's Triton backend views every fp8 KV cache as current_platform.fp8_dtype() (e4m3fn on CUDA) when "
            f"it writes and reads it: a {p.kv_dtype} cache's bytes would be read as e4m3"
        )
    if p.kv_scale == "head":
        return (
            "vLLM's unified attention reads one k and one v scale per layer (FP8_PER_TENSOR: tl.load of the "
            "descale's first entry; the layer's _k_scale is 0-d): per-head scales cannot be expressed"
        )
    return None


def descales(x, batch: int, heads_kv: int):
    """`(k_descale, v_descale, kv_quant_mode)` as vLLM's Triton backend builds them: the layer's scales
    (`x.k_scale`, `x.v_scale`: `[1]` fp32, real value = stored * scale) as 0-d tensors expanded to
    `[B, Hkv]` (stride 0), FP8_PER_TENSOR; for an unquantised cache the layer's scales of 1.0 and NONE."""
    mode = _lib.kv_quant_mode()
    if x.k_scale is None:
        one = torch.ones((), dtype=torch.float32, device=x.q.device).expand(batch, heads_kv)
        return one, one, mode.NONE
    k, v = (s.reshape(()).to(torch.float32).expand(batch, heads_kv) for s in (x.k_scale, x.v_scale))
    return k, v, mode.FP8_PER_TENSOR


def attention_unsupported(case) -> str | None:
    p = case.params
    if p.mla or p.dv != p.head_dim:
        return "vLLM's unified attention: one head size for K and V (no MLA, no Dk != Dv)"
    if why := kv_limits(p):
        return why
    if case.op_name == "tree_verify":
        return None  # the tree mask becomes qq_bias (prepare refuses batches of different trees)
    if case.op_name == "extend":
        if p.mask == "custom" and p.trees is not None:
            return (
                "vLLM's unified attention takes one tree (qq_bias) for every request of a call: per-request trees "
                "beside causal prefills need vLLM's split into a prefill and a decode call, which this adapter does "
                "not make"
            )
        if p.mask == "custom":
            return "vLLM's unified attention has no custom mask (a tree takes qq_bias: tree_verify)"
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
    k_descale, v_descale, kv_mode = descales(x, B, Hkv)
    max_q, max_k = max(x.q_lens_host), max(x.seq_lens_host)
    win = window_size(x.window)
    split = split_k_scratch(x.q.shape[0], max_q, x.q.shape[1], Hkv, x.q.shape[2], x.q.device)

    def run():
        if x.save_kv:
            save_new_kv(x)
        unified_attention(
            x.q, x.k_cache, x.v_cache, x.o, x.qo_indptr, max_q, x.seq_lens, max_k, x.sm_scale, x.causal, win,
            table, x.soft_cap, None, k_descale, v_descale, sinks=x.sinks, qq_bias=bias, kv_quant_mode=kv_mode,
            **split,
        )  # fmt: skip
        return {"o": x.o}

    run.absent = {"lse": "vLLM's unified_attention returns no LSE"}
    scratch = (
        f"vLLM's split-K scratch: 3D at most {split['seq_threshold_3D']} q blocks, {NUM_PAR_SOFTMAX_SEGMENTS} segments"
        if split
        else f"2D (queries over {MAX_3D_QUERY_LEN} tokens: no split-K)"
    )
    fp8 = ", fp8 per-tensor k/v descales" if x.k_scale is not None else ""
    run.info = {"variant": f"unified_attention, {scratch}" + fp8 + (", tree qq_bias" if bias is not None else "")}
    return run
