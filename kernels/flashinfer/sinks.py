"""Attention sinks through `flashinfer.BatchAttentionWithAttentionSinkWrapper` (decode and extend).

On Hopper, FlashInfer honours `run(sinks=...)` only in trtllm-gen, cuDNN and cute-dsl (Blackwell);
the fa2/fa3 decode and prefill paths drop the argument without a warning. This wrapper compiles a
custom attention variant (`AttentionSink`) whose extra tensor `sink` ([Hq] fp32) and scalar
`sm_scale` go positionally through `run(q, kv, sink, sm_scale)`.

Its JIT module is named `batch_prefill_attention_sink_{dtype}_swa_{bool}_{backend}`, without the
head dims, so two head-dim configurations in one process would resolve to one shared library: the
second would load the first one's kernel. `_claim_module` refuses that case (a skip), rather than
report numbers from the wrong kernel.
"""

from __future__ import annotations

from attnbench.errors import Unsupported
from attnbench.kernels.flashinfer import _lib
from attnbench.kernels.flashinfer import conventions as conv
from attnbench.kernels.torch.attention import save_new_kv

_MODULE_HEAD_DIMS: dict[str, tuple[int, int]] = {}  # sink JIT module name -> (Dk, Dv) loaded in this process


def module_name(dtype_name: str, window: int, backend: str) -> str:
    """The sink wrapper's JIT module name for these settings (mirrors attention/_core.py)."""
    return f"batch_prefill_attention_sink_{dtype_name}_swa_{window >= 0}_{backend}"


def _claim_module(name: str, dims: tuple[int, int]) -> None:
    owner = _MODULE_HEAD_DIMS.setdefault(name, dims)
    if owner != dims:
        raise Unsupported(
            f"FlashInfer names its sink JIT module {name!r} without head dims; (Dk, Dv) = {owner} is "
            f"already loaded under that name in this process, so {dims} would run that kernel. Run "
            "cases of this head-dim configuration in a separate process"
        )


def prepare_sinks(case, x, *, backend: str):
    """Paged attention with per-head sink logits for decode (one query per request) or extend.

    The sink is a natural-log logit per q head that adds exp(sink - m) to the softmax denominator.
    Verified: "BatchAttentionWithAttentionSinkWrapper.run(q, kv, sink, sm_scale) | sink is a logit
    (natural-log space, per q-head, fp32)". The kernel's LSE includes the sink, as the reference's.
    """
    fi = _lib.flashinfer()
    from flashinfer.jit.utils import filename_safe_dtype_map

    dtype = x.q.dtype
    Hq, Hkv, Dk, Dv = x.q.shape[1], x.k_cache.shape[2], x.q.shape[2], x.v_cache.shape[3]
    name = module_name(filename_safe_dtype_map[dtype], x.window, backend)
    _claim_module(name, (Dk, Dv))
    ws = _lib.float_workspace(x.q.device)
    wrapper, jit_s = _lib.timed(
        lambda: fi.BatchAttentionWithAttentionSinkWrapper(
            ws,
            "NHD",
            backend=backend,
            q_data_type=dtype,
            kv_data_type=dtype,
            head_dim_qk=Dk,
            head_dim_vo=Dv,
            window_left=conv.window_left(x.window),
        )
    )  # the constructor builds (or loads) the variant's JIT module
    last = conv.last_page_len(x.seq_lens, x.page_size)

    def plan():
        wrapper.plan(
            x.qo_indptr,
            x.kv_indptr,
            x.kv_page_indices,
            last,
            Hq,
            Hkv,
            Dk,
            x.page_size,
            head_dim_vo=Dv,
            causal=x.causal,
            sm_scale=x.sm_scale,
            window_left=conv.window_left(x.window),
            q_data_type=dtype,  # plan() defaults to float16 even on this wrapper
            kv_data_type=dtype,
            o_data_type=dtype,
        )

    extra_jit_s, plan_s = _lib.timed_twice(plan)
    kv = (x.k_cache, x.v_cache)
    sink = x.sinks
    scale = float(x.sm_scale)

    def run():
        if x.save_kv:
            save_new_kv(x)
        wrapper.run(x.q, kv, sink, scale, out=x.o, lse=x.lse, return_lse=True, lse_base="ln")
        return {"o": x.o, "lse": x.lse}

    run.info = {
        "jit_s": jit_s + extra_jit_s,
        "plan_s": plan_s,
        "variant": f"BatchAttentionWithAttentionSinkWrapper {backend}",
        "jit_module": name,
    }
    return run
