"""What each FlashInfer 0.7.2 kernel path can run, as precise skip reasons (pure, CPU-testable).

Each rule returns None (supported) or the reason, naming the FlashInfer source that sets the limit.
The rules only read case parameters; hardware limits (GPU present, SM90 for fa3) live in
`_lib.unavailable`.
"""

from __future__ import annotations

from attnbench.ops.attention import MLA_DK, MLA_DV

FA2_ISSUE = "flashinfer-ai/flashinfer#4299"
CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)  # DISPATCH_GQA_GROUP_SIZE in include/flashinfer/utils.cuh
CUDA_CORE_HEAD_DIMS = (64, 128, 256, 512)
MERGE_HEAD_DIMS = (64, 128, 256, 512)  # DISPATCH_HEAD_DIM in include/flashinfer/utils.cuh
FA3_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))  # utils.is_fa3_prefill_head_dim_supported


def dtype(name: str) -> str | None:
    """FlashInfer attention runs fp16/bf16 (and fp8, which attnbench does not sweep)."""
    if name not in ("bf16", "fp16"):
        return f"FlashInfer attention kernels take fp16/bf16 inputs, not {name}"
    return None


def fp8_kv(case, wired: bool, backend: str = "fa2") -> str | None:
    """fp8 KV caches: FlashInfer's paged decode reads them with one k_scale / v_scale float each
    (run(k_scale=, v_scale=)); the adapter wires that for plain decode only."""
    p = case.params
    if backend == "fa3":
        return (
            "FlashInfer fa3 has no bf16/fp16-Q x fp8-KV kernel: its batch-prefill module fails to compile "
            "(cute mma_sm90: 'No eligible GMMA operator'; seen on an H200 with 0.7.2.post1)"
        )
    if not wired or case.op_name != "decode":
        return f"the FlashInfer adapter reads fp8 KV caches in plain decode only, not {case.op_name} on this path"
    if p.mla or p.sinks:
        return "the FlashInfer adapter reads fp8 KV caches in plain decode only (not MLA or the sink wrapper)"
    if p.kv_scale != "tensor":
        return "FlashInfer decode takes one k_scale / v_scale per tensor (run(k_scale=, v_scale=) are floats), not per head"
    return None


def fa2_head_dims(dk: int, dv: int) -> str | None:
    """The fa2 prefill kernel (also behind tensor-core decode and the ragged wrapper).

    NUM_MMA_D = head_dim / 16 truncates, and the shared-memory swizzle is only consistent for
    multiples of 64; FlashInfer does not validate this and gives an illegal memory access or wrong
    output otherwise (flashinfer-ai/flashinfer#4299). Head dims above 256 use a separate large-head
    path, validated by FlashInfer for 512 only.
    """
    ok = (dk % 64 == 0 and dv % 64 == 0 and max(dk, dv) <= 256) or (dk, dv) == (512, 512)
    if ok:
        return None
    return (
        f"FlashInfer fa2 kernels need head dims that are multiples of 64 up to 256 (or 512), got "
        f"(Dk, Dv) = ({dk}, {dv}): other sizes are unvalidated and read out of bounds or give wrong "
        f"results ({FA2_ISSUE})"
    )


def fa3_head_dims(dk: int, dv: int) -> str | None:
    """The fa3 (SM90) prefill kernels are instantiated for equal 64/128/256 and for (192, 128)."""
    if (dk, dv) in FA3_HEAD_DIMS:
        return None
    return (
        f"FlashInfer fa3 kernels exist for head dims 64, 128, 256 and (192, 128) only, got (Dk, Dv) = "
        f"({dk}, {dv}) (utils.is_fa3_prefill_head_dim_supported)"
    )


def head_dims(backend: str, dk: int, dv: int) -> str | None:
    return fa3_head_dims(dk, dv) if backend == "fa3" else fa2_head_dims(dk, dv)


def fa3_paged_strides(dk: int, dv: int) -> str | None:
    """The fa3 paged kernel requires K and V caches with one page stride and one token stride."""
    if dk == dv:
        return None
    return (
        f"FlashInfer's fa3 paged kernel requires K and V caches with equal page and token strides "
        f"(TVM_FFI_ICHECK in csrc/batch_prefill_sm90.cu); separate caches with Dk {dk} != Dv {dv} differ"
    )


def one_head_dim(dk: int, dv: int) -> str | None:
    """BatchDecodeWithPagedKVCacheWrapper.plan takes a single head_dim for K and V."""
    if dk == dv:
        return None
    return f"FlashInfer's decode wrapper plans one head_dim for K and V, got Dk {dk} != Dv {dv}"


def cuda_core_decode(head_dim: int, group: int) -> str | None:
    """The CUDA-core decode kernel: power-of-two lanes per head row, and a fixed set of GQA groups."""
    if head_dim not in CUDA_CORE_HEAD_DIMS:
        return (
            f"FlashInfer's CUDA-core decode kernel reduces over head_dim / vec_size lanes with warp "
            f"shuffles that need a power of two (decode.cuh), i.e. head dims {CUDA_CORE_HEAD_DIMS}; "
            f"got {head_dim}"
        )
    if group not in CUDA_CORE_GROUPS:
        return (
            f"FlashInfer's CUDA-core decode kernel is instantiated for GQA groups {CUDA_CORE_GROUPS} "
            f"(DISPATCH_GQA_GROUP_SIZE), got {group}"
        )
    return None


