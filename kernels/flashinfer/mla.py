"""Absorbed MLA (decode and extend) through `flashinfer.mla.BatchMLAPagedAttentionWrapper`.

Canonical MLA keeps one latent per token, `k_cache [P, page_size, 1, 512 + 64]`, and
q = `[q_latent 512 | q_rope 64]`; the wrapper takes the same data as split pairs
(`conventions.mla_split`: zero-copy strided views). The plan declares the run contract: split
query and KV layouts, natural-log LSE (`lse_mode="basee"`, run with `return_lse_base_on_e`).
Verified: "BatchMLAPagedAttentionWrapper (q_nope 512 + q_pe 64, ckv 512 + kpe 64,
sm_scale=192**-0.5) | absorbed MLA: scores over [q_nope|q_pe].[ckv|kpe] x sm_scale, V = ckv".
"""

from __future__ import annotations

from attnbench.errors import Unsupported
from attnbench.kernels.flashinfer import _lib
from attnbench.kernels.flashinfer import conventions as conv
from attnbench.kernels.torch.attention import save_new_kv
from attnbench.ops.attention import MLA_DK, MLA_DV

KPE = MLA_DK - MLA_DV


def prepare_mla(case, x, *, backend: str, decode: bool):
    """Plan the MLA wrapper on `backend` ("fa2" or "fa3") and return the timed closure.

    Decode plans non-causal (one query per request sees its whole cache); extend plans the case's
    mask (bottom-right causal or bidirectional). Plan-time refusals of the wrapper
    (`_BackendPlanUnsupportedError`: e.g. more than 16384 work items, or the fa2/fa3 causal tile
    bound that would drop a visible key) become skips with FlashInfer's own message.
    """
    _lib.flashinfer()
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata
    from flashinfer.mla._batch_mla._backends._capabilities import _BackendPlanUnsupportedError

    query, kv_cache = conv.mla_split(x.q, x.k_cache, MLA_DV)
    wrapper = BatchMLAPagedAttentionWrapper(_lib.float_workspace(x.q.device), backend=backend)
    metadata = MLAPlanMetadata.csr(x.qo_indptr, x.kv_indptr, x.kv_page_indices, x.seq_lens)
    dtype = x.q.dtype

    def plan():
        wrapper.plan(
            metadata=metadata,
            num_heads=x.q.shape[1],
            head_dim_ckv=MLA_DV,
            head_dim_kpe=KPE,
            page_size=x.page_size,
            causal=False if decode else x.causal,
            sm_scale=x.sm_scale,
            q_data_type=dtype,
            kv_data_type=dtype,
            query_layout="split",
            kv_cache_layout="split",
            lse_mode="basee",
        )

    try:
        jit_s, plan_s = _lib.timed_twice(plan)
    except _BackendPlanUnsupportedError as e:
        raise Unsupported(f"FlashInfer MLA {backend} plan refused: {e}") from None

    def run():
        if x.save_kv:
            save_new_kv(x)  # the latent (K, and V as its first 512) into the new tokens' slots
        wrapper.run(query=query, kv_cache=kv_cache, out=x.o, lse=x.lse, return_lse=True, return_lse_base_on_e=True)
        return {"o": x.o, "lse": x.lse}

    run.info = {"jit_s": jit_s, "plan_s": plan_s, "variant": f"BatchMLAPagedAttentionWrapper {backend}"}
    return run
