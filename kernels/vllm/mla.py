"""vLLM's Triton MLA decode (vllm 0.33.0: `TritonMLAImpl.forward_mqa`, which calls
`vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd`) behind the canonical decode contract
for absorbed MLA (one latent head, Dk 576 of which the values are the first 512).

Called as `forward_mqa` calls it: `q [B, Hq, 576]`; the latent cache `[pages, page_size, 1, 576]` as
the keys and its first 512 dims (a view) as the values, which is the harness's MLA cache as it is; a
dense `block_table [B, max_pages]` int32 and `seq_lens [B]`; fp32 split scratch
`attn_logits [B, Hq, num_kv_splits, 512 + 1]` (the +1 holds each split's LSE for the merge);
`num_kv_splits` by vLLM's rule (`split_count`); the layer's scale; `page_size`; the layer's k scale as
both k and v scale (an fp8 latent cache: one scale, `layer._k_scale`); `is_mla=True`; no logit cap.
One difference: `forward_mqa` allocates `lse` in q's dtype and the kernel's fp32 LSE is rounded on the
store; here the kernel stores it into the harness's fp32 `lse` (the canonical contract), so the check
judges what the kernel computes, not bf16's rounding of it. `o` is the harness's output as it is (every
row has at least one key, so the kernel writes all of it; `forward_mqa` zero-fills it first).

What vLLM's Triton MLA backend does not take is a skip with its reason (`mla_unsupported`): soft cap,
sliding window and sinks (TritonMLAImpl raises NotImplementedError), page sizes that are not multiples
of 16 (`TritonMLABackend.supports_block_size`), fp8 e5m2 latent caches (its cache dtypes: auto, fp16,
bf16, fp8/fp8_e4m3), and query dtypes other than fp16/bf16. bf16 cases on the CPU are skips too: the
interpreter's bf16 `tl.dot` is wrong (INTERPRETER_BF16).
"""

from __future__ import annotations

import torch

from attnbench.kernels.vllm import _lib
from attnbench.kernels.vllm.attention import block_table

# vLLM 0.33.0's split rule (v1/attention/backends/mla/triton_mla.py: _compute_num_kv_splits): a power of two
# near max_seq_len / 512, at most two splits per SM. That module does not import without vLLM's server
# dependencies (installed with --no-deps), so its constants are named here and checked against its source
# (tests/kernels/vllm/test_vllm_mla.py).
MIN_WORK_PER_SPLIT = 512
SPLIT_OCCUPANCY_MULTIPLIER = 2
PAGE_MULTIPLE = 16  # TritonMLABackend.supports_block_size: block_size % 16 == 0
# The interpreter has no SMs: the split rule is capped as on an H100 SXM (132 SMs), where only
# lengths past 132 * 2 * 512 keys reach the cap.
INTERPRETER_SM_COUNT = 132
CACHE_DTYPES = ("auto", "fp8_e4m3")  # of attnbench's kv dtypes, those TritonMLABackend lists
QUERY_DTYPES = (torch.float16, torch.bfloat16)  # TritonMLABackend.supported_dtypes
INTERPRETER_BF16 = (
    "bf16 on the CPU: Triton 3.6's interpreter computes bf16 tl.dot wrong (a plain 16x32 @ 32x16 bf16 dot is off "
    "by ~5e10; fp16 is exact), and vLLM's attention scores and P V are tl.dot: checked on CUDA"
)


def split_count(max_seq_len: int, sm_count: int) -> int:
    """vLLM's `num_kv_splits`: next_pow2(max(1, max_seq_len // 512)), capped at 2 * sm_count."""
    ideal = 1 << (max(1, max_seq_len // MIN_WORK_PER_SPLIT) - 1).bit_length()
    return min(ideal, sm_count * SPLIT_OCCUPANCY_MULTIPLIER)


def sm_count(device: torch.device) -> int:
    """The SMs vLLM's CUDA platform reports (`num_compute_units`); INTERPRETER_SM_COUNT on the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SM_COUNT


def mla_unsupported(case) -> str | None:
    """Why vLLM's Triton MLA backend cannot run this MLA decode case (None: it can)."""
    p = case.params
    if p.soft_cap:
        return "vLLM's Triton MLA backend has no logit soft cap (TritonMLAImpl raises NotImplementedError)"
    if p.window >= 0:
        return "vLLM's Triton MLA backend has no sliding window (TritonMLAImpl raises NotImplementedError)"
    if p.sinks:
        return "vLLM's Triton MLA decode has no attention sinks"
    if p.page_size % PAGE_MULTIPLE:
        return f"vLLM's Triton MLA backend takes block sizes that are multiples of {PAGE_MULTIPLE} (page {p.page_size})"
    if p.kv_dtype not in CACHE_DTYPES:
        return f"vLLM's Triton MLA backend has no {p.kv_dtype} latent cache (it takes bf16/fp16 and fp8_e4m3)"
    if case.torch_dtype not in QUERY_DTYPES:
        return f"vLLM's Triton MLA backend runs fp16 and bf16 queries, not {case.dtype}"
    if not case.on_cuda and case.torch_dtype == torch.bfloat16:
        return INTERPRETER_BF16
    return None


def prepare_decode(case, x):
    """The closure: `decode_attention_fwd` as `TritonMLAImpl.forward_mqa` calls it (one decode row per
    request); its scratch and tables are built here, outside the timed call."""
    decode_attention_fwd = _lib.decode_attention_fwd()
    B, Hq = x.q.shape[0], x.q.shape[1]
    latent = x.v_cache.shape[-1]  # kv_lora_rank (512): the values are the cache's first `latent` dims
    splits = split_count(max(x.seq_lens_host), sm_count(x.q.device))
    table = block_table(x.kv_indptr, x.kv_page_indices)
    attn_logits = torch.empty(B, Hq, splits, latent + 1, dtype=torch.float32, device=x.q.device)
    one = torch.ones(1, dtype=torch.float32, device=x.q.device)
    k_scale = one if x.k_scale is None else x.k_scale  # layer._k_scale (1.0 for a bf16 cache)

    def run():
        decode_attention_fwd(
            x.q, x.k_cache, x.v_cache, x.o, x.lse, table, x.seq_lens, attn_logits, splits, x.sm_scale,
            x.page_size, k_scale=k_scale, v_scale=k_scale, is_mla=True,
        )  # fmt: skip
        return {"o": x.o, "lse": x.lse}

    run.info = {"variant": f"triton_decode_attention (vLLM's Triton MLA), {splits} kv splits"}
    return run