def sinks(p, *, extend: bool) -> str | None:
    """Sinks go through BatchAttentionWithAttentionSinkWrapper (the plain fa2/fa3 paths drop them).

    Its AttentionSink variant (jit/attention/variants.py) replaces the default variant: it has no
    soft-cap transform and no custom-mask test (only the window), so those cannot combine with sinks.
    """
    if p.soft_cap > 0:
        return "FlashInfer's AttentionSink variant has no soft-cap transform: no sinks with a soft cap"
    if extend and p.mask == "custom":
        return "FlashInfer's AttentionSink variant applies no custom mask (its LogitsMask is the window only)"
    if extend and p.new_kv == "attend":
        return (
            "sinks with new_kv=attend: the attention-sink wrapper is paged-only and the ragged kernel "
            "has no sink term, so the ragged+paged cascade cannot carry the sink"
        )
    return None


def cascade(p, backend: str) -> str | None:
    """Ragged (new tokens, causal) + paged (prefix, non-causal) + merge_state, as SGLang extends.

    The paged half sees the whole prefix; FlashInfer's window test places the queries at the end
    of the keys it is given, which is wrong for the prefix alone, and a custom mask would have to be
    split between the halves: both are refused when there is a prefix.
    """
    if p.sinks:
        return sinks(p, extend=True) or "sinks: the ragged kernel has no sink term"
    if p.prefix_len == 0:
        if p.mask == "custom" and backend == "fa3":
            return "FlashInfer's fa3 kernels take no custom mask (MaskMode.CUSTOM is rejected on SM90)"
        return None
    if p.window >= 0:
        return (
            "sliding window over a ragged+paged cascade: FlashInfer's window assumes the queries are the "
            "last keys of each call, which the prefix-only paged half violates"
        )
    if p.mask == "custom":
        return "custom mask over a ragged+paged cascade: the mask would need splitting per half (not done)"
    if p.dv not in MERGE_HEAD_DIMS:
        return f"flashinfer.merge_state_in_place exists for head dims {MERGE_HEAD_DIMS}, got Dv {p.dv}"
    if merge_threads(p.dv, p.heads_q) > 1024:
        return merge_threads_reason(p.dv, p.heads_q)
    if backend == "fa3":
        return fa3_paged_strides(p.head_dim, p.dv)
    return None


def cascade_prefixes(case) -> str | None:
    """The paged half of the cascade runs over every request's prefix, so either all requests have
    one or none has (FlashInfer's last_page_len is 1..page_size: an empty prefix cannot be paged)."""
    kv_lens, q_lens = case.op.request_lengths(case.params, case.seed)
    prefix = [L - n for L, n in zip(kv_lens, q_lens, strict=True)]
    if any(prefix) and not all(prefix):
        return (
            "some requests have no prefix: the paged half of the cascade needs at least one cached "
            "token per request (FlashInfer's last_page_len is 1..page_size)"
        )
    return None


def merge_threads(head_dim: int, heads: int, elem_bytes: int = 2) -> int:
    """Threads per block of FlashInfer's merge kernels: head_dim / vec_size lanes x heads."""
    vec = max(16 // elem_bytes, head_dim // 32)
    return head_dim // vec * heads


def merge_threads_reason(head_dim: int, heads: int) -> str:
    return (
        f"flashinfer.merge_state launches (head_dim / vec) x heads = {merge_threads(head_dim, heads)} "
        f"threads per block, over CUDA's 1024 (cascade.cuh MergeState)"
    )


def merge_state(p, dtype_name: str) -> str | None:
    if dtype_name not in ("bf16", "fp16"):
        return (
            "flashinfer.merge_state dispatches fp16/bf16 states only "
            f"(DISPATCH_DLPACK_DTYPE_TO_CTYPE_FP16), not {dtype_name}"
        )
    if p.head_dim not in MERGE_HEAD_DIMS:
        return (
            f"flashinfer.merge_state is instantiated for head dims {MERGE_HEAD_DIMS} (DISPATCH_HEAD_DIM), "
            f"got {p.head_dim}"
        )
    if merge_threads(p.head_dim, p.heads) > 1024:
        return merge_threads_reason(p.head_dim, p.heads)
    return None


def mla(p, *, extend: bool) -> str | None:
    """BatchMLAPagedAttentionWrapper (fa2/fa3): absorbed MLA 512 + 64, causal or not, nothing else."""
    if (p.head_dim, p.dv) != (MLA_DK, MLA_DV):
        return f"FlashInfer's MLA wrapper is used for latent 512 + rope 64 only, got ({p.head_dim}, {p.dv})"
    wanted = (("sliding window", p.window >= 0), ("soft cap", p.soft_cap > 0), ("sinks", p.sinks))
    feats = [name for name, on in wanted if on]
    if feats:
        return f"FlashInfer's fa2/fa3 MLA kernels have no {', '.join(feats)} (sinks: the wrapper raises)"
    if extend and p.mask == "custom":
        return "FlashInfer's MLA wrapper has causal and non-causal masks only, no custom mask"
    if extend and p.new_kv == "attend":
        return "FlashInfer's MLA wrapper reads K/V from the paged cache only; new_kv=attend keeps them out"
    return None
